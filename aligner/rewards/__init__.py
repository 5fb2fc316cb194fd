"""Rewards: the interface trainers call, local sources (a function, a reward model), and the clients of the reward
and critic servers (KServe v2 over HTTP)."""
