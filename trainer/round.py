"""One training round, as the CLI (`agentlake train --once`) and the Dagster asset run it.

registry -> pin the transitions table's version -> pending rows (ids not in ``training_lineage``)
-> train -> checkpoint folder -> stored in the lake (``trainer.artifacts``) -> registry row (pending)
-> lineage rows -> optionally publish.

Every transition is trained on once: a round takes the rows whose ``transition_id`` no earlier
version trained on, so compaction, vacuum and group rewrites never bring old rows back. More passes
over the same data are ``epochs`` within a round, or an explicit ``version_start``
(``agentlake train --from-version N``), which takes the ids added after version N whether or not
they were trained on before. Either way the rows a version trained on go into ``training_lineage``.

Off-policy rows (``trainer.offpolicy``): a row whose policy is more than ``max_staleness`` versions
behind the version the round trains from is skipped, counted per source version in
``model_versions.metrics`` (``offpolicy``), and still recorded in ``training_lineage`` as consumed,
so it is not read again; the other stale rows are weighted by truncated importance sampling. A line's
round counts the line's own versions only, in the skip and in the recorded staleness alike.

Rows of an adapter the registry does not know (``trainer.provenance``: a recorded adapter hash that
is no registered version's) are refused the same way, before the staleness rule: not trained on,
counted in ``model_versions.metrics`` (``refused_unknown_adapter``, and per version and hash in
``refused_adapters``), and recorded as consumed.

Policy lines (``trainer.agents``, ``trainer.lines``): ``line="planner"`` makes the round one of that
agent's line: it reads only that agent's rows, continues the line's serving version, and registers
the new version in the line (``model_versions.agent``) under the line's served name. A transition
belongs to one agent, so lines never take each other's rows.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pyarrow as pa

from schemas.config import Settings
from schemas.config.serving import policy_served_name
from trainer.artifacts import MANIFEST_FILE, local_copy, store_version
from trainer.checkpoints import load_optimizer_state, save_checkpoint
from trainer.config import TrainConfig, config_from_settings
from trainer.data import TransitionData, first_day_since, read_transitions
from trainer.errors import RegistryError, TrainerError
from trainer.lineage import Lineage, recorded_credit
from trainer.offpolicy import split_stale, with_skipped
from trainer.provenance import registered_hashes, split_unverified
from trainer.registry import Registry
from trainer.tracking import NoTracker, Tracker, tracker_url

log = logging.getLogger(__name__)
CLOCK_MARGIN = dt.timedelta(days=1)  # how far an agent's clock may run ahead of the trainer's (`_consumed_since`)


@dataclass
class RoundResult:
    """What one round did; ``version`` is None when it was skipped (``reason`` says why)."""

    version: str | None
    reason: str = ""
    agent: str | None = None  # the policy line (trainer.agents); None: the single policy
    path: str | None = None
    artifact_uri: str | None = None
    parent_version: str | None = None
    n_transitions: int = 0
    version_start: int | None = None
    version_end: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    offpolicy: dict[str, dict[str, Any]] = field(default_factory=dict)  # per source version (trainer.offpolicy)
    tracking_url: str | None = None  # the round's run in the experiment tracker (model_versions.tracking_url)


def pending_transitions(cfg: TrainConfig, registry: Registry, *, line: str | None = None) -> tuple[int, int | None]:
    """(start, end): the table version the last round on this table read at (or ``cfg.version_start``;
    -1: none), and the version to read now (``cfg.version_end`` or the newest; None: no table yet)."""
    if cfg.version_start is not None:
        start = cfg.version_start
    else:
        last = registry.last_trained(registry.lake.uri(cfg.table), agent=line)
        start = last["train_version_end"] if last and last["train_version_end"] is not None else -1
    end = cfg.version_end if cfg.version_end is not None else registry.lake.version(cfg.table)
    return start, end


def read_pending(
    cfg: TrainConfig,
    start: int,
    end: int,
    *,
    lineage: Lineage | None = None,
    ids_only: bool = False,
    line: str | None = None,
) -> TransitionData:
    """The rows a round trains on at version ``end``: one reader, so the sensor counts what a round trains on.

    Without an explicit ``cfg.version_start`` that is every row matching the filters whose id is not
    in ``training_lineage``; with one, the ids absent from the snapshot at ``start``. When the line's
    last round read version V with the same filters and its lineage is written (`_settled`), the data
    files V shares with ``end`` are skipped: each of their rows was trained on (or recorded as consumed)
    then, so only the files written since V are read and anti-joined (issue 28: the pending read at
    lake scale costs the increment, not the lake).
    """
    explicit = cfg.version_start is not None
    lineage = lineage or Lineage(cfg.lake())
    uri = lineage.lake.uri(cfg.table)
    settled = None if explicit else _settled(cfg, Registry(lineage.lake), lineage, line)
    exclude = None if explicit else lineage.consumed_ids(uri, since=_consumed_since(lineage, cfg, settled, end))
    return read_transitions(
        lineage.lake,
        table=cfg.table,
        version_start=start if explicit else None,
        version_end=end,
        agent=cfg.agent,
        policy_versions=cfg.policy_versions,
        tenants=cfg.tenants,
        exclude_ids=exclude,
        ids_only=ids_only,
        settled_version=settled,
    )


def _settled(cfg: TrainConfig, registry: Registry, lineage: Lineage, line: str | None) -> int | None:
    """The table version whose matching rows are all in ``training_lineage`` already: the one the line's
    last round read, when it used these filters and its lineage rows exist (a round whose lineage write
    failed leaves its rows pending, see `_train_round`); else None (read every file)."""
    last = registry.last_trained(registry.lake.uri(cfg.table), agent=line)
    if last is None or last["train_version_end"] is None or not _same_filters(cfg, last):
        return None
    if not lineage.has_rows(last["version"]):
        return None
    return int(last["train_version_end"])


def _consumed_since(lineage: Lineage, cfg: TrainConfig, settled: int | None, end: int) -> dt.datetime | None:
    """Lineage rows consumed before this cannot match the rows read: those are in files written since
    ``settled``, whose oldest ``day`` partition bounds them, and a transition is consumed after it happened.
    A day of margin for clocks (the agent's ``start_time`` against the trainer's ``consumed_at``)."""
    if settled is None:
        return None
    day = first_day_since(lineage.lake, cfg.table, settled, end)
    if day is None:
        return None
    return dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC) - CLOCK_MARGIN


def _same_filters(cfg: TrainConfig, last: dict[str, Any]) -> bool:
    """Whether the round ``last`` (a registry row) read with ``cfg``'s filters and no explicit start."""
    before = json.loads(last["config"] or "{}")
    filters: dict[str, Any] = {"agent": None, "policy_versions": None, "tenants": []}  # absent: the default
    return before.get("version_start") is None and all(before.get(k, d) == getattr(cfg, k) for k, d in filters.items())


