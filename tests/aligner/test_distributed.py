"""Data parallelism (aligner/distributed.py): helpers, 2 ranks equal to 1 rank, `aligner train` under torchrun."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from aligner import distributed
from aligner.algorithms.reinforce import advantages_from_baseline
from aligner.metrics import MACHINE_PREFIXES, MEMORY_PREFIX
from aligner.run_layout import list_checkpoints
from aligner.trainers.run_log import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["tell me about the cat.", "describe the dog.", "a bird", "the old river", "the sea", "a song", "the cat"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def test_shards_are_contiguous_and_cover_the_batch():
    items = list(range(7))
    shares = [distributed.shard(items, 3, i) for i in range(3)]
    assert shares == [[0, 1, 2], [3, 4], [5, 6]]
    assert [distributed.shard([1], 2, i) for i in range(2)] == [[1], []]
    assert distributed.shard(items) == items  # no process group: one rank holds everything


def test_without_a_process_group_every_helper_is_the_identity():
    assert (distributed.world_size(), distributed.rank(), distributed.is_main()) == (1, 0, True)
    metrics = {"a": 1.5, "b": -2.0}
    assert distributed.mean_over_ranks(metrics, weight=3) == metrics == distributed.max_over_ranks(metrics)
    assert distributed.gather_rows([{"x": 1}]) == [{"x": 1}]
    assert distributed.any_rank(True) and not distributed.any_rank(False)
    x = torch.tensor([0.5, -1.0, 2.0, 0.0])
    assert torch.equal(distributed.global_whiten(x), advantages_from_baseline(x, torch.zeros(4), normalize=True))
    assert torch.equal(distributed.all_reduce_sum(x), x)


def _collectives(rank: int, store: str) -> None:
    """One of 2 gloo ranks; an assertion error fails the spawning test."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        assert distributed.shard(list(range(5))) == [[0, 1, 2], [3, 4]][rank]
        # Rank 0 holds 3 samples of mean 1, rank 1 holds 2 of mean 2: the global mean is 7 / 5.
        mean = distributed.mean_over_ranks({"a": [1.0, 2.0][rank], **({"b": 5.0} if rank else {})}, [3, 2][rank])
        assert mean == pytest.approx({"a": 1.4, "b": 5.0})
        assert distributed.mean_over_ranks({"c": 9.0} if rank else {}, weight=rank) == {"c": 9.0}  # empty share
        assert distributed.max_over_ranks({"t": float(rank)}) == {"t": 1.0}
        assert distributed.gather_rows([rank, rank]) == [0, 0, 1, 1]
        assert distributed.any_rank(rank == 1) and not distributed.any_rank(False)

        full = torch.tensor([0.3, -1.2, 2.5, 0.7, 0.1])
        local = full[[slice(0, 3), slice(3, 5)][rank]]
        expected = advantages_from_baseline(full, torch.zeros(5), normalize=True)[[slice(0, 3), slice(3, 5)][rank]]
        torch.testing.assert_close(distributed.global_whiten(local), expected)

        # A gradient missing on one rank counts as zeros; the result is the sum over ranks.
        a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, 2))
        a.grad = torch.full((3,), rank + 1.0)
        b.grad = torch.ones(2, 2) if rank == 0 else None
        distributed.all_reduce_gradients([a, b])
        assert torch.equal(a.grad, torch.full((3,), 3.0)) and torch.equal(b.grad, torch.ones(2, 2))

        p = torch.nn.Parameter(torch.full((4,), float(rank)))
        distributed.broadcast_parameters([p])
        assert torch.equal(p.data, torch.zeros(4))

        # The shared queue deals every index once; each rank starts at its own, and a second call starts afresh.
        for _ in range(2):
            mine = list(distributed.dynamic_indices(9))
            assert mine[0] == rank and mine == sorted(mine)
            dealt = distributed.all_gather_objects(mine)
            assert sorted(dealt[0] + dealt[1]) == list(range(9))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_collectives_over_two_gloo_processes(tmp_path):
    torch.multiprocessing.spawn(_collectives, args=(str(tmp_path / "store"),), nprocs=2)


