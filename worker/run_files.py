"""The files the worker keeps in a job's run directory, beside the trainer's own (aligner/run_layout.py)."""

JOB_CONFIG_FILE = "job.yaml"  # the job's validated config, as the trainer reads it
TRAIN_LOG_FILE = "train.log"  # the trainer's output, each run of the job appended after a header line
TRAINER_PID_FILE = "trainer.pid"  # {"host", "pid", "worker"} of the running trainer (its process group)
CRITIC_PID_FILE = "critic.pid"  # {"host", "pgid", "url", "worker"} of the critic server a PPO job's worker started
