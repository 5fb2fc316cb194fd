"""bench/chaos.py, shortened: a stack on PostgreSQL and a RabbitMQ node of its own, three jobs over the API, and the
process faults (a worker SIGKILLed, another SIGTERMed, the broker restarted, a trainer killed, the reward server away
for a few seconds, the workers' clocks jumping an hour ahead and back); each job succeeds exactly once, with each
(step, metric) row once and no step missing, and no lease is lost to the clock jump. The faults that need a
PostgreSQL cluster of its own, a tmpfs mount or a second API (restart-postgres, disk-full, kill-api-upload,
two-apis) run in `bench/chaos.py --jobs 20` (docs/performance.md#chaos)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.databases import require_postgres

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow(90)
def test_every_job_succeeds_exactly_once_through_the_faults():
    require_postgres()
    faults = "sigkill-worker,sigterm-worker,restart-broker,kill-trainer,reward-outage,clock-jump"
    # --reward-outage 1: the reward server is away from its stop until its restart answers, 1 s plus its start-up
    # (seconds of PyTriton): the jobs' calls meet an outage of several seconds all the same.
    command = [sys.executable, "bench/chaos.py", "--jobs", "3", "--steps", "16", "--reward-outage", "1",
               "--clock-window", "7", "--faults", faults, "--json"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.stdout.strip(), done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(done.stdout)
    assert result["jobs"] == 3
    assert result["succeeded_once"] == 3, result["not_succeeded"]
    assert result["duplicate_metric_rows"] == 0 and result["missing_steps"] == 0
    done_faults = {f["fault"] for f in result["faults"]}
    assert {"sigkill-worker", "sigterm-worker", "restart-broker"} <= done_faults, result["faults"]
    assert result["fault_problems"] == [], result["fault_problems"]
    assert done.returncode == 0, done.stderr[-3000:]
