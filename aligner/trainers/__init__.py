"""Trainers: REINFORCE / RLOO, PPO with a remote critic, reward models; the loop pieces, LR schedule, checkpoint
helpers, rollout records, run logs and critic client they share."""
