"""Gold: trajectories to credit-assigned `transitions` (credit, advantage estimators, reward horizon, variants)."""
