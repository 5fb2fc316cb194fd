"""Authentication (bearer tokens), isolation between users, health, and the OpenAPI document."""

from __future__ import annotations

import re

import pytest

from tests.helpers.api import bearer, both_backends, create_job

JOB_ROUTES = [
    ("get", ""),
    ("post", "/cancel"),
    ("post", "/resume"),
    ("post", "/retry"),
    ("get", "/metrics"),
    ("get", "/samples"),
    ("get", "/checkpoints"),
    ("get", "/model"),
    ("get", "/best_model"),
    ("get", "/events"),
]


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer alg_wrong"}, {"Authorization": "Basic YTpi"}, {"Authorization": "Bearer"}],
)
def test_no_or_bad_token_is_401(client, headers):
    for method, url in [("get", "/api/v1/jobs"), ("post", "/api/v1/jobs"), ("get", "/api/v1/datasets")]:
        response = getattr(client, method)(url, headers=headers)
        assert response.status_code == 401, (url, headers)
        assert response.json == {"message": "Unauthorized", "errors": {}}


@both_backends
def test_another_users_job_is_404_everywhere(client, token, other_token, config):
    job = create_job(client, token, config)
    for method, suffix in JOB_ROUTES:
        response = getattr(client, method)(f"/api/v1/jobs/{job['id']}{suffix}", headers=bearer(other_token))
        assert response.status_code == 404, suffix
        assert response.json["message"] == f"job {job['id']} not found"
    assert client.get("/api/v1/jobs", headers=bearer(other_token)).json["total"] == 0
    assert client.get(f"/api/v1/jobs/{job['id']}", headers=bearer(token)).status_code == 200


@both_backends
def test_health_needs_no_token(client):
    response = client.get("/api/v1/health")
    assert response.status_code == 200
    assert response.json["status"] == "ok" and response.json["database"] == "ok"


def test_health_is_503_when_the_database_is_unreachable(tmp_path):
    from webapp import create_app
    from webapp.queues import InMemoryQueue

    app = create_app(
        {"DATA_DIR": str(tmp_path), "DATABASE_URL": "sqlite:////nonexistent/dir/x.db", "JOB_QUEUE": InMemoryQueue()}
    )
    response = app.test_client().get("/api/v1/health")
    assert response.status_code == 503 and response.json["status"] == "error"


def test_openapi_document_lists_paths_schemas_and_bearer_auth(client):
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    spec = response.json
    assert spec["info"]["title"] == "Aligner" and spec["info"]["version"]
    assert set(spec["paths"]) == {
        "/api/v1/health",
        "/api/v1/jobs",
        "/api/v1/jobs/{job_id}",
        "/api/v1/jobs/{job_id}/cancel",
        "/api/v1/jobs/{job_id}/resume",
        "/api/v1/jobs/{job_id}/retry",
        "/api/v1/jobs/{job_id}/metrics",
        "/api/v1/jobs/{job_id}/samples",
        "/api/v1/jobs/{job_id}/checkpoints",
        "/api/v1/jobs/{job_id}/checkpoints/{step}/download",
        "/api/v1/jobs/{job_id}/model",
        "/api/v1/jobs/{job_id}/best_model",
        "/api/v1/jobs/{job_id}/events",
        "/api/v1/datasets",
        "/api/v1/datasets/{dataset_id}",
        "/api/v1/catalogue/models",
        "/api/v1/catalogue/models/{name}",
        "/api/v1/catalogue/reward-functions",
        "/api/v1/catalogue/reward-functions/{name}",
        "/api/v1/catalogue/servers",
        "/api/v1/catalogue/servers/{name}",
        "/api/v1/admin/jobs",
        "/api/v1/admin/jobs/{job_id}",
        "/api/v1/admin/jobs/{job_id}/cancel",
        "/api/v1/admin/jobs/{job_id}/resume",
        "/api/v1/admin/jobs/{job_id}/retry",
        "/api/v1/admin/jobs/{job_id}/events",
        "/api/v1/me",
        "/api/v1/rewards/try",
    }
    schemas = spec["components"]["schemas"]
    assert {"JobIn", "JobOut", "JobPage", "MetricsOut", "SamplePage", "DatasetOut", "HealthOut"} <= set(schemas)
    create = spec["paths"]["/api/v1/jobs"]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/JobIn")
    assert {"201", "401", "422"} <= set(create["responses"])
    assert create["security"] == [{"BearerAuth": []}]
    assert "security" not in spec["paths"]["/api/v1/health"]["get"]
    assert "text/event-stream" in spec["paths"]["/api/v1/jobs/{job_id}/events"]["get"]["responses"]["200"]["content"]
    assert client.get("/api/v1/docs").status_code == 200


def test_the_docs_page_loads_only_local_files_and_they_are_served(client):
    page = client.get("/api/v1/docs").get_data(as_text=True)
    urls = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert urls and all(url.startswith("/api/v1/docs/assets/") for url in urls), urls
    kinds = set()
    for url in urls:
        response = client.get(url)
        assert response.status_code == 200 and len(response.data) > 500, url
        kinds.add(response.mimetype)
        response.close()
    assert {"text/javascript", "text/css"} <= kinds
    assert client.get("/api/v1/docs/assets/index.html").status_code == 404  # only the files the page loads
