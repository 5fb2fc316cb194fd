"""Odd and hostile input never gives a 5xx: each is a 4xx whose body names the reason.

Headers (Authorization), Content-Type, the JSON body (invalid UTF-8, lone surrogates, NUL, huge numbers, deep
nesting, no Content-Length), multipart uploads (odd file names and contents), ids past the id columns, paths the
OS refuses and URLs that do not parse, on SQLite and PostgreSQL. tests/webapp/test_every_field.py sends every string
field of the OpenAPI document a 10,000-character value and a NUL; tests/webapp/test_fuzz.py runs schemathesis.
"""

from __future__ import annotations

import io
import json

import pytest

from tests.helpers.api import bearer, both_backends, create_job

DEEP = b"[" * 10_000 + b"]" * 10_000
HUGE_INT = "1" + "0" * 5000  # past Python's 4300-digit limit for int(str)
JOBS, DATASETS = "/api/v1/jobs", "/api/v1/datasets"


def post_json(client, token, body: bytes, url: str = JOBS, **kwargs):
    return client.post(url, data=body, content_type="application/json", headers=bearer(token), **kwargs)


def upload(client, token, content: bytes, filename: str = "prompts.jsonl", **form):
    return client.post(DATASETS, data={"file": (io.BytesIO(content), filename), **form}, headers=bearer(token))


def assert_4xx(response, status: int, field: str, *words: str) -> None:
    """`status`, the error shape, and `field`'s reasons mention each of `words`."""
    assert response.status_code == status, (response.status_code, response.get_data(as_text=True)[:500])
    body = response.json
    assert set(body) == {"message", "errors"} and body["message"]
    reasons = " ".join(body["errors"][field])
    for word in words:
        assert word in reasons, (word, body)


# ------------------------------------------------------------------------------------------------ Authorization
@both_backends
@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer caf\xe9-\xff",  # not ASCII (a WSGI header is Latin-1)
        "Bearer a\x01b\x7f",  # control characters
        "Bearer a\tb c",
        "Bearer \x00",
        "Bearer " + "a" * 100_000,
        "Bearer ",
        "Bearer",
        "Bearer  alg_x",
        "Basic YTpi",
        "\xe9",
    ],
    ids=["latin1", "control", "tab-space", "nul", "100k", "empty", "scheme-only", "two-spaces", "basic", "garbage"],
)
def test_odd_authorization_headers_are_401(client, authorization):
    # Three failed sign-ins per app: well under SIGNIN_FAILURE_LIMIT.
    for method, url in (("post", JOBS), ("get", JOBS), ("post", DATASETS)):
        response = getattr(client, method)(url, headers={"Authorization": authorization})
        assert response.status_code == 401, (url, response.get_data(as_text=True)[:300])
        assert response.json == {"message": "Unauthorized", "errors": {}}


# ------------------------------------------------------------------------------------------------- Content-Type
@pytest.mark.parametrize(
    ("url", "content_type", "expected"),
    [
        (JOBS, "text/plain", "application/json"),
        (JOBS, "application/x-www-form-urlencoded", "application/json"),
        (JOBS, "multipart/form-data; boundary=x", "application/json"),
        (JOBS, "application/xml", "application/json"),
        (JOBS, "\xe9/\x01", "application/json"),
        (DATASETS, "application/json", "multipart/form-data"),
        (DATASETS, "text/csv", "multipart/form-data"),
    ],
)
def test_a_body_of_the_wrong_content_type_is_415(client, token, url, content_type, expected):
    response = client.post(url, data=b'{"name": "x"}', headers={**bearer(token), "Content-Type": content_type})
    assert_4xx(response, 415, "Content-Type", f"must be {expected}")


def test_json_of_another_media_type_suffix_is_still_json(client, token, config):
    body = json.dumps({"name": "x", "config": config})
    response = client.post(JOBS, data=body, headers={**bearer(token), "Content-Type": "application/vnd.x+json"})
    assert response.status_code == 201, response.json


# -------------------------------------------------------------------------------------------------- JSON bodies
@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b'{"name": "caf\xe9"}', "application/json"),  # Latin-1, not UTF-8
        (b'\xff\xfe{"name": "x"}', "application/json"),
        (b'{"name": "\xed\xa0\x80"}', "application/json"),  # a surrogate encoded as bytes: not UTF-8 either
        (b'{"name": "caf\xe9"}', "application/json; charset=latin-1"),  # JSON is UTF-8 whatever the label says
    ],
)
def test_json_that_is_not_utf8_is_400(client, token, body, content_type):
    response = client.post(JOBS, data=body, headers={**bearer(token), "Content-Type": content_type})
    assert_4xx(response, 400, "body", "invalid JSON", "decoding")


