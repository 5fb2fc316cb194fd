import subprocess
import sys

from aligner.run_layout import CHECKPOINT_DIR, CRITIC_DIR, STATE_FILE, checkpoint_steps, critic_checkpoint


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
