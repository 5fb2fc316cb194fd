"""aligner/processes.py: the minimal environment a job's trainer and critic server get."""

from __future__ import annotations

from aligner.processes import minimal_env


def test_minimal_env_keeps_what_a_trainer_needs_and_nothing_else(monkeypatch):
    keep = {"PATH": "/usr/bin", "HOME": "/home/aligner", "LC_ALL": "C.UTF-8", "CUDA_VISIBLE_DEVICES": "0"}
    keep |= {"OMP_NUM_THREADS": "2", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "30", "HF_HOME": "/cache/hf"}
    keep |= {"TOKENIZERS_PARALLELISM": "false"}  # TOKEN in its name, not a secret
    drop = {
        "ALIGNER_DATABASE_URL": "postgresql://aligner:db-secret@db/aligner",
        "ALIGNER_BROKER_URL": "redis://:broker-secret@redis:6379/0",
        "AWS_SECRET_ACCESS_KEY": "x",
        "PGPASSWORD": "x",
        "HTTPS_PROXY": "http://user:pass@proxy:3128",
        "HF_TOKEN": "x",  # a family the list lets through, but a secret's name
        "CUDA_API_KEY": "x",
    }
    for name, value in {**keep, **drop}.items():
        monkeypatch.setenv(name, value)
    env = minimal_env({"PYTHONUNBUFFERED": "1"})
    assert {name: env.get(name) for name in keep} == keep
    assert not set(drop) & set(env)
    assert env["PYTHONUNBUFFERED"] == "1"
