"""The tracker hook (trainer.tracking): a real round on the tiny model reports its parameters, every optimizer
step's metrics as the loop computed them, the new version, and is closed; trackers are made by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.helpers import build_tokenizer, small_round_config, transition, write_transitions
from trainer import tracking
from trainer.errors import TrainerError
from trainer.round import train_once
from trainer.tracking import MemoryTracker, NoTracker, make_tracker, register_tracker


def test_a_round_reports_its_params_each_step_and_its_version(lake: Path, tiny_model_dir: Path) -> None:
    tok = build_tokenizer()
    prompt = tok("what is two plus three")["input_ids"]
    rows = [
        transition(i, prompt, tok("good" if i % 2 else "bad")["input_ids"], advantage=(-1.0) ** i) for i in range(4)
    ]
    write_transitions(lake, rows)
    tracker = MemoryTracker()

    result = train_once(cfg=small_round_config(lake, tiny_model_dir), tracker=tracker)

    assert result.version == "v0001" and tracker.closed
    assert tracker.params["version"] == "v0001" and tracker.params["parent_version"] is None
    assert (tracker.params["n_transitions"], tracker.params["n_trained"]) == (4, 4)
    assert tracker.params["algorithm"] == "grpo" and tracker.params["lora_rank"] == 4
    # 4 rows / 2 per micro-batch = 2 steps per epoch, 2 epochs: every step reported, as the round's history has it
    assert [step for step, _ in tracker.steps] == [1, 2, 3, 4]
    assert [{**m, "step": float(s)} for s, m in tracker.steps] == result.history
    last = tracker.steps[-1][1]
    assert {"loss", "pg_loss", "kl", "clip_frac", "ratio", "grad_norm", "tokens", "tokens_per_s"} <= set(last)
    assert last["tokens"] > 0 and last["tokens_per_s"] > 0

    skipped = MemoryTracker()  # nothing new to train on: no steps, and still closed
    assert train_once(cfg=small_round_config(lake, tiny_model_dir), tracker=skipped).version is None
    assert (skipped.steps, skipped.closed) == ([], True)


def test_trackers_are_made_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    # registrations stay in this test, which starts from the built-in two (trainer.trackers adds three on import)
    monkeypatch.setattr(tracking, "_FACTORIES", {k: tracking._FACTORIES[k] for k in ("none", "memory")})
    assert isinstance(make_tracker("none"), NoTracker)
    assert isinstance(make_tracker("memory"), MemoryTracker)

    made: list[dict[str, object]] = []

    def factory(**options: object) -> MemoryTracker:
        made.append(options)
        return MemoryTracker()

    register_tracker("custom", factory)
    assert isinstance(make_tracker("custom", uri="file:///runs"), MemoryTracker)
    assert made == [{"uri": "file:///runs"}]
    assert "custom" in tracking.tracker_names()
    with pytest.raises(TrainerError, match="registered already"):
        register_tracker("custom", factory)
    with pytest.raises(TrainerError, match="no tracker named 'mlfow'; known: custom, memory, none"):
        make_tracker("mlfow")
