"""Trainers: REINFORCE / RLOO, PPO with a remote critic, reward models; their LR schedule, run logs, critic client."""
