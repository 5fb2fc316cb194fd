"""Rewards: the interface trainers call, local sources (a function, a reward model), the reward-server client."""
