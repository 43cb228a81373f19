# The two commands a new user needs. Both set up .venv themselves (idempotent).
.PHONY: demo test venv lint down

venv:
	@bash scripts/bootstrap.sh

demo: venv
	@.venv/bin/python -m examples.closed_loop

test: venv
	@bash scripts/test.sh

lint: venv
	@.venv/bin/ruff check .
	@.venv/bin/mypy --config-file mypy.ini

down: venv
	@.venv/bin/agentlake down