def _write_prompts(folder: Path) -> tuple[Path, Path]:
    for name in ("train", "val"):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return folder / "train.jsonl", folder / "val.jsonl"


def _config(tmp_path: Path, policy: Path, run: str, **sections) -> dict:
    train, val = _write_prompts(tmp_path)
    config = {
        "run_dir": str(tmp_path / run),
        "model": {"policy_path": str(policy), "num_threads": 1},
        "data": {"train_file": str(train), "val_file": str(val)},
        "reward": {"function": "tests.helpers.rewards:letter_reward"},
        # End strings make most responses end properly, so the RLOO baseline has groups to work on.
        "generation": {"max_new_tokens": 8, "end_strings": ["e", "a"]},
        # 5 prompts on 2 ranks: shares of 3 and 2 prompts; micro-batches of 4 cut across prompt groups.
        "reinforce": {"num_prompts_per_step": 5, "num_rollouts_per_prompt": 3, "normalize_advantages": True},
        # AdamW's first step moves a weight by lr * g / (|g| + eps): with the default eps (1e-8) a gradient entry near
        # 1e-8 turns a rounding-level difference between 1 and 2 ranks into a visible share of lr. A larger eps keeps
        # the update a smooth function of the gradient (rounding of ~1e-9 moves a weight by ~1e-5 lr), so weights
        # and later metrics compare tightly.
        "optim": {"lr": 1e-3, "warmup_steps": 1, "micro_batch_size": 4, "eps": 1e-4},
        "trainer": {"max_steps": 2, "val_check_interval": 1, "save_interval": 1, "num_val_prompts": 3},
    }
    for section, values in sections.items():
        config[section] = {**config.get(section, {}), **values}
    return config


def _ppo_config(tmp_path: Path, policy: Path, critic: Path, run: str) -> dict:
    """`_config` for PPO, with a critic server started from the reward-model folder `critic`."""
    sections = {
        "critic": {"model_path": str(critic), "server_overrides": ["lr=1e-3", "num_threads=1"]},
        "ppo": {"normalize_advantages": True},
        # One validation and one checkpoint (a critic_save) fewer than the REINFORCE run: the critic server is slow.
        "trainer": {"train_samples_to_log": 15, "val_check_interval": 2, "save_interval": 2},
    }
    return {**_config(tmp_path, policy, run, **sections), "algorithm": "ppo"}


