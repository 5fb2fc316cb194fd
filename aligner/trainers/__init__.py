"""Trainers: REINFORCE / RLOO, PPO with a remote critic, reward models; the loop pieces, LR schedule, checkpoint
helpers, rollout records and run logs they share (the critic's client: aligner/rewards/critic_client.py)."""
