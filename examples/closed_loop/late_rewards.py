"""Rewards that arrive later, from another process: how production traffic is rewarded.

In production the agent's trace ends without a reward; whoever learns the outcome (a user's
thumbs-up, a ticket closed tomorrow, a judge run tonight) posts it to the collector's
``/v1/rewards`` naming the rollout, some time later, and sometimes never. The demo's
``--traffic production`` hands each rollout's reward to this process with a delay; it posts them
through the SDK (``agentlake.emit_reward(value, rollout_id=...)``) when each delay has passed.

    python -m examples.closed_loop.late_rewards --collector http://127.0.0.1:4318

reads JSON lines ``{"rollout_id": ..., "value": ..., "delay_s": ...}`` on stdin and writes
``{"posted": rollout_id}`` (or ``{"failed": rollout_id, "error": ...}``) on stdout as each is sent.
At the end of stdin it waits for the ones still pending, then exits. ``LateRewards`` is the parent's
side: it starts the process, hands it rewards, and knows which were posted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

RETRIES = 5  # a collector restarting for a few seconds loses nothing


def _post(rollout_id: str, value: float, out_lock: threading.Lock) -> None:
    import agentlake
    from agentlake import SdkError

    error = ""
    for attempt in range(RETRIES):
        try:
            # The event id makes a retried post one reward, not two.
            agentlake.emit_reward(value, rollout_id=rollout_id, event_id=f"late-{rollout_id}")
            line = {"posted": rollout_id}
            break
        except SdkError as exc:
            error = str(exc)
            time.sleep(0.5 * 2**attempt)
    else:
        line = {"failed": rollout_id, "error": error}
    with out_lock:
        print(json.dumps(line), flush=True)


def serve(lines: list[str] | None = None) -> int:
    """Post each reward read from stdin (or ``lines``) after its delay; return when all are sent."""
    out_lock = threading.Lock()
    timers: list[threading.Timer] = []
    for raw in lines if lines is not None else sys.stdin:
        if not raw.strip():
            continue
        event = json.loads(raw)
        timer = threading.Timer(  # daemon: on a Ctrl-C the process exits without the pending ones
            max(0.0, float(event["delay_s"])), _post, (str(event["rollout_id"]), float(event["value"]), out_lock)
        )
        timer.daemon = True
        timer.start()
        timers.append(timer)
    for timer in timers:
        timer.join()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.closed_loop.late_rewards", description=__doc__.splitlines()[0])
    p.add_argument("--collector", required=True, help="the collector's OTLP/HTTP base URL, e.g. http://127.0.0.1:4318")
    args = p.parse_args(argv)
    os.environ["AGENTLAKE_ENDPOINT"] = args.collector  # where agentlake.emit_reward posts without init()
    try:
        return serve()
    except KeyboardInterrupt:  # the demo's Ctrl-C reaches its whole process group: stop quietly
        return 130


class LateRewards:
    """The parent's handle on the reward-posting process: hand it rewards, ask which were posted."""

    def __init__(self, collector: str, *, cwd: Path) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "examples.closed_loop.late_rewards", "--collector", collector],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=cwd,
        )
        self._lock = threading.Lock()
        self._posted: set[str] = set()
        self._failed: dict[str, str] = {}
        self._reader = threading.Thread(target=self._read, name="late-rewards-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            line = json.loads(raw)
            with self._lock:
                if "posted" in line:
                    self._posted.add(line["posted"])
                else:
                    self._failed[line["failed"]] = line["error"]

    def send(self, rollout_id: str, value: float, delay_s: float) -> None:
        """Have ``value`` posted for ``rollout_id`` ``delay_s`` seconds from now."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"rollout_id": rollout_id, "value": value, "delay_s": delay_s}) + "\n")
        self._proc.stdin.flush()

    def posted(self) -> set[str]:
        with self._lock:
            return set(self._posted)

    def failed(self) -> dict[str, str]:
        with self._lock:
            return dict(self._failed)

    def close(self) -> None:
        """Stop the process; rewards still waiting for their delay are never posted (as in production)."""
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> LateRewards:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(main())