def _run(command: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_dynamic_batching_samples_what_a_static_split_into_the_same_chunks_samples(tmp_path, tiny_policy_dir):
    """Chunks are seeded by their global position, not by the rank that takes them: one rank taking both chunks of
    2 prompts draws the (prompt, response, reward) rows that 2 ranks with fixed shares of 2 prompts draw."""
    from aligner.config import config_from_dict
    from aligner.trainers.reinforce import ReinforceTrainer

    reinforce = {"num_prompts_per_step": 4, "dynamic_batching_prompts": 2}
    trainer = ReinforceTrainer(config_from_dict(_config(tmp_path, tiny_policy_dir, "run", reinforce=reinforce)))
    trainer.setup()
    indices = trainer.sampler.next_batch(4)

    def rows() -> list[tuple]:
        samples = trainer.rollout(indices, trainer.train_data).samples
        return [(s["prompt"], s["response"], s["reward"]) for s in samples]

    static = []
    try:
        for rank in (0, 1):  # the static shares of 2 ranks, without processes
            distributed.set_data_parallel(rank, 2, leader=True)
            static += rows()
    finally:
        distributed.destroy()
    trainer.config.reinforce.dynamic_batching = True
    dynamic = rows()
    assert len(dynamic) == 12 and len({r[1] for r in dynamic}) > 1
    assert sorted(static) == sorted(dynamic)


def _one_and_two_ranks(tmp_path: Path, configs: dict[int, dict]) -> tuple[dict, dict]:
    """tests/helpers/distributed_worker.py's results of configs[1] in this process and configs[2] in 2 (torchrun).

    The two runs go at once: the 2 ranks start (process and server startup, most of their time) while this process,
    which has every module loaded already, runs the 1-rank reference instead of starting a fourth interpreter."""
    from tests.helpers import distributed_worker

    paths = {ranks: (tmp_path / f"config{ranks}.json", tmp_path / f"{ranks}.pt") for ranks in (1, 2)}
    for ranks, (config, _) in paths.items():
        config.write_text(json.dumps(configs[ranks]))
    worker = ["-m", "tests.helpers.distributed_worker", *map(str, paths[2])]
    two = subprocess.Popen([*TORCHRUN, *worker], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        distributed_worker.main(*map(str, paths[1]))
    except BaseException:
        two.kill()  # the ranks die with their agent
        two.communicate()
        raise
    output, _ = two.communicate(timeout=300)
    assert two.returncode == 0, output[-6000:]
    results = {ranks: torch.load(out, weights_only=False) for ranks, (_, out) in paths.items()}
    assert (results[1]["world_size"], results[2]["world_size"]) == (1, 2)
    return results[1], results[2]


def _assert_same_run(one: dict, two: dict, optimiser_steps: int) -> None:
    """Gradients, weights, metrics and logged samples of 2 processes are those of 1 process, to float rounding."""
    assert len(one["grads"]) == len(two["grads"]) == optimiser_steps
    for g1, g2 in zip(one["grads"], two["grads"]):
        assert g1.keys() == g2.keys()
        assert any(g.abs().max() > 0 for g in g1.values())  # a real update, not a batch of zero advantages
        for name in g1:
            # Summing per-rank gradients changes the order of float additions: errors scale with the largest entry.
            torch.testing.assert_close(g2[name], g1[name], rtol=1e-4, atol=1e-4 * float(g1[name].abs().max()))
    for name, w in one["weights"].items():
        torch.testing.assert_close(two["weights"][name], w, rtol=1e-5, atol=1e-6)

    assert [r["step"] for r in two["metrics"]] == [0, 1, 2]
    for r1, r2 in zip(one["metrics"], two["metrics"]):
        # Memory is each run's own (and backend fsdp reports its refit's too).
        assert {k for k in r1 if not k.startswith(MEMORY_PREFIX)} == {k for k in r2 if not k.startswith(MEMORY_PREFIX)}
        for key in r1.keys() & r2.keys():
            if not key.startswith(MACHINE_PREFIXES):  # wall-clock or memory based
                # The loss sums per-token terms of both signs (whitened advantages) larger than the result, and
                # its micro-batches (so their padded widths and float rounding) change with the ranks' shares: seen
                # 6e-6 apart at a loss of 0.05. Other metrics: relative rounding.
                tolerance = 3e-5 if key.endswith("/loss") else 1e-7
                assert r2[key] == pytest.approx(r1[key], rel=1e-4, abs=tolerance), key
    assert len(one["samples"]) == len(two["samples"])

    def ordered(samples):
        return sorted(samples, key=lambda s: (s["step"], s["split"], s["prompt"], s["response"]))

    for s1, s2 in zip(ordered(one["samples"]), ordered(two["samples"])):
        assert {k: s2[k] for k in ("step", "split", "prompt", "response", "is_end")} == {
            k: s1[k] for k in ("step", "split", "prompt", "response", "is_end")
        }
        for key in ("reward", "kl", "advantage"):  # validation rows have no advantage
            assert s2[key] == (None if s1[key] is None else pytest.approx(s1[key], rel=1e-4, abs=1e-6))


def test_dynamic_batching_needs_a_chunk_for_every_rank(tmp_path, tiny_policy_dir):
    from aligner.config import config_from_dict
    from aligner.errors import ConfigError
    from aligner.trainers.reinforce import ReinforceTrainer

    reinforce = {"num_prompts_per_step": 3, "dynamic_batching": True, "dynamic_batching_prompts": 2}
    trainer = ReinforceTrainer(config_from_dict(_config(tmp_path, tiny_policy_dir, "run", reinforce=reinforce)))
    trainer._check_dynamic_batching()  # 2 chunks for 1 rank
    distributed.set_data_parallel(0, 3, leader=True)
    try:
        with pytest.raises(ConfigError, match=r"makes 2 chunks of dynamic_batching_prompts \(2\); every one of the 3"):
            trainer._check_dynamic_batching()
        trainer.config.reinforce.num_prompts_per_step = 6
        trainer._check_dynamic_batching()  # 3 chunks for 3 ranks
        trainer.config.reinforce.num_mini_batches = 2
        with pytest.raises(ConfigError, match="reinforce.num_mini_batches > 1 under torchrun"):
            trainer._check_dynamic_batching()
    finally:
        distributed.destroy()


@pytest.mark.slow
def test_two_ranks_on_a_global_batch_make_the_one_rank_update(tmp_path, tiny_policy_dir):
    """Same rollout (samples that do not depend on the split), 2 optimiser steps: 2 processes, which deal the
    prompts from a shared queue (reinforce.dynamic_batching), take the update of 1 process with the whole batch."""
    configs = {}
    for ranks in (1, 2):
        # Every train sample is logged: the queue's dealing changes their order, not the set. Which rank takes which
        # chunk depends on timing, so the batches' shapes, and the float rounding of their log-probs (~1e-8 in a
        # KL-shaped reward), differ from run to run; whitening would divide that by the batch's reward spread (~1e-3
        # when most rewards tie: seen 8e-5 apart in a CI run), so the advantages here are not whitened.
        reinforce = {"dynamic_batching": ranks == 2, "normalize_advantages": False}
        dynamic = {"reinforce": reinforce, "trainer": {"train_samples_to_log": 15}}
        configs[ranks] = _config(tmp_path, tiny_policy_dir, f"run{ranks}", **dynamic)
    _assert_same_run(*_one_and_two_ranks(tmp_path, configs), optimiser_steps=2)


@pytest.mark.slow
def test_two_ranks_with_mini_batches_make_the_one_rank_updates(tmp_path, tiny_policy_dir):
    """Static shares, 2 steps of 2 mini-batches each (the global rollout's halves, which cut across the ranks' shares
    of 9 and 6 samples): 2 processes take the 4 optimiser steps of 1 process."""
    configs = {r: _config(tmp_path, tiny_policy_dir, f"mini{r}", reinforce={"num_mini_batches": 2}) for r in (1, 2)}
    _assert_same_run(*_one_and_two_ranks(tmp_path, configs), optimiser_steps=4)


def test_two_ranks_with_the_grpo_familys_knobs_make_the_one_rank_update(tmp_path, tiny_policy_dir):
    """Dr.GRPO's aggregation (every token sum over the global rows times max_new_tokens), the KL in the loss (k3) and
    advantages scaled by the std of the whole step's rewards (a global statistic): 2 processes with micro-batches
    take the 1-process update."""
    grpo = {"algorithm": "dr_grpo", "kl_in": "loss", "kl_estimator": "k3", "initial_policy_kl_penalty": 0.05,
            "scale_rewards": "batch", "normalize_advantages": False}  # fmt: skip
    # Seed 3: both steps have rewards with spread (the default seed's step 2 has none: every advantage 0).
    configs = {r: {**_config(tmp_path, tiny_policy_dir, f"grpo{r}", reinforce=grpo), "seed": 3} for r in (1, 2)}
    _assert_same_run(*_one_and_two_ranks(tmp_path, configs), optimiser_steps=2)


def test_two_ranks_reusing_rollouts_with_reinforce_pp_make_the_one_rank_update(tmp_path, tiny_policy_dir):
    """REINFORCE++'s per-token returns whitened over every rank's tokens, the clipped ratio per sequence with dual
    clip and clip-higher, 2 epochs x 2 mini-batches against the trainer's rollout-time log-probs, and the sequence
    token-sum aggregation: 2 processes take the 8 optimiser steps of 1, with the same ratio and mismatch metrics."""
    knobs = {"algorithm": "reinforce_pp", "num_epochs": 2, "num_mini_batches": 2, "importance_level": "sequence",
             "dual_clip": 3.0, "epsilon_high": 0.28, "loss_aggregation": "seq_mean_token_sum",
             "initial_policy_kl_penalty": 0.05}  # fmt: skip
    configs = {r: {**_config(tmp_path, tiny_policy_dir, f"pp{r}", reinforce=knobs), "seed": 3} for r in (1, 2)}
    one, two = _one_and_two_ranks(tmp_path, configs)
    _assert_same_run(one, two, optimiser_steps=8)
    assert all(r["train_optim/ratio_max"] > 1 for r in one["metrics"][1:])


@pytest.mark.slow
def test_ppo_on_two_ranks_makes_the_one_rank_update(tmp_path, tiny_policy_dir, reward_model_dir):
    """PPO under torchrun: rank 0's critic server serves both ranks and trains on the gathered global batch;
    advantages are whitened over it. Actor gradients, weights, metrics (the critic's loss among them) and samples
    of 2 processes are those of 1."""
    pytest.importorskip("pytriton")
    configs = {r: _ppo_config(tmp_path, tiny_policy_dir, reward_model_dir, f"ppo{r}") for r in (1, 2)}
    one, two = _one_and_two_ranks(tmp_path, configs)
    _assert_same_run(one, two, optimiser_steps=2)
    assert all(r["train_optim/critic_loss"] > 0 for r in one["metrics"][1:])


@pytest.mark.slow
def test_aligner_train_under_torchrun_with_two_processes(tmp_path, tiny_policy_dir):
    """Only rank 0 writes: one line per step, checkpoints with every rank's RNG state, the final policy; resuming
    under torchrun continues the run."""
    # seq_mean: the loss normaliser all-reduced is a count of samples (an integer tensor).
    config = _config(
        tmp_path, tiny_policy_dir, "run", trainer={"save_interval": 2}, reinforce={"loss_aggregation": "seq_mean"}
    )
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    train = [*TORCHRUN, "-m", "aligner.cli", "train", "--config", str(tmp_path / "run.yaml")]
    done = _run(train)
    assert done.stdout.count("final policy:") == 1  # printed by rank 0 only

    run = tmp_path / "run"
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all("train_rollouts/rewards" in r and "train_optim/grad_norm" in r for r in rows[1:])
    samples = read_jsonl(run / "samples.jsonl")
    assert [s["step"] for s in samples if s["split"] == "validation"] == [0] * 3 + [1] * 3 + [2] * 3
    assert (run / "final_policy" / "model.safetensors").is_file()
    state = torch.load(run / "checkpoints" / "step_000002" / "trainer_state.pt", weights_only=False)
    assert len(state["rng_per_rank"]) == 2 and state["step"] == 2

    _run([*train, "--resume", "--set", "trainer.max_steps=3"])
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2, 3]
    # Step 1 is checkpointed too when its validation was a new best (checkpoints/best.json).
    assert [c.name for c in list_checkpoints(run)][-2:] == ["step_000002", "step_000003"]


@pytest.mark.slow
def test_fewer_prompts_than_processes_is_a_clear_error(tmp_path, tiny_policy_dir):
    config = _config(tmp_path, tiny_policy_dir, "run", reinforce={"num_prompts_per_step": 1})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [*TORCHRUN, "-m", "aligner.cli", "train", "--config", str(tmp_path / "run.yaml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert "num_prompts_per_step (1) is global over processes and must be at least their number (2)" in done.stderr


def test_the_slurm_script_points_the_trainers_at_its_reward_server(tmp_path, tiny_policy_dir):
    """The overrides scripts/slurm_reinforce.sbatch passes turn any config's reward source into the server's URL."""
    import re

    from aligner.cli import build_parser
    from aligner.config import load_config

    script = (ROOT / "scripts" / "slurm_reinforce.sbatch").read_text()
    assert "#SBATCH hetjob" in script and "--het-group=0" in script and "--het-group=1" in script
    overrides = [
        s.replace('"', "").replace("$REWARD_URL", "http://node7:8000") for s in re.findall(r"--set (\S+)", script)
    ]
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(_config(tmp_path, tiny_policy_dir, "run")))
    args = build_parser().parse_args(["train", "--config", str(config), *[f"--set={o}" for o in overrides]])
    reward = load_config(args.config, args.overrides).reward
    assert (reward.function, reward.model_path, reward.server_url) == (None, None, "http://node7:8000")
