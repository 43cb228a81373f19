"""The agent SDK behind ``agentlake``'s public names (tracing, rollouts, rewards, OpenAI)."""