@both_backends
@pytest.mark.parametrize(
    ("where", "field", "reason"),
    [
        ("name", "name", "lone surrogate \\ud800"),
        ("name", "name", "NUL"),
        ("path", "config.model.policy", "lone surrogate \\ud800"),
        ("path", "config.data.train_dataset", "NUL"),
        ("key", "config.x\\ud800", "key must be valid Unicode"),
        ("list", "config.generation.stop.1", "NUL"),
    ],
)
def test_lone_surrogates_and_nul_in_json_strings_are_422_at_their_field(client, token, config, where, field, reason):
    bad = "\\ud800" if "surrogate" in reason or "Unicode" in reason else "\\u0000"
    text = json.dumps({"name": "job", "config": config})
    if where == "name":
        text = text.replace('"job"', f'"a{bad}b"')
    elif where == "path" and field.endswith("policy"):
        text = text.replace('"tiny-sft"', f'"tiny-{bad}"')
    elif where == "path":
        text = text.replace('"train.jsonl"', f'"train{bad}.jsonl"')
    elif where == "key":
        text = text.replace('"trainer":', f'"x{bad}": 1, "trainer":')
    else:
        text = text.replace('"trainer":', f'"generation": {{"stop": ["ok", "a{bad}"]}}, "trainer":')
    response = post_json(client, token, text.encode())
    assert_4xx(response, 422, field, reason)


@both_backends
@pytest.mark.parametrize(
    ("where", "number", "status", "field", "words"),
    [
        ("num_processes", HUGE_INT, 400, "body", ("invalid JSON", "4300 digits")),
        ("num_processes", "-" + HUGE_INT, 400, "body", ("invalid JSON", "4300 digits")),
        ("num_processes", "9" * 400, 422, "num_processes", ("less than or equal to 8",)),
        ("num_processes", "1e999", 422, "num_processes", ("integer",)),
        ("num_processes", "NaN", 422, "num_processes", ("integer",)),
        ("num_processes", "-Infinity", 422, "num_processes", ("integer",)),
        ("max_steps", "9" * 4000, 422, "config.trainer.max_steps", ("at most",)),
        ("lr", "1e999", 422, "config.optim.lr", ("finite",)),
        ("lr", "-1e999", 422, "config.optim.lr", ("got -inf",)),
        ("lr", "1e-999", 422, "config.optim.lr", ("greater than 0",)),
    ],
)
def test_huge_and_non_finite_numbers_are_4xx(client, token, config, where, number, status, field, words):
    config["trainer"]["max_steps"], config["optim"] = "MAX_STEPS", {"lr": "LR"}
    text = json.dumps({"name": "x", "config": config, "num_processes": "NUM_PROCESSES"})
    numbers = {"NUM_PROCESSES": "1", "MAX_STEPS": "5", "LR": "0.001", where.upper(): number}
    for placeholder, value in numbers.items():
        text = text.replace(f'"{placeholder}"', value)
    assert_4xx(post_json(client, token, text.encode()), status, field, *words)


@both_backends
def test_deeply_nested_json_is_400_with_or_without_content_length(client, token, config):
    inside_config = json.dumps({"name": "x", "config": {**config, "x": 0}}).replace("0}", DEEP.decode() + "}")
    objects = b'{"name": "x", "config": ' + b'{"a": ' * 10_000 + b"1" + b"}" * 10_001
    for body in (DEEP, objects, inside_config.encode()):
        assert_4xx(post_json(client, token, body), 400, "body", "nested deeper than 64 levels")
        # A chunked request (Transfer-Encoding, no Content-Length) is read and checked all the same.
        chunked = client.post(
            JOBS,
            input_stream=io.BytesIO(body),
            content_type="application/json",
            headers={**bearer(token), "Transfer-Encoding": "chunked"},
            environ_overrides={"wsgi.input_terminated": True},
        )
        assert_4xx(chunked, 400, "body", "nested deeper than 64 levels")
    assert_4xx(post_json(client, token, DEEP, url=DATASETS), 415, "Content-Type", "multipart/form-data")


def test_a_chunked_json_body_past_the_size_limit_is_413(client, token):
    response = client.post(
        JOBS,
        input_stream=io.BytesIO(b'{"name": "' + b"x" * (2 * 1024 * 1024) + b'"}'),
        content_type="application/json",
        headers={**bearer(token), "Transfer-Encoding": "chunked"},
        environ_overrides={"wsgi.input_terminated": True},
    )
    assert_4xx(response, 413, "body", "limit")


