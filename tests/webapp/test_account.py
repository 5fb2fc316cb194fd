"""`GET /api/v1/me` (webapp/account.py): the token's user and whether an admin."""

from __future__ import annotations

from tests.helpers.api import bearer

ME = "/api/v1/me"


def test_me_names_the_user_and_says_whether_an_admin(client, token, admin_token):
    assert client.get(ME, headers=bearer(token)).json == {"name": "alice", "is_admin": False}
    assert client.get(ME, headers=bearer(admin_token)).json == {"name": "operator", "is_admin": True}
    response = client.get(ME, headers=bearer("alg_wrong"))
    assert response.status_code == 401 and set(response.json) == {"message", "errors"}
    assert client.get(ME).status_code == 401


def test_failed_signins_count_on_me_the_catalogue_and_the_admin_endpoints_too(client, token):
    # Every blueprint that needs a token counts, or the throttle could be walked around through the others.
    wrong = bearer("alg_wrong")
    paths = [ME, "/api/v1/catalogue/models", "/api/v1/catalogue/servers", "/api/v1/admin/jobs"]
    assert [client.get(paths[i % len(paths)], headers=wrong).status_code for i in range(10)] == [401] * 10
    assert client.get(ME, headers=wrong).status_code == 429
    assert client.get("/api/v1/catalogue/reward-functions", headers=wrong).status_code == 429
    assert client.get(ME, headers=bearer(token)).status_code == 200  # a valid token is never throttled
