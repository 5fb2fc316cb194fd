"""Every string field of every operation, read from the OpenAPI document, refuses a huge value and a NUL with a 4xx.

The walk is generic: a new operation or field is covered without touching this file. For each operation the test
builds one valid-looking request from the spec (required fields, examples, enums, bounds), then for each string
field in it (path, query, JSON body and the string leaves of its examples, multipart form) sends the same request
with that one field set to 10,000 characters, then to a value holding a NUL, as an admin and as a user. Every
answer must be a 4xx (never a 5xx), and a 422 must name the field.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from tests.helpers.api import PROMPTS, bearer, both_backends, create_job

SPEC_URL = "/api/v1/openapi.json"
HUGE = "a" * 10_000
NUL = "a\x00b"
VALID_FILE = "".join(json.dumps(p) + "\n" for p in PROMPTS).encode()


@dataclass
class Request:
    """One request of an operation: `path` params, `query`, a JSON `body` or a multipart `form` (`files`)."""

    method: str
    template: str
    path: dict[str, Any] = field(default_factory=dict)
    query: dict[str, Any] = field(default_factory=dict)
    body: Any = None
    form: dict[str, Any] | None = None
    files: dict[str, str] = field(default_factory=dict)  # field -> file name (the content is a valid prompt file)

    def send(self, client, token: str):
        url = self.template
        for name, value in self.path.items():
            url = url.replace(f"{{{name}}}", quote(str(value), safe=""))
        kwargs: dict[str, Any] = {"headers": bearer(token), "query_string": self.query}
        if self.form is not None:
            data = dict(self.form)
            for name, filename in self.files.items():
                data[name] = (io.BytesIO(VALID_FILE), filename)
            kwargs["data"] = data
        elif self.body is not None:
            kwargs["json"] = self.body
        return client.open(url, method=self.method.upper(), **kwargs)

    def copy(self) -> Request:
        return Request(
            self.method,
            self.template,
            dict(self.path),
            dict(self.query),
            json.loads(json.dumps(self.body)),
            None if self.form is None else dict(self.form),
            dict(self.files),
        )


def schema_ref(ref: str) -> list[str]:
    return ref.removeprefix("#/").split("/")


def deref(spec: dict, schema: dict) -> dict:
    """`schema`, with its `$ref` (if any) followed."""
    while "$ref" in schema:
        target: Any = spec
        for part in schema_ref(schema["$ref"]):
            target = target[part]
        schema = target
    return schema


def sample(spec: dict, schema: dict) -> Any:
    """A valid-looking value of `schema`: its example, default or first enum value, else one within its bounds."""
    schema = deref(spec, schema)
    for key in ("example", "default"):
        if key in schema:
            return schema[key]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "string":
        return "x" * max(schema.get("minLength", 1), 1) if schema.get("format") != "binary" else "prompts.jsonl"
    if kind == "integer":
        return max(schema.get("minimum", 1), 1)
    if kind == "number":
        return schema.get("minimum", 0)
    if kind == "boolean":
        return False
    if kind == "array":
        return []
    properties = schema.get("properties", {})
    return {name: sample(spec, properties[name]) for name in schema.get("required", []) if name in properties}


def base_request(spec: dict, template: str, method: str, operation: dict, ids: dict[str, int]) -> Request:
    request = Request(method, template)
    for parameter in operation.get("parameters", []):
        value = ids.get(parameter["name"]) or sample(spec, parameter.get("schema", {}))
        if parameter["in"] == "path":
            request.path[parameter["name"]] = value
        elif parameter["in"] == "query" and parameter.get("required"):
            request.query[parameter["name"]] = value
    content = operation.get("requestBody", {}).get("content", {})
    if "application/json" in content:
        request.body = sample(spec, content["application/json"]["schema"])
    elif "multipart/form-data" in content:
        schema = deref(spec, content["multipart/form-data"]["schema"])
        request.form = {}
        for name in schema.get("required", []):
            prop = deref(spec, schema["properties"][name])
            if prop.get("format") == "binary":
                request.files[name] = "prompts.jsonl"
            else:
                request.form[name] = sample(spec, prop)
    return request


def string_leaves(value: Any, prefix: str) -> Iterator[str]:
    """Dotted paths of the strings inside an example (a free-form object's, such as a job's config)."""
    if isinstance(value, str):
        yield prefix
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from string_leaves(item, f"{prefix}.{key}")


def body_string_fields(spec: dict, schema: dict, prefix: str = "") -> Iterator[str]:
    schema = deref(spec, schema)
    for name, prop in schema.get("properties", {}).items():
        prop = deref(spec, prop)
        path = f"{prefix}.{name}" if prefix else name
        if prop.get("type") == "string" and not prop.get("readOnly"):
            yield path
        elif prop.get("type") == "object":
            if "properties" in prop:
                yield from body_string_fields(spec, prop, path)
            elif isinstance(prop.get("example"), dict):
                yield from string_leaves(prop["example"], path)


def set_dotted(body: dict, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        body = body.setdefault(key, {})
    body[last] = value


def bad_requests(spec: dict, ids: dict[str, int]) -> Iterator[tuple[str, str, Request]]:
    """(operation, field, request) for each string field of each operation and each bad value."""
    for template, operations in spec["paths"].items():
        for method, operation in operations.items():
            base = base_request(spec, template, method, operation, ids)
            label = f"{method.upper()} {template}"
            for bad in (HUGE, NUL):
                for parameter in operation.get("parameters", []):
                    schema = deref(spec, parameter.get("schema", {}))
                    is_list = schema.get("type") == "array"
                    item = deref(spec, schema.get("items", {})) if is_list else schema
                    if item.get("type") != "string":
                        continue
                    request = base.copy()
                    where = request.path if parameter["in"] == "path" else request.query
                    where[parameter["name"]] = [bad] if is_list else bad
                    yield label, parameter["name"], request
                content = operation.get("requestBody", {}).get("content", {})
                if "application/json" in content:
                    for path in body_string_fields(spec, content["application/json"]["schema"]):
                        request = base.copy()
                        set_dotted(request.body, path, bad)
                        yield label, path, request
                elif "multipart/form-data" in content:
                    schema = deref(spec, content["multipart/form-data"]["schema"])
                    for name, prop in schema.get("properties", {}).items():
                        if deref(spec, prop).get("format") == "binary":
                            continue  # a file (its name is only a hint, cut and cleaned: test_hostile_input.py)
                        request = base.copy()
                        request.form[name] = bad
                        yield label, name, request


@both_backends
def test_every_string_field_refuses_a_huge_value_and_a_nul(app, client, token, admin_token, config):
    spec = client.get(SPEC_URL).json
    # The path ids name things that exist (the user's job), so each request gets as far as its checks go.
    ids = {"job_id": create_job(client, token, config)["id"], "dataset_id": 1, "step": 1}
    failures, seen = [], set()
    for label, name, request in bad_requests(spec, ids):
        for who, user_token in (("admin", admin_token), ("user", token)):
            response = request.send(client, user_token)
            body = response.get_json(silent=True) or {}
            last = name.rpartition(".")[2]
            if not 400 <= response.status_code < 500:
                failures.append((label, name, who, response.status_code, response.get_data(as_text=True)[:200]))
            elif response.status_code == 422 and not any(last in key for key in body.get("errors", {})):
                failures.append((label, name, who, "422 without the field", body))
            seen.add((label, name))
    assert not failures, "\n".join(map(str, failures))
    # The walk found the fields it must: a regression in it would pass vacuously.
    for expected in [
        ("POST /api/v1/catalogue/models", "path"),
        ("POST /api/v1/catalogue/servers", "url"),
        ("POST /api/v1/jobs", "name"),
        ("POST /api/v1/jobs", "config.model.policy"),
        ("POST /api/v1/rewards/try", "config.reward.function"),
        ("DELETE /api/v1/catalogue/models/{name}", "name"),
        ("GET /api/v1/admin/jobs", "user"),
        ("GET /api/v1/jobs/{job_id}/metrics", "name"),
        ("POST /api/v1/datasets", "name"),
    ]:
        assert expected in seen, (expected, sorted(seen))


def test_the_document_bounds_every_string_field_and_documents_the_early_errors(client):
    spec = client.get(SPEC_URL).json
    unbounded = []
    for template, operations in spec["paths"].items():
        for method, operation in operations.items():
            label = f"{method.upper()} {template}"
            fields = [(p["name"], deref(spec, p.get("schema", {}))) for p in operation.get("parameters", [])]
            body = operation.get("requestBody")
            for media in (body or {}).get("content", {}).values():
                schema = deref(spec, media["schema"])
                fields += [(name, deref(spec, prop)) for name, prop in schema.get("properties", {}).items()]
            for name, schema in fields:
                item = deref(spec, schema.get("items", {})) if schema.get("type") == "array" else schema
                bounded = "maxLength" in item or "enum" in item or item.get("format") == "binary"
                if item.get("type") == "string" and not bounded:
                    unbounded.append((label, name))
            if operation.get("security"):
                assert "429" in operation["responses"], label
            if body:
                assert body.get("required") is True, label
                assert {"400", "413", "415"} <= set(operation["responses"]), label
    assert not unbounded, unbounded