# ---------------------------------------------------------------------------------------------- GET /api/v1/jobs
@both_backends
@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("page=" + HUGE_INT, "page"),
        ("page=%ff%fe", "page"),
        ("per_page=%ED%A0%80", "per_page"),  # a surrogate, percent-encoded
        ("per_page=1e400", "per_page"),
        ("page=-0", "page"),
        ("status=%00", "status"),
        ("status=" + "x" * 100_000, "status"),
        ("algorithm=%C0%AF", "algorithm"),  # overlong UTF-8
    ],
)
def test_odd_query_strings_are_422(client, token, query, field):
    response = client.get(f"{JOBS}?{query}", headers=bearer(token))
    assert response.status_code == 422 and field in response.json["errors"], response.json


@both_backends
@pytest.mark.parametrize("value", ["\xb2", "\xb9\xb2", "1\x00", "\xe9", " ", "-1", "1e3", "0x10"])
def test_an_odd_last_event_id_is_422(client, token, config, value):
    job = create_job(client, token, config)
    response = client.get(f"{JOBS}/{job['id']}/events?timeout=0", headers={**bearer(token), "Last-Event-ID": value})
    assert_4xx(response, 422, "Last-Event-ID", "integer")


# --------------------------------------------------------------------------------------------- POST /api/v1/datasets
PROMPT_LINE = b'{"prompt": "Describe the cat."}\n'


@both_backends
@pytest.mark.parametrize(
    ("filename", "shown"),
    [
        ("\x00.jsonl", "jsonl"),
        ("../../etc/passwd", "etc_passwd"),
        ("caf\xe9 \u202e\U0001f600.jsonl", "cafe_.jsonl"),
        ("x" * 5000 + ".jsonl", "x" * 200),
        ("", "upload.jsonl"),
        ("..", "upload.jsonl"),
    ],
    ids=["nul", "traversal", "unicode", "5000-chars", "empty", "dots"],
)
def test_odd_file_names_are_stored_under_a_safe_name(client, token, data_dir, filename, shown):
    response = upload(client, token, PROMPT_LINE, filename=filename)
    assert response.status_code == 201, response.json
    assert response.json["name"] == shown
    assert (data_dir / response.json["path"]).read_bytes() == PROMPT_LINE


def test_a_file_part_whose_name_is_not_utf8_is_a_missing_file(client, token):
    # werkzeug's multipart parser drops a form whose part headers are not UTF-8: the file is missing (422).
    body = (
        b"--b\r\n"
        b'Content-Disposition: form-data; name="file"; filename="\xff\xfe\xc0\xaf.jsonl"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n" + PROMPT_LINE + b"\r\n--b--\r\n"
    )
    response = client.post(
        DATASETS, data=body, headers={**bearer(token), "Content-Type": "multipart/form-data; boundary=b"}
    )
    assert_4xx(response, 422, "file", "Missing data")


@both_backends
@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"\xff\xfe\x00\x00", ("not valid UTF-8",)),
        (b'{"prompt": "caf\xe9"}\n', ("not valid UTF-8", "byte 15")),
        (b'{"prompt": "x"}\n' + DEEP + b"\n", ("prompts.jsonl:2", "nested too deeply")),
        (b'{"prompt": "x", "n": ' + HUGE_INT.encode() + b"}\n", ("prompts.jsonl:1", "4300 digits")),
        (b'{"prompt": 1e999}\n', ('"prompt" must be a non-empty string',)),
        (b"\x00\x00\x00\n", ("invalid JSON",)),
        (b"", ("no prompts",)),
        (PROMPT_LINE + b'{"prompt": "a\\ud800"}\n', ("prompts.jsonl:2: prompt:", "lone surrogate \\ud800")),
        (b'{"prompt": "a\\u0000"}\n', ("prompts.jsonl:1: prompt:", "NUL")),
    ],
    ids=["utf16-bom", "latin1", "deep", "huge-int", "inf", "nul-bytes", "empty", "lone-surrogate", "nul-escape"],
)
def test_bad_file_contents_are_422_and_nothing_is_kept(client, token, data_dir, content, words):
    response = upload(client, token, content)
    assert_4xx(response, 422, "file", *words)
    assert not any(p.is_file() for p in (data_dir / "datasets").glob("user_*/**/*"))


@both_backends
@pytest.mark.parametrize("name", ["a\x00b", "x" * 201, ""])
def test_an_odd_dataset_name_is_422(client, token, name):
    response = upload(client, token, PROMPT_LINE, name=name)
    assert response.status_code == 422 and "name" in response.json["errors"], response.json


def test_a_multipart_body_that_is_not_multipart_is_422(client, token):
    for body in (b"garbage", b"--b\r\nContent-Disposition: form-data\r\n", b"--b--"):
        response = client.post(
            DATASETS, data=body, headers={**bearer(token), "Content-Type": "multipart/form-data; boundary=b"}
        )
        assert_4xx(response, 422, "file", "Missing data")
    response = client.post(DATASETS, data=b"x", headers={**bearer(token), "Content-Type": "multipart/form-data"})
    assert response.status_code in (400, 422), response.get_data(as_text=True)  # no boundary at all


