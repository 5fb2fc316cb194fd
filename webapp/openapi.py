"""What the OpenAPI document (GET /api/v1/openapi.json) says beyond what APIFlask writes from the schemas.

- A request body whose schema has required fields is itself required (`requestBody.required`): APIFlask leaves it
  optional, so clients and fuzzers (tests/webapp/test_fuzz.py) took a request without a body for a valid one.
- Every operation that reads a body documents the answers webapp/errors.py gives before its view runs: 400 (not
  JSON, not UTF-8, nested too deep, a malformed form), 413 (past the size limit) and 415 (another content type).
- Every operation that needs a token documents 429: the sign-in throttle (webapp/limits.py) may answer it.
"""

from __future__ import annotations

from typing import Any

from apiflask import APIFlask


def _body_required(spec: dict[str, Any], content: dict[str, Any]) -> bool:
    for media in content.values():
        schema = media.get("schema", {})
        if "$ref" in schema:
            schema = spec.get("components", {}).get("schemas", {}).get(schema["$ref"].rpartition("/")[2], {})
        if schema.get("required"):
            return True
    return False


BODY_ERRORS = {
    "400": "The body cannot be read: not JSON, not UTF-8, nested deeper than 64 levels, or a malformed form",
    "413": "The body is past the size limit (MAX_CONTENT_LENGTH; MAX_DATASET_SIZE for uploads)",
    "415": "The body is not of the content type the operation reads",
}
THROTTLED = (
    "Too many: requests without a valid token from this client (SIGNIN_FAILURE_LIMIT), or past a per-user limit "
    "(docs/security.md, Limits)"
)
ERROR_BODY = {"application/json": {"schema": {"$ref": "#/components/schemas/HTTPError"}}}


def complete(spec: dict[str, Any]) -> dict[str, Any]:
    for operations in spec.get("paths", {}).values():
        for operation in operations.values():
            if not isinstance(operation, dict):
                continue
            responses = operation.setdefault("responses", {})
            if operation.get("security"):
                responses.setdefault("429", {"description": THROTTLED, "content": ERROR_BODY})
            body = operation.get("requestBody")
            if not body:
                continue
            if _body_required(spec, body.get("content", {})):
                body["required"] = True
            for status, description in BODY_ERRORS.items():
                responses.setdefault(status, {"description": description, "content": ERROR_BODY})
    return spec


def init_app(app: APIFlask) -> None:
    app.spec_processor(complete)
