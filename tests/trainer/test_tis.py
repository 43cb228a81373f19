"""Training on data from an older policy version: the TIS weights, the staleness limit and the metrics a
round records follow the formulas (trainer.offpolicy, trainer.losses), on cases small enough to work out by hand.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from schemas.lake import Lake
from schemas.tables import TRANSITIONS
from tests.trainer.helpers import token_logprobs_list, transition, write_transitions
from trainer.config import TrainConfig
from trainer.offpolicy import source_of, split_stale, staleness
from trainer.registry import Registry
from trainer.round import count_pending, train_once
from trainer.train import load_policy, train

PROMPT, RESPONSE = [3, 4, 5, 6], [7, 8, 9]  # token ids; any tokenizer's vocabulary holds them
RATIOS = [3.0, 0.5, 1.5]  # pi_current / pi_behaviour per response token, set by hand below


def _cfg(model: Path, **kw: object) -> TrainConfig:
    base: dict[str, object] = dict(
        base_model=str(model), lora_rank=4, learning_rate=1e-3, batch_size=4, progress=False, seed=0
    )
    return TrainConfig(**{**base, **kw})  # type: ignore[arg-type]


def test_version_arithmetic() -> None:
    assert source_of("agentlake-policy@v0003") == "v0003" and source_of(None) == "unknown"
    assert staleness("agentlake-policy@v0003", "v0005") == 2
    assert staleness("v0005", "v0005") == 0
    assert staleness("agentlake-base", "v0005") is None  # not a registry version: unknown
    assert staleness("agentlake-policy@v0006", "v0005") is None  # ahead of the trained-from version
    assert staleness("agentlake-policy@v0001", None) is None  # None: the base model, version 0
    rows = pa.Table.from_pylist(
        [transition(i, PROMPT, RESPONSE, advantage=1.0, policy_version=pv) for i, pv in
         enumerate(["p@v0005", "p@v0004", "p@v0003", "p@v0003", "base", None])],
        schema=TRANSITIONS,
    )  # fmt: skip
    kept, skipped = split_stale(rows, current_version="v0005", max_staleness=1)
    assert kept["policy_version"].to_pylist() == ["p@v0005", "p@v0004", "base", None]
    assert skipped == {"v0003": 2}
    assert split_stale(rows, current_version="v0005", max_staleness=None)[0].num_rows == 6


def test_stale_row_is_weighted_by_truncated_importance_ratio(tiny_model_dir: Path) -> None:
    """One transition sampled by v0001, trained from v0003: the per-token weights are min(ratio, C)."""
    cfg = _cfg(tiny_model_dir, algorithm="grpo", tis_cap=2.0, max_steps=1)
    model, tok = load_policy(cfg)
    current = token_logprobs_list(model, PROMPT, RESPONSE)  # the round's starting policy (a fresh LoRA: B = 0)
    behaviour = [lp - math.log(r) for lp, r in zip(current, RATIOS, strict=True)]  # so pi_cur / pi_b = RATIOS
    rows = pa.Table.from_pylist(
        [transition(0, PROMPT, RESPONSE, advantage=1.0, logprobs=behaviour, policy_version="agentlake-policy@v0001")],
        schema=TRANSITIONS,
    )
    result = train(cfg, rows, model=model, tokenizer=tok, current_version="v0003")

    # By hand, C = 2: weights min(3, 2), min(0.5, 2), min(1.5, 2) = 2, 0.5, 1.5; one of three capped.
    weights = [2.0, 0.5, 1.5]
    stats = result.offpolicy["v0001"]
    assert stats["rows"] == 1 and stats["tokens"] == 3 and stats["staleness"] == 2
    assert stats["ratio_mean"] == pytest.approx((3.0 + 0.5 + 1.5) / 3, rel=1e-4)
    assert stats["clip_frac"] == pytest.approx(1 / 3)
    assert stats["weight_mean"] == pytest.approx(sum(weights) / 3, rel=1e-4)
    # At the first step pi = pi_old, so r = 1 and nothing is clipped: loss = -A * mean(w) over the sequence.
    first = result.history[0]
    assert first["loss"] == pytest.approx(-1.0 * sum(weights) / 3, rel=1e-4)
    assert first["tis_weight"] == pytest.approx(sum(weights) / 3, rel=1e-4)
    assert first["tis_clip_frac"] == pytest.approx(1 / 3)
    assert first["ratio"] == pytest.approx(1.0, abs=1e-5)

    # TIS off: the ratio is to the behaviour logprobs, clipped at 1 +- 0.2: -mean(1.2, 0.5, 1.2).
    cfg_off = cfg.replace(tis_cap=0)
    model, tok = load_policy(cfg_off)
    off = train(cfg_off, rows, model=model, tokenizer=tok, current_version="v0003")
    assert off.history[0]["loss"] == pytest.approx(-(1.2 + 0.5 + 1.2) / 3, rel=1e-4)
    assert off.history[0]["tis_weight"] == 1.0
    assert "ratio_mean" not in off.offpolicy["v0001"]


def test_on_policy_data_trains_exactly_as_without_tis(tiny_model_dir: Path) -> None:
    """Behaviour logprobs equal to the current policy's: the same losses with TIS on as with it off."""
    cfg = _cfg(tiny_model_dir, algorithm="ppo", epochs=3)
    model, _ = load_policy(cfg)
    responses = [[7, 8, 9], [10, 11], [12, 7, 13, 14]]
    lps = [token_logprobs_list(model, PROMPT, r) for r in responses]

    def run(tis_cap: float, policy_version: str) -> list[float]:
        rows = [
            transition(i, PROMPT, r, advantage=(-1.0) ** i, logprobs=lp, policy_version=policy_version)
            for i, (r, lp) in enumerate(zip(responses, lps, strict=True))
        ]
        c = cfg.replace(tis_cap=tis_cap)
        torch.manual_seed(0)  # the same LoRA initialization in every run
        model, tok = load_policy(c)
        out = train(
            c, pa.Table.from_pylist(rows, schema=TRANSITIONS), model=model, tokenizer=tok, current_version="v0002"
        )
        return [m["loss"] for m in out.history]

    plain = run(0, "agentlake-policy@v0002")
    assert run(2.0, "agentlake-policy@v0002") == plain  # on-policy: the very same computation
    # Labelled stale but with the same logprobs: pi_old = pi_b up to float error, so w = 1 and r is the same.
    assert run(2.0, "agentlake-policy@v0001") == pytest.approx(plain, abs=1e-5)