# --------------------------------------------------------------------------------------- ids past the id columns
BIG_IDS = [2**63, 2**31, -(2**63) - 1]  # SQLite overflows past 2^63 - 1; PostgreSQL's columns are 32-bit
CONFIG_REFS = [
    "model.policy",
    "model.tokenizer",
    "data.train_dataset",
    "data.val_dataset",
    "reward.function",
    "reward.model",
    "reward.server",
    "critic.model",
    "critic.server",
    "validation.extra_rewards.gold.function",
]


@both_backends
@pytest.mark.parametrize("field", CONFIG_REFS)
def test_an_id_past_the_id_columns_in_a_config_is_422_at_its_field(client, token, config, field):
    if field.startswith("critic."):
        config["algorithm"] = "ppo"
    if field in ("reward.model", "reward.server"):
        del config["reward"]["function"]
    for big in BIG_IDS:
        section = config
        *parents, last = field.split(".")
        for key in parents:
            section = section.setdefault(key, {})
        section[last] = big
        for url in (JOBS, "/api/v1/rewards/try"):
            response = client.post(
                url, json={"config": config, **({"name": "x"} if url == JOBS else {})}, headers=bearer(token)
            )
            assert response.status_code == 422, (url, big, response.get_data(as_text=True)[:300])
            assert "not found" in " ".join(response.json["errors"][f"config.{field}"]), response.json


@both_backends
def test_ids_past_the_id_columns_in_paths_and_queries_are_4xx(client, token, admin_token, config):
    job = create_job(client, token, config)["id"]
    for big in (2**63, 2**31):
        for method, url, status in [
            ("get", f"{JOBS}/{big}", 404),
            ("post", f"{JOBS}/{big}/cancel", 404),
            ("get", f"{JOBS}/{big}/metrics", 404),
            ("get", f"{JOBS}/{job}/checkpoints/{big}/download", 404),
            ("get", f"/api/v1/admin/jobs/{big}", 404),
            ("get", f"{JOBS}?page={big}", 422),
            ("get", f"{JOBS}/{job}/samples?step={big}", 422),
            ("get", f"{JOBS}/{job}/metrics?since_step={big}", 422),
            ("get", f"{JOBS}/{job}/events?timeout=0&last_event_id={big}", 422),
        ]:
            response = getattr(client, method)(url, headers=bearer(admin_token if "admin" in url else token))
            assert response.status_code == status, (url, response.get_data(as_text=True)[:300])
        response = client.patch(f"{DATASETS}/{big}", json={"shared": True}, headers=bearer(admin_token))
        assert response.status_code == 404, response.json


# ------------------------------------------------------------------------------ paths, names and URLs of the catalogue
CATALOGUE = "/api/v1/catalogue"


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/" + "a" * 3000, ("cannot be read", "File name too long")),  # one name past NAME_MAX (255)
        ("/tmp/" + "a/" * 2040, ("folder not found",)),
        ("~no-such-user-x/model", ("folder not found",)),
        ("x" * 4097, ("Length",)),
        ("/tmp/a\x00b", ("NUL",)),
    ],
    ids=["name-too-long", "deep", "unknown-home", "4097-chars", "nul"],
)
def test_a_model_path_the_os_refuses_is_422_at_path(client, admin_token, path, words):
    response = client.post(
        f"{CATALOGUE}/models", json={"name": "m", "path": path, "kind": "policy"}, headers=bearer(admin_token)
    )
    assert_4xx(response, 422, "path", *words)


@pytest.mark.parametrize("url", ["http://[::1", "http://[::1]x", "https://[v1.x]", "http://[", "http://" + "a" * 2000])
def test_a_server_url_that_does_not_parse_is_422_at_url(client, admin_token, url):
    response = client.post(
        f"{CATALOGUE}/servers", json={"name": "s", "url": url, "kind": "reward"}, headers=bearer(admin_token)
    )
    assert response.status_code == 422 and "url" in response.json["errors"], response.json


@both_backends
@pytest.mark.parametrize("kind", ["models", "reward-functions", "servers"])
@pytest.mark.parametrize(("name", "words"), [("a%00b", ("NUL",)), ("x" * 10_000, ("Length",))], ids=["nul", "10k"])
def test_a_catalogue_name_in_the_path_is_bounded(client, admin_token, kind, name, words):
    response = client.delete(f"{CATALOGUE}/{kind}/{name}", headers=bearer(admin_token))
    assert_4xx(response, 422, "name", *words)
