"""Datasets: upload (validated with aligner.data.prompts.read_prompt_file), list, size limit."""

from __future__ import annotations

import io
import json

from tests.helpers.api import PROMPTS, bearer, both_backends


def upload(client, token, content: bytes, filename: str = "prompts.jsonl", **form):
    return client.post(
        "/api/v1/datasets", data={"file": (io.BytesIO(content), filename), **form}, headers=bearer(token)
    )


@both_backends
def test_upload_stores_the_file_and_lists_it(client, token, other_token, data_dir):
    content = "".join(json.dumps(p) + "\n" for p in PROMPTS).encode()
    response = upload(client, token, content, name="cats and dogs")
    assert response.status_code == 201, response.json
    dataset = response.json
    assert dataset["name"] == "cats and dogs" and dataset["num_prompts"] == 2
    assert dataset["path"].startswith("datasets/user_") and dataset["path"].endswith(".jsonl")
    assert (data_dir / dataset["path"]).read_bytes() == content

    second = upload(client, token, b'{"prompt": "one"}\n', filename="one.jsonl").json
    assert second["name"] == "one.jsonl"
    listed = client.get("/api/v1/datasets", headers=bearer(token)).json
    mine = [d["id"] for d in listed["items"] if d["mine"]]
    assert mine == [second["id"], dataset["id"]] and all(d["shared"] for d in listed["items"] if not d["mine"])
    others = client.get("/api/v1/datasets", headers=bearer(other_token)).json["items"]
    assert not {dataset["id"], second["id"]} & {d["id"] for d in others}  # only the shared ones


def test_a_bad_prompt_file_is_422_with_file_and_line(client, token, data_dir):
    content = b'{"prompt": "fine"}\nnot json\n{"text": "no prompt"}\n'
    response = upload(client, token, content, filename="mine.jsonl")
    assert response.status_code == 422
    reasons = response.json["errors"]["file"]
    assert reasons[0].startswith("mine.jsonl:2: invalid JSON")
    assert reasons[1] == 'mine.jsonl:3: needs exactly one of the fields "prompt" or "messages"'
    assert not any(p.is_file() for p in (data_dir / "datasets").glob("user_*/**/*"))  # nothing kept

    assert upload(client, token, b"").json["errors"]["file"] == ["prompts.jsonl: prompt file has no prompts"]
    assert "not valid UTF-8" in upload(client, token, b"\xff\xfe").json["errors"]["file"][0]


def test_upload_needs_a_file_and_respects_the_size_limit(app, client, token):
    response = client.post("/api/v1/datasets", data={"name": "x"}, headers=bearer(token))
    assert response.status_code == 422 and "file" in response.json["errors"]
    app.config["MAX_DATASET_SIZE"] = 1000
    response = upload(client, token, b'{"prompt": "x"}\n' * 100)
    assert response.status_code == 413
    # Larger than MAX_CONTENT_LENGTH (1 MiB) is fine for an upload.
    app.config["MAX_DATASET_SIZE"] = 8 * 1024 * 1024
    assert upload(client, token, b'{"prompt": "xxxxxxxxxxxxxxxxxxxx"}\n' * 60_000).status_code == 201
