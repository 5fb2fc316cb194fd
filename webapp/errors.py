"""Errors as JSON, one shape for all of them: `{"message": str, "errors": {field: [reason, ...]}}`.

`errors` names each bad input with a dotted path: `name`, `per_page`, `config.optim.lr`, `file`, `body`. It is
empty when no single field is to blame (401, 404, 409, ...).
"""

from __future__ import annotations

import json
import re
from typing import Any, NoReturn

from apiflask import APIFlask, HTTPError
from flask import current_app, request
from sqlalchemy.exc import SQLAlchemyError
from webargs.core import parse_json
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from aligner.data.text import unstorable_strings
from webapp.db import TransitionConflict, service_redactor
from webapp.extensions import db

# Where webargs found the input; dropped from the field names (`json.config.x` -> `config.x`).
LOCATIONS = (
    "json",
    "query",
    "querystring",
    "path",
    "form",
    "files",
    "form_and_files",
    "json_or_form",
    "headers",
    "view_args",
)

# JSON deeper than this is refused before parsing: Python's parser (and copying) would hit the recursion limit.
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_JSON_BRACKET = re.compile(rb"[\[\]{}]")

# Bodies webargs also reads for an input declared as multipart (a urlencoded form is a form without files).
READABLE_AS = {"multipart/form-data": ("multipart/form-data", "application/x-www-form-urlencoded")}

ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "message": {"type": "string", "description": "What went wrong."},
        "errors": {
            "type": "object",
            "description": "Each bad field (dotted path, e.g. config.optim.lr) and the reasons.",
            "additionalProperties": {"type": "array", "items": {"type": "string"}},
        },
    },
    "required": ["message", "errors"],
}


def abort_fields(status: int, message: str, errors: dict[str, list[str]] | None = None) -> NoReturn:
    """Stop the request with `status` and the per-field reasons. A 422's reasons pass the service's redactor
    (`webapp.db.service_redactor`): a config's errors may quote what its names were turned into (folders, URLs)."""
    if status == 422 and errors:
        errors = _redacted(errors)
    raise HTTPError(status, message, extra_data={"errors": errors or {}})


def _redacted(errors: dict[str, list[str]]) -> dict[str, list[str]]:
    try:
        return service_redactor(db.session, data_dir=current_app.config["DATA_DIR"]).value(errors)
    except SQLAlchemyError:  # no catalogue to read: the reasons as they are (the core names no secrets itself)
        return errors


def flatten(messages: Any, prefix: str = "", outer: bool = True) -> dict[str, list[str]]:
    """marshmallow's nested error messages as `{"a.b": ["reason"]}`; `outer`: keys are webargs' locations."""
    out: dict[str, list[str]] = {}
    if isinstance(messages, dict):
        for key, value in messages.items():
            key = str(key)
            if outer and key in LOCATIONS:  # a field may be named like a location (a model's `path`)
                nested = flatten(value, "", outer=False) if isinstance(value, dict) else {"body": _strings(value)}
            elif key == "_schema":  # marshmallow's "the whole thing is wrong" (e.g. a list for an object)
                nested = {prefix or "body": _strings(value)}
            else:
                nested = flatten(value, f"{prefix}.{key}" if prefix else key, outer=False)
            for k, v in nested.items():
                out.setdefault(k, []).extend(v)
    else:
        out[prefix or "body"] = _strings(messages)
    return out


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]


def json_too_deep(data: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `data` nests arrays/objects more than `limit` levels deep (strings ignored; invalid JSON too)."""
    depth = 0
    for match in _JSON_BRACKET.finditer(_JSON_STRING.sub(b"", data)):
        depth += 1 if match.group() in (b"[", b"{") else -1
        if depth > limit:
            return True
    return False


def _body_content_type() -> str | None:
    """The content type the endpoint's input schema reads (APIFlask's annotation), if it reads a body."""
    view = current_app.view_functions.get(request.endpoint or "")
    content_type = getattr(view, "_spec", {}).get("content_type")
    return content_type if isinstance(content_type, str) else None


def _readable_as(expected: str) -> bool:
    """Whether webargs can read this request's body for an input declared as `expected` (JSON: also +json)."""
    if expected == "application/json":
        return request.is_json
    return request.mimetype in READABLE_AS.get(expected, (expected,))


def error_body(error: HTTPError) -> tuple[dict, int, Any]:
    """APIFlask's error processor: every HTTPError (validation, auth, abort) in the one shape."""
    errors = error.extra_data.get("errors")
    if errors is None:
        errors = flatten(error.detail) if error.detail else {}
    return {"message": error.message, "errors": errors}, error.status_code, error.headers


def init_app(app: APIFlask) -> None:
    app.config["VALIDATION_ERROR_SCHEMA"] = ERROR_SCHEMA
    app.config["HTTP_ERROR_SCHEMA"] = ERROR_SCHEMA
    app.error_processor(error_body)

    # Before the view (and webargs) sees the body: what would otherwise end in a 500.
    @app.before_request
    def _check_body() -> None:
        expected = _body_content_type()
        if expected and request.mimetype and not _readable_as(expected):
            reason = f"must be {expected}, not {request.mimetype}"
            abort_fields(415, f"Unsupported Content-Type {request.mimetype}", {"Content-Type": [reason]})
        if not request.is_json:
            return
        data = request.get_data(cache=True)
        limit = request.max_content_length
        if request.content_length is None and limit is not None and len(data) >= limit:
            raise RequestEntityTooLarge()  # a chunked body: werkzeug stops reading at the limit without saying so
        if json_too_deep(data):
            abort_fields(400, "Bad Request", {"body": [f"JSON nested deeper than {MAX_JSON_DEPTH} levels"]})
        try:
            body = parse_json(data)
        except json.JSONDecodeError:
            return  # webargs reports it with line and column
        except ValueError as err:  # an integer of more digits than sys.get_int_max_str_digits() (4300)
            abort_fields(400, "Bad Request", {"body": [f"invalid JSON: {err}"]})
        problems = unstorable_strings(body)
        if problems:
            abort_fields(422, "Invalid text in the JSON body", problems)

    # Two requests raced for one job's status (webapp.db.transition): the one that lost changed nothing.
    @app.errorhandler(TransitionConflict)
    def _transition_conflict(exc: TransitionConflict):
        from webapp.extensions import db

        db.session.rollback()
        return app.error_callback(HTTPError(409, str(exc), extra_data={"errors": {}}))

    # Replaces APIFlask's handler of Werkzeug's exceptions, which drops what webargs attached (the JSON error).
    @app.errorhandler(HTTPException)
    def _werkzeug_error(exc: HTTPException):
        headers = dict(exc.get_headers())
        headers.pop("Content-Type", None)
        errors: dict[str, list[str]] = {}
        cause = getattr(exc, "exc", None)
        if exc.code == 400 and cause is not None:
            reason = getattr(cause, "msg", None) or str(cause)
            position = f" (line {cause.lineno} column {cause.colno})" if hasattr(cause, "lineno") else ""
            errors["body"] = [f"invalid JSON: {reason}{position}"]
        elif exc.code == 413:
            errors["body"] = [f"larger than the limit of {request.max_content_length} bytes"]
        return app.error_callback(HTTPError(exc.code, exc.name, headers=headers, extra_data={"errors": errors}))
