"""What the service writes is readable by its own user only: other local users read no tenant's data.

The rule, in one place: every service process calls `private_files()` first (the API's create_app, the Celery
worker at its start, `aligner up`, `aligner ui`), which sets the umask to PRIVATE_UMASK. Every folder it or a child
of it makes (a trainer, a critic server, Redis: children inherit the umask) is then 0700 and every file 0600, with
no mode to remember at each mkdir or open. `private_data_dir()` makes the data folder and its top folders (runs/,
datasets/) 0700 and takes group and other bits off ones made before this rule, so that a data folder left 0755 by an
older version is closed at the next start: what lies below a 0700 folder is out of other users' reach whatever its
own mode. docs/security.md "Deployment" lists the tests.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077  # new folders 0700, new files 0600


def private_files() -> None:
    """Make this process's (and its future children's) new files and folders its user's only."""
    os.umask(PRIVATE_UMASK)


def private_dir(path: str | Path) -> Path:
    """`path` made (with its parents) 0700, or, if it exists and is this user's, its group and other bits taken
    off. Another user's folder keeps its mode (changing it is not ours to do)."""
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & PRIVATE_UMASK and path.stat().st_uid == os.getuid():
        path.chmod(mode & ~PRIVATE_UMASK)
    return path


def private_data_dir(data_dir: str | Path) -> Path:
    """The service's data folder (DATA_DIR) and its runs/ and datasets/, each 0700 (`private_dir`)."""
    from webapp.catalogue import DATASETS_DIR
    from webapp.db import RUNS_DIR

    data_dir = private_dir(data_dir)
    for name in (RUNS_DIR, DATASETS_DIR):
        private_dir(data_dir / name)
    return data_dir
