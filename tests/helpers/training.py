"""Running a trainer in the test process."""

from __future__ import annotations

from aligner.trainers.reinforce import ReinforceTrainer


def train(config, resume=False, until_step=None):
    trainer = ReinforceTrainer(config)
    trainer.setup(resume=resume)
    trainer.fit(until_step=until_step)
    return trainer