def _caught_up(cfg: TrainConfig, registry: Registry, end: int, line: str | None = None) -> bool:
    """Whether the line's last round on this table read version ``end`` with the same filters: then it
    took every row a round would take now, and nothing needs reading (the sensor's common case)."""
    last = registry.last_trained(registry.lake.uri(cfg.table), agent=line)
    if cfg.version_start is not None or last is None or last["train_version_end"] != end:
        return False
    return _same_filters(cfg, last)


def for_line(cfg: TrainConfig, line: str | None) -> TrainConfig:
    """``cfg`` narrowed to ``line``'s agent (its rows only); an agent filter naming another agent is an error."""
    if line is None:
        return cfg
    if cfg.agent not in (None, "", "*", line):
        raise TrainerError(f"the {line!r} policy line trains on {line!r}'s transitions only, not agent={cfg.agent!r}")
    return cfg if cfg.agent == line else cfg.replace(agent=line)


def count_pending(cfg: TrainConfig, *, line: str | None = None) -> tuple[int, int | None]:
    """(transitions the next round would train on, the table version it would read): the sensor's count."""
    cfg = for_line(cfg, line)
    lake = cfg.lake()
    registry = Registry(lake)
    start, end = pending_transitions(cfg, registry, line=line)
    if end is None or (cfg.version_start is not None and end <= start) or _caught_up(cfg, registry, end, line):
        return 0, end
    return read_pending(cfg, start, end, lineage=Lineage(lake), ids_only=True, line=line).rows.num_rows, end


