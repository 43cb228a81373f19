"""The benchmark's peer (Agent Lightning 0.3.0's adapter, in its own venv) does the whole work it is timed on.

`bench_pipelines.py --peer` prints the peer's rollouts/s next to ours; a ratio means something only if
the peer's spans are ones its adapter understands: one triplet per LLM call, holding that call's token
ids, and the rollout's reward on the last. Runs where `benchmarks/.venv-peer` exists (the benchmark
makes it; CI does not install the peer).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from benchmarks.peer_agentlightning import VENV, run_peer, venv_python

pytestmark = pytest.mark.skipif(not os.path.exists(venv_python(VENV)), reason="no benchmarks/.venv-peer")


def test_peer_adapter_turns_every_call_into_a_triplet(tmp_path: Path) -> None:
    rng = random.Random(7)
    path = tmp_path / "rollouts.jsonl"
    with path.open("w") as f:
        for i in range(20):
            prompt = [rng.randrange(49152) for _ in range(rng.randrange(4, 40))]
            calls = []
            for _ in range(rng.randrange(1, 5)):
                response = [rng.randrange(49152) for _ in range(rng.randrange(1, 20))]
                calls.append({"prompt": list(prompt), "response": response})
                prompt = prompt + response
            f.write(json.dumps({"rollout_id": f"r-{i}", "calls": calls, "final_reward": float(i % 2)}) + "\n")
    out = run_peer(str(path))
    assert out["version"] == "0.3.0"
    assert out["rollouts"] == 20
    assert out["triplets"] == out["calls"] == out["tokens_matched"] > 20
    assert out["rewards_matched"] == 20
    assert out["adapt_rollouts_s"] > 0 and out["decode_adapt_rollouts_s"] > 0
