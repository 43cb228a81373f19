"""The OpenAI-compatible LLM gateway (see collectors.gateway.app); run it with ``python -m collectors.gateway``."""