def _discard_unregistered(registry: Registry, version: str, path: Path) -> None:
    """Remove a checkpoint folder that did not get registered: it would block the next round's save of
    the same version name. Kept when the registry lists this very folder after all, or cannot be read."""
    try:
        row = registry.get(version)
    except RegistryError:
        row = None
    except Exception:  # noqa: BLE001 - the registry is unreachable: keep the folder, the caller raises
        return
    manifest = path / MANIFEST_FILE
    ours = hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.exists() else None
    if row is None or row["manifest_sha256"] != ours:  # never registered, or another trainer's version
        shutil.rmtree(path, ignore_errors=True)


def train_once(
    settings: Settings | None = None,
    *,
    cfg: TrainConfig | None = None,
    force: bool = False,
    line: str | None = None,
    tracker: Tracker | None = None,
    **overrides: Any,
) -> RoundResult:
    """Train one new version on the transitions added since the last one; skip when too few.

    ``line``: the agent whose policy line this round trains (``trainer.agents``); None: the single policy.
    ``tracker`` (``trainer.tracking``) follows this round: its parameters, every step's metrics, the new
    version's name; it is closed when the round ends, whatever the outcome. None: the one ``settings.tracking``
    chooses (``trainer.trackers.tracker_for``; on rank 0 only), or none when only a ``cfg`` is given."""
    from trainer.ranks import is_main
    from trainer.train import train  # torch loads here, not at import

    if cfg is None:
        if settings is None:
            raise TrainerError("train_once needs settings or a TrainConfig")
        cfg = config_from_settings(settings, **overrides)
    elif overrides:
        cfg = cfg.replace(**overrides)
    cfg = for_line(cfg, line)
    if line is not None and cfg.finetune != "lora":
        raise TrainerError(f"policy lines (trainer.agents) are LoRA adapters over one base; {line!r} is {cfg.finetune}")
    if tracker is None and settings is not None and is_main():
        from trainer.trackers import tracker_for

        tracker = tracker_for(settings, line=line)
    tracker = NoTracker() if tracker is None else tracker
    try:
        result = _train_round(cfg, force=force, line=line, train=train, tracker=tracker)
    finally:
        tracker.close()
    result.agent = line
    return result


@dataclass
class _Job:
    """What every rank trains: the rows, the parent's folder on this machine, the version it is."""

    rows: pa.Table
    parent_path: str | None
    current: str | None


@dataclass
class _Plan:
    """Rank 0's reading of a round: the job, and what recording the new version needs."""

    job: _Job
    data: TransitionData
    start: int
    parent: dict[str, Any] | None
    skipped: dict[str, int]
    line_versions: list[str] | None
    refused: dict[str, int] = field(default_factory=dict)  # per (version, hash) pair (trainer.provenance)


def _train_round(cfg: TrainConfig, *, force: bool, line: str | None, train: Any, tracker: Tracker) -> RoundResult:
    """The round itself, for one line (``train``: ``trainer.train.train``, imported by the caller).

    In a data-parallel job (``trainer.distributed``) only rank 0 reads and writes the lake; every rank
    trains on its reading. In one process ``share`` hands the plan back as it is."""
    from trainer.ranks import is_main, share

    plan = _plan_round(cfg, force=force, line=line) if is_main() else None
    # Rank 0's decision on every rank: a skip, or the job (rank 0 fetched the parent's folder before this
    # broadcast, which is the barrier before the other ranks load it).
    # (cast: mypy solves share's T | None from a union as object)
    job = cast("_Job | RoundResult", share(plan.job if isinstance(plan, _Plan) else plan))
    if isinstance(job, RoundResult):
        return job
    if isinstance(plan, _Plan):  # rank 0 reports for the job
        tracker.log_params(_round_params(cfg, plan, line))
    optimizer_state = load_optimizer_state(job.parent_path) if job.parent_path else None  # resume: AdamW moments
    result = train(
        cfg,
        job.rows,
        parent_path=job.parent_path,
        optimizer_state=optimizer_state,
        current_version=job.current,
        tracker=tracker,
    )
    if not isinstance(plan, _Plan):  # None on the other ranks (rank 0's skip was returned above)
        return RoundResult(None, reason="a data-parallel rank other than 0: rank 0 records the version", agent=line)
    recorded = _record_round(cfg, plan, result, line=line, tracking_url=tracker_url(tracker))
    tracker.log_params({"version": recorded.version})
    return recorded


