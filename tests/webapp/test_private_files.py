"""What the service writes is its user's only (webapp/private.py): folders 0700, files 0600, whatever the umask the
process was started with. The worker's run folders: tests/worker/test_celery_worker.py; `aligner up`'s whole data
folder: tests/webapp/test_stack.py."""

from __future__ import annotations

import io
import json
import os
import stat

import pytest

from tests.helpers.api import PROMPTS, bearer
from webapp.private import PRIVATE_UMASK, private_dir


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def shell_umask():
    """A shell's usual umask (0o022: everything readable by all) from before the app is made; restored after."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_the_api_keeps_its_data_folders_and_uploads_private(shell_umask, client, token, data_dir):
    # data_dir was made 0755 before the app (as an older version left it): create_app closed it.
    assert os.umask(PRIVATE_UMASK) == PRIVATE_UMASK  # the API process's umask
    for folder in (data_dir, data_dir / "runs", data_dir / "datasets"):
        assert _mode(folder) == 0o700, folder
    content = "".join(json.dumps(p) + "\n" for p in PROMPTS).encode()
    response = client.post("/api/v1/datasets", data={"file": (io.BytesIO(content), "p.jsonl")}, headers=bearer(token))
    assert response.status_code == 201, response.json
    uploaded = data_dir / response.json["path"]
    assert _mode(uploaded.parent) == 0o700 and _mode(uploaded) == 0o600


def test_private_dir_makes_new_folders_0700_and_closes_old_ones(shell_umask, tmp_path):
    made = private_dir(tmp_path / "a" / "b")
    assert _mode(made) == 0o700
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    os.chmod(old, 0o755)
    assert _mode(private_dir(old)) == 0o700
    os.chmod(old, 0o750)
    assert _mode(private_dir(old)) == 0o700
