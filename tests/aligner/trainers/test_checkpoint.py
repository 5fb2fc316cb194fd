"""The durable checkpoint write (fsync before the rename, the manifest last), best.json, and reading a damaged one."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from aligner.errors import ConfigError
from aligner.run_layout import BEST_FILE, CHECKPOINT_DIR, MANIFEST_FILE, STATE_FILE
from aligner.trainers.checkpoint import (
    UnreadableCheckpoint,
    best_checkpoint,
    commit_checkpoint,
    drop_best_after,
    reading,
    write_json_atomic,
)
from tests.helpers.checkpoints import tear, write_checkpoint


@pytest.fixture
def calls(monkeypatch):
    """("fsync", path) and ("replace", src, dst), in the order they happen."""
    if sys.platform != "linux":
        pytest.skip("names fsync'd descriptors through /proc/self/fd")
    log = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        log.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst, **kw):
        log.append(("replace", str(src), str(dst)))
        real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return log


def test_every_file_and_folder_is_fsynced_before_the_rename_and_the_parent_after(tmp_path, calls):
    parent = tmp_path / CHECKPOINT_DIR
    tmp, final = parent / "step_000002.tmp", parent / "step_000002"
    data = {STATE_FILE: b"s" * 10, "config.yaml": b"c", "policy/model.safetensors": b"w" * 9, "critic/critic.pt": b"x"}
    for name, content in data.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_bytes(content)
    commit_checkpoint(tmp, final)

    rename = calls.index(("replace", str(tmp), str(final)))
    synced = [c[1] for c in calls[:rename] if c[0] == "fsync"]
    files, folders = [str(tmp / n) for n in data], [str(tmp / "policy"), str(tmp / "critic"), str(tmp)]
    manifest = synced.index(str(tmp / MANIFEST_FILE))
    assert set(files) <= set(synced[:manifest])  # the data, then the manifest that vouches for it
    assert set(folders) <= set(synced[manifest + 1 :])  # then the folders, the checkpoint's own last
    assert synced[-1] == str(tmp)
    assert calls[rename + 1 :] == [("fsync", str(parent))]  # the rename itself made durable
    entries = json.loads((final / MANIFEST_FILE).read_text())["files"]
    assert {n: e["size"] for n, e in entries.items()} == {n: len(c) for n, c in data.items()}


def test_best_json_is_fsynced_before_it_replaces_the_old_one(tmp_path, calls):
    path = tmp_path / BEST_FILE
    write_json_atomic(path, {"step": 2})
    tmp = str(path.with_name(BEST_FILE + ".tmp"))
    assert calls == [("fsync", tmp), ("replace", tmp, str(path)), ("fsync", str(tmp_path))]
    assert json.loads(path.read_text()) == {"step": 2}


def test_best_checkpoint_is_never_a_damaged_one(tmp_path):
    four = write_checkpoint(tmp_path, 4)
    write_json_atomic(tmp_path / CHECKPOINT_DIR / BEST_FILE, {"step": 4, "val/rewards": 1.0, "path": four.name})
    assert best_checkpoint(tmp_path) == four
    tear(four / STATE_FILE)
    assert best_checkpoint(tmp_path) is None


def test_a_resume_before_the_best_drops_the_pointer_to_it(tmp_path):
    pointer = tmp_path / CHECKPOINT_DIR / BEST_FILE
    write_checkpoint(tmp_path, 2)
    write_json_atomic(pointer, {"step": 4, "val/rewards": 1.0, "path": "step_000004"})
    drop_best_after(tmp_path, 4, None)  # resumed from the best itself: kept
    assert json.loads(pointer.read_text())["step"] == 4
    drop_best_after(tmp_path, 2, {"step": 2, "val/rewards": 0.5})  # step 4 was set aside: the state's best
    assert json.loads(pointer.read_text()) == {"step": 2, "val/rewards": 0.5, "path": "step_000002"}
    drop_best_after(tmp_path, None, None)  # from the beginning: no best yet
    assert not pointer.exists()


def test_a_file_that_cannot_be_loaded_is_unreadable_but_a_users_error_stays_one(tmp_path):
    (tmp_path / STATE_FILE).write_bytes(b"not a torch file")
    with pytest.raises(UnreadableCheckpoint, match=rf"^{STATE_FILE}: cannot be loaded \("), reading(STATE_FILE):
        torch.load(tmp_path / STATE_FILE, weights_only=False)
    with pytest.raises(ConfigError), reading(STATE_FILE):
        raise ConfigError("another Megatron layout")