def _round_params(cfg: TrainConfig, plan: _Plan, line: str | None) -> dict[str, Any]:
    """What a tracker is told about a round before it trains: the config the registry records, and the data."""
    return {
        **cfg.recorded(),
        "line": line,
        "parent_version": plan.parent["version"] if plan.parent else None,
        "table": plan.data.table_uri,
        "table_version_start": plan.start,
        "table_version_end": plan.data.version_end,
        "n_transitions": plan.data.rows.num_rows,  # read; the trained ones are fewer when some were stale
        "n_trained": plan.job.rows.num_rows,
        "credit": _credit(cfg, plan.data.version_end),
    }


def _credit(cfg: TrainConfig, end: int) -> dict[str, Any] | None:
    """The credit settings the data was built with, as its commits record them; None when unreadable."""
    try:
        return recorded_credit(cfg.lake(), cfg.table, end)
    except Exception:  # noqa: BLE001 - a parameter for the tracker, never a reason to fail the round
        return None


def _plan_round(cfg: TrainConfig, *, force: bool, line: str | None) -> _Plan | RoundResult:
    """What the round trains on and from which parent, or why it is skipped (a ``RoundResult``)."""
    lake = cfg.lake()
    registry = Registry(lake)
    lineage = Lineage(lake)
    start, end = pending_transitions(cfg, registry, line=line)
    if end is None:
        return RoundResult(None, reason=f"no {cfg.table} table under {cfg.lake_root} yet")
    if cfg.version_start is not None and end <= start:
        return RoundResult(None, reason=f"no new {cfg.table} versions since {start}", version_start=start)

    data = read_pending(cfg, start, end, lineage=lineage, line=line)
    end = data.version_end  # pinned: every row, and the lineage, is of this version
    n = data.rows.num_rows
    if n == 0:
        return RoundResult(
            None,
            reason=f"no new transitions: every {cfg.table} row at version {end} matching the filters "
            "was trained on already",
            version_start=start,
            version_end=end,
        )
    if n < cfg.min_new_transitions and not force:
        return RoundResult(
            None,
            reason=f"{n} new transitions, fewer than min_new_transitions={cfg.min_new_transitions}",
            n_transitions=n,
            version_start=start,
            version_end=end,
        )

    # Continue the policy that generated the data: the serving version, if it is of our kind.
    parent = registry.serving(agent=line)
    if parent is not None and parent["kind"] != cfg.finetune:
        log.warning(
            "serving %s is %s, not %s: starting from the base model", parent["version"], parent["kind"], cfg.finetune
        )
        parent = None
    current = parent["version"] if parent else None  # the policy the round starts from: on-policy rows are its
    line_versions = registry.line_versions(line) if line is not None else None  # staleness counts these only
    rows, refused = split_unverified(data.rows, registered_hashes(registry.rows()))
    if refused:
        log.warning(
            "refused %d transitions sampled by adapters the registry does not know (version#hash: rows): %s",
            sum(refused.values()),
            refused,
        )
    rows, skipped = split_stale(
        rows, current_version=current, max_staleness=cfg.max_staleness, line_versions=line_versions
    )
    if skipped:
        log.warning(
            "skipped %d transitions more than %s versions behind %s: %s",
            sum(skipped.values()),
            cfg.max_staleness,
            current or "the base model",
            skipped,
        )
    if rows.num_rows == 0 or (rows.num_rows < cfg.min_new_transitions and not force):
        return RoundResult(
            None,
            reason=f"{rows.num_rows} of {n} new transitions are within max_staleness={cfg.max_staleness} "
            f"of {current or 'the base model'} (min_new_transitions={cfg.min_new_transitions})"
            + (f"; {sum(refused.values())} came from adapters the registry does not know" if refused else ""),
            n_transitions=n,
            version_start=start,
            version_end=end,
            offpolicy=with_skipped({}, skipped, current_version=current, line_versions=line_versions),
        )
    # The parent's folder on this machine: the trainer's own copy, or fetched from the lake and verified.
    parent_path = (
        str(local_copy(parent, cache_dir=cfg.checkpoint_dir, storage_options=cfg.storage_options)) if parent else None
    )
    return _Plan(_Job(rows, parent_path, current), data, start, parent, skipped, line_versions, refused)


