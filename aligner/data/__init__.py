"""Training data: prompt files (REINFORCE, PPO) and preference pairs (reward models), JSONL checked line by line."""
