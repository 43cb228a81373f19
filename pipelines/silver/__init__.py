"""Silver: spans and reward events to `trajectories` (rollout identity, assembly, reward functions, judging)."""
