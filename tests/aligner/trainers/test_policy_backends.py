"""The policy backend object (aligner/trainers/policy_backends.py): which one a config gets, and a checkpoint that
only the backend that wrote it resumes. The backends' training itself is covered where each is: test_reinforce.py
(hf), tests/aligner/modeling/test_lora.py, test_megatron_train.py, test_ppo.py."""

import pytest
import torch

from aligner.errors import ConfigError
from aligner.run_layout import ADAPTER_DIR, STATE_FILE, list_checkpoints
from aligner.trainers.policy_backends import (
    BACKEND_KEY,
    FsdpBackend,
    HfBackend,
    LoraBackend,
    MegatronBackend,
    _older_backend,
    build_backend,
)
from tests.helpers.training import train


def test_the_config_picks_the_backend(run_config):
    assert type(build_backend(run_config())) is HfBackend
    assert type(build_backend(run_config(model={"lora": {"r": 4}}))) is LoraBackend
    assert type(build_backend(run_config(model={"backend": "fsdp"}))) is FsdpBackend
    # The combination rules (aligner/config.py) are not what is tested here: build the config around them.
    megatron = run_config()
    megatron.model.backend = "megatron"
    assert type(build_backend(megatron)) is MegatronBackend


def test_a_checkpoint_from_before_the_backend_was_recorded_names_its_backend(tmp_path):
    (tmp_path / ADAPTER_DIR).mkdir()
    assert _older_backend(tmp_path, {"megatron_layout": None}) == "lora"
    assert _older_backend(tmp_path / "x", {"megatron_layout": None}) == "hf"
    assert _older_backend(tmp_path, {"megatron_layout": {"world_size": 2}}) == "megatron"


@pytest.mark.slow(25)
def test_a_checkpoint_resumes_only_with_the_backend_that_wrote_it(run_config):
    """An hf checkpoint resumed with LoRA is a ConfigError naming both, before anything is loaded into the run, and
    the checkpoint stays (it is not damaged: a resume with hf takes it)."""
    config = run_config(trainer={"max_steps": 2, "save_interval": 2})
    train(config)
    newest = list_checkpoints(config.run_dir)[-1]
    assert torch.load(newest / STATE_FILE, weights_only=False)[BACKEND_KEY] == "hf"

    lora = run_config(trainer={"max_steps": 4, "save_interval": 2}, model={"lora": {"r": 4}})
    with pytest.raises(ConfigError, match=r"written with model\.backend hf; this run trains with lora"):
        train(lora, resume=True)
    assert list_checkpoints(config.run_dir) == [newest]
    config.trainer.max_steps = 3
    assert train(config, resume=True).step == 3
