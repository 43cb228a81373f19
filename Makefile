# The two commands a new user needs. Both set up .venv themselves (idempotent).
.PHONY: demo test test-fast venv lint down

venv:
	@bash scripts/bootstrap.sh

# `make demo SEED=1` trains and samples with another seed (the held-out set stays the same);
# `make demo AGENT=tools` trains the agent that calls its calculator as a native function tool
demo: venv
	@.venv/bin/python -m examples.closed_loop $(if $(SEED),--seed $(SEED)) $(if $(AGENT),--agent $(AGENT))

test: venv
	@bash scripts/test.sh

# the edit loop: lint and the tests not marked slow or vllm (at most 5 minutes)
test-fast: venv
	@TIER=fast bash scripts/test.sh

lint: venv
	@bash scripts/lint.sh

down: venv
	@.venv/bin/agentlake down
