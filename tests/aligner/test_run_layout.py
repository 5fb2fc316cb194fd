import json
import subprocess
import sys

import pytest

from aligner.run_layout import (
    CHECKPOINT_DIR,
    CRITIC_DIR,
    END_FILE,
    END_REASONS,
    MANIFEST_FILE,
    STATE_FILE,
    RunEnd,
    checkpoint_problem,
    checkpoint_steps,
    clear_end,
    critic_checkpoint,
    damaged_message,
    read_end,
    resume_checkpoint,
    write_end,
)
from tests.helpers.checkpoints import FILES, flip_byte, tear, write_checkpoint


def make_checkpoint(run_dir, name, state=True, critic=False):
    folder = run_dir / CHECKPOINT_DIR / name
    folder.mkdir(parents=True)
    if state:
        (folder / STATE_FILE).write_bytes(b"x")
    if critic:
        (folder / CRITIC_DIR).mkdir()
    return folder


def test_only_complete_checkpoints_count_in_step_order(tmp_path):
    assert checkpoint_steps(tmp_path) == {}
    ten = make_checkpoint(tmp_path, "step_000010")
    two = make_checkpoint(tmp_path, "step_000002")
    make_checkpoint(tmp_path, "step_000012.tmp")  # still being written
    make_checkpoint(tmp_path, "step_000011", state=False)  # no trainer state: incomplete
    make_checkpoint(tmp_path, "step_000013.damaged")  # set aside by a resume
    assert checkpoint_steps(tmp_path) == {2: two, 10: ten}
    assert list(checkpoint_steps(tmp_path)) == [2, 10]


def test_critic_of_a_given_step_or_of_the_newest_checkpoint_holding_one(tmp_path):
    make_checkpoint(tmp_path, "step_000001", critic=True)
    make_checkpoint(tmp_path, "step_000002", critic=True)
    make_checkpoint(tmp_path, "step_000003")  # a REINFORCE checkpoint: no critic
    assert critic_checkpoint(tmp_path) == tmp_path / CHECKPOINT_DIR / "step_000002" / CRITIC_DIR
    assert critic_checkpoint(tmp_path, 1) == tmp_path / CHECKPOINT_DIR / "step_000001" / CRITIC_DIR
    assert critic_checkpoint(tmp_path, 3) is None and critic_checkpoint(tmp_path, 7) is None


def test_the_worker_reads_the_layout_without_importing_torch():
    code = "import sys, worker.ingest, aligner.run_layout; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ------------------------------------------------------------------------------------------------ damaged checkpoints
def test_a_torn_newest_checkpoint_is_set_aside_for_the_one_before(tmp_path):
    two, four = write_checkpoint(tmp_path, 2), write_checkpoint(tmp_path, 4)
    assert checkpoint_problem(four) is None and json.loads((four / MANIFEST_FILE).read_text())["checksum"] == "crc32"
    tear(four / STATE_FILE)
    size = len(FILES[STATE_FILE])
    reason = f"{STATE_FILE}: {size // 2} bytes, manifest says {size}"
    assert checkpoint_problem(four) == reason

    assert resume_checkpoint(tmp_path) == (2, two, [(4, reason)])
    aside = tmp_path / CHECKPOINT_DIR / "step_000004.damaged"
    assert aside.is_dir() and not four.exists() and checkpoint_steps(tmp_path) == {2: two}
    assert resume_checkpoint(tmp_path) == (2, two, [])  # once set aside, never seen again
    assert damaged_message(4, reason, 2) == f"checkpoint step 4 is damaged ({reason}): resuming from step 2"


def test_a_changed_byte_of_the_same_size_is_caught_by_the_checksum(tmp_path):
    two = write_checkpoint(tmp_path, 2)
    flip_byte(two / "policy" / "model.safetensors", offset=100)
    assert checkpoint_problem(two).startswith("policy/model.safetensors: crc32 ")
    assert resume_checkpoint(tmp_path)[:2] == (None, None)


def test_a_missing_file_or_manifest_and_an_older_checkpoint_without_one(tmp_path):
    old = write_checkpoint(tmp_path, 1, manifest=False)
    assert checkpoint_problem(old) is None  # written before manifests: trusted
    two, three = write_checkpoint(tmp_path, 2), write_checkpoint(tmp_path, 3)
    (two / "config.yaml").unlink()
    (three / MANIFEST_FILE).write_text('{"files": ')
    assert checkpoint_problem(two) == "config.yaml: missing"
    assert checkpoint_problem(three).startswith(f"{MANIFEST_FILE}: unreadable (JSONDecodeError")
    step, path, skipped = resume_checkpoint(tmp_path)
    assert (step, path, [s for s, _ in skipped]) == (1, old, [3, 2])  # newest first


def test_setting_aside_replaces_an_older_damaged_copy_of_the_step(tmp_path):
    four = write_checkpoint(tmp_path, 4)
    tear(four / STATE_FILE)
    step, path, skipped = resume_checkpoint(tmp_path)
    assert (step, path, [s for s, _ in skipped]) == (None, None, [4])  # none left: from the beginning
    four = write_checkpoint(tmp_path, 4)  # the run wrote step 4 again, and it was damaged again
    (four / "policy" / "model.safetensors").unlink()
    assert resume_checkpoint(tmp_path)[2] == [(4, "policy/model.safetensors: missing")]
    aside = tmp_path / CHECKPOINT_DIR / "step_000004.damaged"
    assert not (aside / "policy" / "model.safetensors").exists()  # the newer damaged copy
    assert [p.name for p in (tmp_path / CHECKPOINT_DIR).iterdir()] == ["step_000004.damaged"]


def test_the_end_record_round_trips_and_anything_else_reads_as_none(tmp_path):
    assert END_REASONS == ("completed", "max_time", "stopped", "server_unavailable", "failed")
    assert read_end(tmp_path) is None
    for reason in END_REASONS:
        write_end(tmp_path, RunEnd(reason, 3, 10, f"ended: {reason}"))
        assert read_end(tmp_path) == RunEnd(reason, 3, 10, f"ended: {reason}")
    assert [p.name for p in tmp_path.iterdir()] == [END_FILE]  # written through a temporary file, renamed
    with pytest.raises(ValueError, match="unknown end 'paused'"):
        write_end(tmp_path, RunEnd("paused", 3, 10))
    for text in ('{"end": "completed", "step": 3', '{"end": "exploded", "step": 3, "total_steps": 10}', "[]", ""):
        (tmp_path / END_FILE).write_text(text)  # cut short, unknown, not a record: nothing was said
        assert read_end(tmp_path) is None, text
    clear_end(tmp_path)
    clear_end(tmp_path)  # nothing to clear is fine
    assert not (tmp_path / END_FILE).exists()
