"""Signals of a training run going wrong, computed from the lake: pure functions over Polars frames (and
``held_out_scores``, the one source that reads the lake itself).

Read by the collapse checks (``pipelines.defs.health``), thresholds from ``[health]`` settings. Each
signal returns a ``Finding``: whether it fired, a sentence saying what was measured, and the values
(measured and thresholds) for the check's metadata. A signal without the data it needs is *skipped*
(not fired) and says what is missing: no false alarm on a young lake.

- from ``model_versions`` (``version_frame``), per policy line: entropy collapse, KL and policy-ratio
  blow-up, clip-fraction spikes (the round's last-step metrics, ``final_*``);
- from ``transitions``: the zero-advantage share of the newest policy version's rows, and each agent's
  reward distribution shift (newest rollouts against the ones before, a two-sample KS statistic);
- both: reward hacking, the training reward of the rollouts a version sampled rising across a line's
  last versions while their held-out eval falls (``held_out_scores`` is the one place that reads it: the
  ``evaluations`` table, else the eval gate's scores in ``model_versions.metrics``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from schemas.config.health import (
    ClipFracCheck,
    EntropyCheck,
    KlCheck,
    RatioCheck,
    RewardHackingCheck,
    RewardShiftCheck,
    ZeroAdvantageCheck,
)
from schemas.lake import Lake
from schemas.tables import base_table

SINGLE_POLICY = "policy"  # the name a finding gives the single policy's line (model_versions.agent null)
BASE_MODEL = "(base model)"  # the name of rows sampled with no policy version
ZERO = 1e-12  # |advantage| at most this is zero

# Where each signal's value is in model_versions.metrics: the first key present (the round's summary
# writes the last optimizer step's metrics as final_<name>; trackers may add others).
METRIC_KEYS: dict[str, tuple[str, ...]] = {
    "entropy": ("final_entropy", "entropy_mean", "entropy"),
    "kl": ("final_kl", "kl"),
    "ratio": ("final_ratio", "ratio"),
    "clip_frac": ("final_clip_frac", "clip_frac"),
}
EVALUATIONS = "evaluations"  # held-out evaluations per version, where the lake has the table
EVALUATION_COLUMNS = ["version", "task_set", "mean", "evaluated_at"]
# Transitions columns the signals read.
TRANSITION_COLUMNS = ["tenant", "rollout_id", "agent_name", "policy_version", "reward", "advantage", "created_at"]


@dataclass(frozen=True)
class Finding:
    """One signal's verdict: ``fired`` (the threshold is crossed), what was measured, the values."""

    fired: bool
    description: str
    values: dict[str, Any] = field(default_factory=dict)
    skipped: bool = False


def skipped(why: str, **values: Any) -> Finding:
    return Finding(False, f"skipped: {why}", values, skipped=True)


# --- sources ---------------------------------------------------------------------------------------


