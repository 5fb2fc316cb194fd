"""Pure tensor functions of the alignment algorithms (losses, baselines, KL penalties)."""