def _publish(lake: Path, version: str) -> None:
    Registry(Lake(str(lake))).set_status(version, "published", published_at=dt.datetime.now(dt.UTC))


def test_rows_past_max_staleness_are_skipped_and_counted(lake: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = _cfg(
        tiny_model_dir,
        lake_root=str(lake),
        checkpoint_dir=str(tmp_path / "models"),
        min_new_transitions=1,
        max_steps=1,
        max_staleness=0,
    )
    rows = lambda ids, pv: [transition(i, PROMPT, RESPONSE, advantage=1.0, policy_version=pv) for i in ids]  # noqa: E731
    write_transitions(lake, rows(range(0, 2), "agentlake-base"))
    assert train_once(cfg=cfg).version == "v0001"  # from the base model
    _publish(lake, "v0001")
    write_transitions(lake, rows(range(2, 4), "agentlake-policy@v0001"))
    assert train_once(cfg=cfg).parent_version == "v0001"
    _publish(lake, "v0002")

    # The round trains from v0002: two rows of v0002 (on-policy), two of v0001 (1 behind), one of the base.
    behaviour = token_logprobs_list(load_policy(cfg)[0], PROMPT, RESPONSE)
    write_transitions(
        lake,
        [
            transition(4, PROMPT, RESPONSE, advantage=1.0, logprobs=behaviour, policy_version="agentlake-policy@v0002"),
            *rows(range(5, 6), "agentlake-policy@v0002"),
            *rows(range(6, 8), "agentlake-policy@v0001"),
            *rows(range(8, 9), "agentlake-base"),
        ],
    )
    result = train_once(cfg=cfg)
    assert result.version == "v0003" and result.parent_version == "v0002"
    assert result.metrics["n_examples"] == 3  # the two v0001 rows were not trained on

    recorded = json.loads(Registry(Lake(str(lake))).get("v0003")["metrics"])["offpolicy"]
    assert recorded == result.offpolicy
    assert recorded["v0001"] == {"rows": 0, "tokens": 0, "staleness": 1, "uncorrected_rows": 0, "skipped_stale": 2}
    v2 = recorded["v0002"]
    assert (v2["rows"], v2["tokens"], v2["staleness"], v2["skipped_stale"]) == (2, 6, 0, 0)
    assert v2["uncorrected_rows"] == 1  # row 5 came without logprobs
    assert (v2["ratio_mean"], v2["clip_frac"], v2["weight_mean"]) == (1.0, 0.0, 1.0)  # on-policy: exactly 1
    base = recorded["agentlake-base"]
    assert (base["rows"], base["staleness"], base["uncorrected_rows"], base["skipped_stale"]) == (1, None, 1, 0)
    assert count_pending(cfg) == (0, Lake(str(lake)).version("transitions"))  # the skipped rows are consumed

    # Only rows past the limit: no version, and the reason says why.
    write_transitions(lake, rows(range(9, 11), "agentlake-policy@v0001"))
    skipped = train_once(cfg=cfg)
    assert skipped.version is None and "max_staleness=0" in skipped.reason
    assert skipped.offpolicy["v0001"]["skipped_stale"] == 2