def _record_round(
    cfg: TrainConfig, plan: _Plan, result: Any, *, line: str | None, tracking_url: str | None = None
) -> RoundResult:
    """Save, store and register the trained version, then its lineage (rank 0 alone in a data-parallel job)."""
    lake = cfg.lake()
    registry = Registry(lake)
    lineage = Lineage(lake)
    data, start, parent, current = plan.data, plan.start, plan.parent, plan.job.current
    end, n = data.version_end, data.rows.num_rows
    offpolicy = with_skipped(result.offpolicy, plan.skipped, current_version=current, line_versions=plan.line_versions)

    refused_total = sum(plan.refused.values())
    refusals = {"refused_unknown_adapter": refused_total, "refused_adapters": plan.refused}
    version, number = registry.next_version()
    credit = recorded_credit(lake, cfg.table, end)  # a variant's settings (or the pipeline's), as its commits say
    meta = {
        "version": version,
        "parent_version": parent["version"] if parent else None,
        "base_model": cfg.base_model,
        "data": {
            "table": data.table_uri,
            "version_start": start,
            "version_end": end,
            "rows": n,
            "lineage": lineage.uri,
            "credit": credit,
        },
        "metrics": result.summary,
        "history": result.history,
    }
    path = save_checkpoint(
        Path(cfg.checkpoint_dir) / version,
        model=result.model,
        tokenizer=result.tokenizer,
        cfg=cfg,
        meta=meta,
        optimizer=result.optimizer,
    )
    try:
        stored = store_version(path, lake_root=cfg.lake_root, version=version, storage_options=cfg.storage_options)
        registry.add(
            version=version,
            version_number=number,
            parent_version=meta["parent_version"],
            base_model=cfg.base_model,
            kind=cfg.finetune,
            path=str(path),
            served_name=policy_served_name(cfg.served_name, line),
            train_table=data.table_uri,
            train_version_start=start,
            train_version_end=end,
            n_transitions=n,
            config={**cfg.recorded(), "credit": credit},
            metrics={**result.summary, **stored.metrics(), "offpolicy": offpolicy, **refusals},
            artifact_uri=stored.uri,
            manifest_sha256=stored.manifest_sha256,
            agent=line,
            tracking_url=tracking_url,
        )
    except Exception:
        _discard_unregistered(registry, version, path)
        raise
    # After the registry row (which claims the version name atomically), so a lost race writes no lineage.
    try:
        lineage.record(model_version=version, train_table=data.table_uri, table_version=end, rows=data.rows)
    except Exception as exc:
        raise TrainerError(
            f"{version} is registered but its training lineage was not written ({exc}); "
            f"its {n} transitions count as not trained on and the next round takes them again"
        ) from exc
    log.info(
        "trained %s%s on %d transitions (%s at version %d) -> %s",
        version,
        f" ({line}'s line)" if line else "",
        n,
        cfg.table,
        end,
        path,
    )
    return RoundResult(
        version,
        path=str(path),
        artifact_uri=stored.uri,
        parent_version=meta["parent_version"],
        n_transitions=n,
        version_start=start,
        version_end=end,
        metrics={**result.summary, "refused_unknown_adapter": float(refused_total)},
        history=result.history,
        offpolicy=offpolicy,
        tracking_url=tracking_url,
    )