def held_out_scores(lake: Lake, registry_rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """{version: its held-out eval score}: the one place reward hacking reads held-out results from.

    From the ``evaluations`` table (one row per evaluation of a version) where it exists: per version the
    mean of its latest evaluation on the task set evaluated last (scores of other task sets do not
    compare). Else the publish gate's ``eval_candidate`` in ``model_versions.metrics``."""
    scan = lake.scan(EVALUATIONS) if base_table(EVALUATIONS) is not None else None  # a lake without the table
    if scan is not None and set(EVALUATION_COLUMNS) <= set(scan.collect_schema().names()):
        evals = scan.select(EVALUATION_COLUMNS).filter(pl.col("mean").is_not_null()).sort("evaluated_at").collect()
        if evals.height:
            task_set = evals["task_set"][-1]
            latest = evals.filter(pl.col("task_set") == task_set).group_by("version").agg(pl.col("mean").last())
            return {str(v): float(m) for v, m in latest.iter_rows()}
    out: dict[str, float] = {}
    for row in registry_rows:
        value = _metrics(row).get("eval_candidate")
        if isinstance(value, int | float):
            out[str(row["version"])] = float(value)
    return out


def version_frame(
    registry_rows: Sequence[Mapping[str, Any]], held_out: Mapping[str, float] | None = None
) -> pl.DataFrame:
    """One row per registered version: version, version_number, line, held-out score (``held_out_scores``)
    and each signal's metric (null: absent)."""
    held_out = held_out or {}
    records = []
    for row in registry_rows:
        metrics = _metrics(row)
        rec: dict[str, Any] = {
            "version": row["version"],
            "version_number": int(row["version_number"]),
            "line": row.get("agent") or SINGLE_POLICY,
            "held_out": held_out.get(str(row["version"])),
        }
        unmeasured = not_measured(_json(row.get("config")))
        for name, keys in METRIC_KEYS.items():
            value = next((float(metrics[k]) for k in keys if isinstance(metrics.get(k), int | float)), None)
            rec[name] = None if name in unmeasured else value
        records.append(rec)
    schema = {"version": pl.String, "version_number": pl.Int64, "line": pl.String, "held_out": pl.Float64}
    schema.update(dict.fromkeys(METRIC_KEYS, pl.Float64))
    return pl.DataFrame(records, schema=schema, orient="row").sort("version_number")


def rollout_rewards(transitions: pl.LazyFrame | pl.DataFrame) -> pl.DataFrame:
    """One row per (tenant, rollout, agent): its mean reward, the version that sampled it, when it was built."""
    return (
        transitions.lazy()
        .group_by("tenant", "rollout_id", "agent_name")
        .agg(
            pl.col("reward").mean(),
            pl.col("policy_version").first(),
            pl.col("created_at").max(),
        )
        .with_columns(version=pl.col("policy_version").str.split("@").list.last())
        .sort("created_at", "tenant", "rollout_id", "agent_name")
        .collect()
    )


def not_measured(config: Mapping[str, Any]) -> set[str]:
    """The metrics a round with this config records as constants, not measurements: with ``kl_coef`` 0 no
    reference model runs (KL 0); REINFORCE has no ratio to clip (ratio 1, clip fraction 0, KL 0)."""
    out: set[str] = set()
    if config.get("kl_coef") == 0:
        out.add("kl")
    if config.get("algorithm") == "reinforce":
        out.update(("kl", "ratio", "clip_frac"))
    return out


def _metrics(row: Mapping[str, Any]) -> dict[str, Any]:
    return _json(row.get("metrics"))


def _json(raw: Any) -> dict[str, Any]:
    try:
        parsed = json.loads(raw) if isinstance(raw, str) and raw else {}
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


# --- per line ----------------------------------------------------------------------------------------


def per_line(versions: pl.DataFrame, signal: Callable[[pl.DataFrame], Finding]) -> Finding:
    """``signal`` on each policy line's versions (oldest first); it fires when any line's does.

    One line: its finding as it is. Several: values prefixed ``<line>/``, descriptions joined."""
    if versions.height == 0:
        return skipped("no model versions yet")
    return combine({line: signal(sub) for (line,), sub in versions.group_by("line", maintain_order=True)})


def combine(findings: Mapping[str, Finding]) -> Finding:
    """Findings of several lines or agents as one: fired if any fired, skipped if every one was."""
    if not findings:
        return skipped("no data yet")
    if len(findings) == 1:
        return next(iter(findings.values()))
    values = {f"{name}/{k}": v for name, f in findings.items() for k, v in f.values.items()}
    fired = {n: f for n, f in findings.items() if f.fired}
    shown = fired or findings
    return Finding(
        bool(fired),
        "; ".join(f"{n}: {f.description}" for n, f in shown.items()),
        values,
        skipped=all(f.skipped for f in findings.values()),
    )


def _known(line: pl.DataFrame, column: str) -> pl.DataFrame:
    return line.filter(pl.col(column).is_not_null())


# --- signals on model_versions -------------------------------------------------------------------------


def entropy_collapse(line: pl.DataFrame, cfg: EntropyCheck) -> Finding:
    """The newest entropy below the floor, or fallen below ``drop_factor`` of the line's first versions'."""
    known = _known(line, "entropy")
    if known.height == 0:
        return skipped("no version recorded a response entropy (the trainer logged none)", floor=cfg.floor)
    entropies = known["entropy"].to_list()
    last, version = entropies[-1], known["version"][-1]
    reference = float(np.mean(entropies[: cfg.reference_versions])) if len(entropies) > cfg.reference_versions else None
    values = {
        "version": version,
        "entropy": last,
        "floor": cfg.floor,
        "reference_entropy": reference,
        "drop_factor": cfg.drop_factor,
    }
    if last < cfg.floor:
        return Finding(True, f"{version}'s entropy {last:.4g} is below the floor {cfg.floor:g}", values)
    if reference is not None and last < cfg.drop_factor * reference:
        return Finding(
            True,
            f"{version}'s entropy {last:.4g} fell below {cfg.drop_factor:g} x the first versions' {reference:.4g}",
            values,
        )
    return Finding(False, f"{version}'s entropy {last:.4g}", values)


def kl_blowup(line: pl.DataFrame, cfg: KlCheck) -> Finding:
    """The newest version's KL to the reference model above ``max_kl``."""
    known = _known(line, "kl")
    if known.height == 0:
        return skipped("no version measured a KL (with trainer.kl_coef = 0 no reference model runs)", max_kl=cfg.max_kl)
    kl, version = float(known["kl"][-1]), known["version"][-1]
    values = {"version": version, "kl": kl, "max_kl": cfg.max_kl}
    return Finding(kl > cfg.max_kl, f"{version}'s KL {kl:.4g} (at most {cfg.max_kl:g})", values)


def ratio_blowup(line: pl.DataFrame, cfg: RatioCheck) -> Finding:
    """The newest version's mean policy ratio outside [1 / max_ratio, max_ratio]."""
    known = _known(line, "ratio")
    if known.height == 0:
        return skipped("no version recorded a policy ratio", max_ratio=cfg.max_ratio)
    ratio, version = float(known["ratio"][-1]), known["version"][-1]
    low = 1 / cfg.max_ratio
    values = {"version": version, "ratio": ratio, "max_ratio": cfg.max_ratio, "min_ratio": low}
    fired = not low <= ratio <= cfg.max_ratio
    return Finding(fired, f"{version}'s policy ratio {ratio:.4g} (within [{low:.3g}, {cfg.max_ratio:g}])", values)


def clip_frac_spike(line: pl.DataFrame, cfg: ClipFracCheck) -> Finding:
    """The newest clip fraction above ``max_clip_frac``, or a spike over the previous versions' median."""
    known = _known(line, "clip_frac")
    if known.height == 0:
        return skipped("no version recorded a clip fraction", max_clip_frac=cfg.max_clip_frac)
    fracs = known["clip_frac"].to_list()
    last, version = fracs[-1], known["version"][-1]
    before = fracs[-1 - cfg.window : -1]
    median = float(np.median(before)) if before else None
    values = {
        "version": version,
        "clip_frac": last,
        "max_clip_frac": cfg.max_clip_frac,
        "previous_median": median,
        "spike_factor": cfg.spike_factor,
    }
    if last > cfg.max_clip_frac:
        return Finding(True, f"{version}'s clip fraction {last:.4g} is above {cfg.max_clip_frac:g}", values)
    if median is not None and median > 0 and last > cfg.spike_factor * median:
        return Finding(
            True,
            f"{version}'s clip fraction {last:.4g} is over {cfg.spike_factor:g} x the previous median {median:.4g}",
            values,
        )
    return Finding(False, f"{version}'s clip fraction {last:.4g}", values)


# --- signals on transitions ----------------------------------------------------------------------------


def zero_advantage(transitions: pl.LazyFrame | pl.DataFrame, cfg: ZeroAdvantageCheck) -> Finding:
    """The share of the newest policy version's rows whose advantage is 0: every rollout of their groups
    scored alike, so the round that trains on them learns nothing. The newest version is that of the
    most recently built row."""
    lf = transitions.lazy().with_columns(pl.col("policy_version").fill_null(BASE_MODEL))
    newest = lf.sort("created_at").select(pl.col("policy_version").last()).collect()
    if newest.height == 0 or newest.item() is None:
        return skipped("no transitions yet", max_fraction=cfg.max_fraction)
    version = str(newest.item())
    counts = (
        lf.filter(pl.col("policy_version") == version)
        .select(pl.len().alias("rows"), (pl.col("advantage").abs() <= ZERO).sum().alias("zero"))
        .collect()
    )
    rows, zero = int(counts["rows"][0]), int(counts["zero"][0])
    share = zero / rows
    values = {
        "policy_version": version,
        "rows": rows,
        "zero_advantage_rows": zero,
        "zero_advantage_fraction": round(share, 4),
        "max_fraction": cfg.max_fraction,
        "min_rows": cfg.min_rows,
    }
    if rows < cfg.min_rows:
        return skipped(f"{rows} rows of {version}, fewer than min_rows={cfg.min_rows}", **values)
    return Finding(
        share >= cfg.max_fraction,
        f"{zero} of {version}'s {rows} rows have advantage 0 ({share:.1%}; alarm at {cfg.max_fraction:.0%})",
        values,
    )


def ks_statistic(a: Sequence[float], b: Sequence[float]) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs (0 to 1)."""
    x, y = np.sort(np.asarray(a, dtype=float)), np.sort(np.asarray(b, dtype=float))
    if x.size == 0 or y.size == 0:
        return 0.0
    grid = np.concatenate([x, y])
    cdf_x = np.searchsorted(x, grid, side="right") / x.size
    cdf_y = np.searchsorted(y, grid, side="right") / y.size
    return float(np.max(np.abs(cdf_x - cdf_y)))


def window_shift(reference: Sequence[float], recent: Sequence[float], cfg: RewardShiftCheck) -> Finding:
    """One agent's reward shift: its ``recent`` rollouts' rewards against the ``reference`` ones."""
    ks = ks_statistic(reference, recent)
    ref_mean, new_mean = float(np.mean(reference)), float(np.mean(recent))
    pooled = float(np.sqrt((np.var(reference) + np.var(recent)) / 2))
    values = {
        "ks": round(ks, 4),
        "max_ks": cfg.max_ks,
        "reference_mean": ref_mean,
        "recent_mean": new_mean,
        "shift_in_sd": (new_mean - ref_mean) / pooled if pooled > 0 else 0.0,
        "rollouts": len(recent),
    }
    return Finding(
        ks > cfg.max_ks,
        f"mean reward {ref_mean:.3g} -> {new_mean:.3g}, KS {ks:.3f} (alarm above {cfg.max_ks:g})",
        values,
    )


def reward_shift(rollouts: pl.DataFrame, cfg: RewardShiftCheck) -> Finding:
    """Per agent (``rollout_rewards``), the newest ``window`` rollouts' rewards against the ``window`` before."""
    findings: dict[str, Finding] = {}
    for (agent,), sub in rollouts.sort("created_at", "rollout_id").group_by("agent_name", maintain_order=True):
        name = str(agent) if agent is not None else "(no agent)"
        rewards = sub["reward"].drop_nulls().to_list()
        recent, reference = rewards[-cfg.window :], rewards[-2 * cfg.window : -cfg.window]
        if len(reference) < cfg.min_rollouts:
            findings[name] = skipped(
                f"{len(rewards)} rollouts, fewer than window + min_rollouts = {cfg.window + cfg.min_rollouts}",
                rollouts=len(rewards),
            )
            continue
        findings[name] = window_shift(reference, recent, cfg)
    return combine(findings) if findings else skipped("no transitions yet")


# --- both ----------------------------------------------------------------------------------------------


def training_rewards(rollouts: pl.DataFrame) -> pl.DataFrame:
    """{version, train_reward, rollouts}: the mean reward of the rollouts each version sampled."""
    return (
        rollouts.filter(pl.col("version").is_not_null())
        .group_by("version")
        .agg(pl.col("reward").mean().alias("train_reward"), pl.len().alias("rollouts"))
    )


def reward_hacking(line: pl.DataFrame, train: pl.DataFrame, cfg: RewardHackingCheck) -> Finding:
    """Across the line's last ``versions`` versions having both scores: training reward up by more than
    ``min_train_rise`` while held-out eval went down by more than ``min_eval_drop``."""
    both = (
        line.join(train, on="version", how="inner")
        .filter(pl.col("held_out").is_not_null() & pl.col("train_reward").is_not_null())
        .sort("version_number")
        .tail(cfg.versions)
    )
    if both.height < cfg.versions:
        return skipped(
            f"{both.height} versions with both a training reward and a held-out eval, fewer than {cfg.versions}",
            versions_scored=both.height,
        )
    train_delta = float(both["train_reward"][-1] - both["train_reward"][0])
    eval_delta = float(both["held_out"][-1] - both["held_out"][0])
    first, last = both["version"][0], both["version"][-1]
    values = {
        "versions": f"{first}..{last}",
        "train_reward_first": float(both["train_reward"][0]),
        "train_reward_last": float(both["train_reward"][-1]),
        "held_out_first": float(both["held_out"][0]),
        "held_out_last": float(both["held_out"][-1]),
        "train_reward_change": round(train_delta, 4),
        "held_out_change": round(eval_delta, 4),
        "min_train_rise": cfg.min_train_rise,
        "min_eval_drop": cfg.min_eval_drop,
    }
    fired = train_delta > cfg.min_train_rise and eval_delta < -cfg.min_eval_drop
    return Finding(
        fired,
        f"{first}..{last}: training reward {train_delta:+.3f}, held-out {eval_delta:+.3f}",
        values,
    )
