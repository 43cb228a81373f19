"""``vllm.restart_command``: the folder reaches the user's command; a failing command is a PublishError."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from serving.errors import PublishError
from serving.restart import command_restart


def test_the_command_runs_with_the_folder(tmp_path: Path) -> None:
    out = tmp_path / "restarted-on"
    write = "import sys, pathlib; pathlib.Path(sys.argv[1]).write_text(sys.argv[2])"
    restart = command_restart([sys.executable, "-c", write, str(out), "{folder}"])
    assert restart is not None
    restart("/models/v0003")
    assert out.read_text() == "/models/v0003"


def test_a_failing_command_says_what_it_printed() -> None:
    restart = command_restart([sys.executable, "-c", "import sys; sys.exit('no such unit: vllm@{folder}')"])
    assert restart is not None
    with pytest.raises(PublishError, match=r"exited 1: no such unit: vllm@/models/v0003"):
        restart("/models/v0003")


def test_a_missing_program_and_a_command_without_the_folder_are_refused() -> None:
    assert command_restart([]) is None
    with pytest.raises(PublishError, match="never names"):
        command_restart(["systemctl", "restart", "vllm"])
    restart = command_restart(["/nonexistent/restart-vllm", "{folder}"])
    assert restart is not None
    with pytest.raises(PublishError, match="failed to run"):
        restart("/models/v0003")
