"""The `agentlake` command on an install without the extra it needs: a message naming it, exit 3."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agentlake.entry import extra_for

RUN_WITHOUT = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # `import name` now raises ModuleNotFoundError, as on a light install
sys.argv = ["agentlake", "--help"]
from agentlake.entry import main
main()
"""


@pytest.mark.parametrize(
    ("module", "extra"),
    [
        ("torch.nn", "trainer"),
        ("peft", "trainer"),
        ("dagster", "stack"),
        ("duckdb_extension_delta", "stack"),
        ("typer", "stack"),
        ("matplotlib.pyplot", "examples"),
        ("schemas.config", None),
        (None, None),
    ],
)
def test_extra_for_names_the_extra_that_brings_a_module(module: str | None, extra: str | None) -> None:
    assert extra_for(module) == extra


def test_cli_without_its_extra_names_it_instead_of_a_traceback() -> None:
    done = subprocess.run([sys.executable, "-c", RUN_WITHOUT, "typer"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert "pip install 'agentlake[stack]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_module_no_extra_brings_is_a_bug_and_keeps_its_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT, "schemas.config"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "ModuleNotFoundError" in done.stderr and "pip install" not in done.stderr
