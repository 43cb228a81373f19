"""Transitions in, token batches out.

Which rows a round reads is decided by ``transition_id`` (``rollout/attempt/step``), never by data
files: compaction, vacuum and the pipeline's group rewrites (an overwrite with a predicate rewrites
untouched rows into new files) change files, not identities. The table is read at one pinned Delta
version; a normal round takes the rows whose id is not in ``exclude_ids`` (the ids already trained
on, from ``trainer.lineage``), and an explicit ``version_start`` takes the ids that are in the
snapshot at ``version_end`` but not in the one at ``version_start``. One row per id is kept.
A policy trains on the tenants its settings name (``tenants``; none named: every tenant), and a
transition id names its tenant (``pipelines/keys.py``), so one tenant's rows never stand in for,
or shadow, another's.

Batches are target-aligned: position ``t`` of every ``(B, T-1)`` tensor is about predicting
``input_ids[:, t+1]`` from the logits at ``t``. Only response tokens with ``loss_mask == 1``
are trained; prompt tokens, observation tokens and padding are masked out.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import torch

from schemas.agent_filter import agent_mask, keeps_every_agent
from schemas.lake import Lake
from trainer.errors import TrainerError

log = logging.getLogger(__name__)

COLUMNS = (
    "transition_id",
    "rollout_id",
    "tenant",
    "agent_name",
    "policy_version",
    "prompt_ids",
    "response_ids",
    "response_logprobs",
    "loss_mask",
    "reward",
    "return",
    "advantage",
    "policy_sha256",  # transitions v4 (trainer.provenance); read as null from older tables
)
KEY_COLUMNS = ("transition_id", "tenant", "agent_name", "policy_version")  # enough to decide what is pending


@dataclass
class TransitionData:
    """The rows of one training run and where they came from (for the registry's lineage)."""

    rows: pa.Table
    table_uri: str  # normalized (schemas.uris)
    version_start: int  # -1: no lower bound; else ids present at this version were left out
    version_end: int  # the pinned version every row was read at


def _filter_keys(
    keys: pa.Table,
    *,
    agent: str | None,
    policy_versions: Sequence[str] | None,
    exclude_ids: pa.Array | pa.ChunkedArray | None,
    tenants: Sequence[str] | None = None,
) -> pa.Table:
    if tenants and keys.num_rows:
        keys = keys.filter(pc.is_in(keys["tenant"], pa.array(list(tenants), pa.string())))
    if not keeps_every_agent(agent) and keys.num_rows:
        keys = keys.filter(agent_mask(agent, keys["agent_name"]))
    if policy_versions is not None and keys.num_rows:
        keys = keys.filter(pc.is_in(keys["policy_version"], pa.array(list(policy_versions), pa.string())))
    if exclude_ids is not None and len(exclude_ids) and keys.num_rows:
        if isinstance(exclude_ids, pa.ChunkedArray):
            exclude_ids = exclude_ids.combine_chunks()
        keys = keys.filter(pc.invert(pc.is_in(keys["transition_id"], value_set=exclude_ids)))
    return keys


def _files_since(dataset: pds.FileSystemDataset, settled: Any) -> pds.FileSystemDataset:
    """``dataset`` without the data files it shares with the Delta snapshot ``settled``: a file's rows
    never change, so those files hold only rows ``settled`` held. Paths are compared from the logs."""
    if settled is None:
        return dataset
    old = {u.rsplit("/", 1)[-1] for u in settled.file_uris()}
    fragments = [f for f in dataset.get_fragments() if f.path.rsplit("/", 1)[-1] not in old]
    return pds.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem)


def first_day_since(lake: Lake, table: str, settled: int, end: int) -> dt.date | None:
    """The oldest ``day`` partition among the data files of ``table`` at ``end`` that ``settled`` lacks,
    from the Delta log's add actions (no data read); None when there are none."""
    old = lake.table(table, version=settled)
    now = lake.table(table, version=end)
    if old is None or now is None:
        return None
    adds = pa.table(now.get_add_actions(flatten=True))
    if "partition.day" not in adds.column_names:
        return None
    seen = {u.rsplit("/", 1)[-1] for u in old.file_uris()}
    fresh = adds.filter(pa.array([p.rsplit("/", 1)[-1] not in seen for p in adds["path"].to_pylist()]))
    day = pc.min(fresh["partition.day"]).as_py() if fresh.num_rows else None
    return day if isinstance(day, dt.date) else None


def _one_per_id(rows: pa.Table) -> pa.Table:
    """The first row of each ``transition_id`` (a duplicated write must not train twice)."""
    if pc.count_distinct(rows["transition_id"]).as_py() == rows.num_rows:
        return rows
    indexed = rows.append_column("_row", pa.array(range(rows.num_rows), pa.int64()))
    first = indexed.group_by("transition_id", use_threads=False).aggregate([("_row", "min")])
    return rows.take(first["_row_min"])


def read_transitions(
    lake: Lake,
    *,
    table: str = "transitions",
    version_start: int | None = None,
    version_end: int | None = None,
    agent: str | None = None,
    policy_versions: Sequence[str] | None = None,
    exclude_ids: pa.Array | pa.ChunkedArray | None = None,
    ids_only: bool = False,
    tenants: Sequence[str] | None = None,
    settled_version: int | None = None,
) -> TransitionData:
    """The transitions at version ``version_end`` (default: the newest) that a round would train on.

    Rows are kept when their tenant is in ``tenants`` (empty or None: any tenant), their agent
    matches the ``agent`` glob, their policy version is in ``policy_versions``, their id is not in
    ``exclude_ids`` and, with ``version_start``, their id is absent from the snapshot at
    ``version_start``. ``ids_only`` returns just ``transition_id`` (the sensor's count, without
    reading token columns). ``settled_version``: a version whose every row matching these filters is
    known to be excluded (a round with the same filters trained on it); the data files it shares with
    ``version_end`` are not read, so the read costs what was written since, not the whole table.
    """
    uri = lake.uri(table)
    end = lake.table(table, version=version_end)
    if end is None:
        raise TrainerError(f"no {table} table at {uri}; run the pipeline first (or check lake.root)")
    start_version = -1 if version_start is None else version_start
    dataset = end.to_pyarrow_dataset()
    if settled_version is not None and 0 <= settled_version < end.version():
        dataset = _files_since(dataset, lake.table(table, version=settled_version))
    keys = _filter_keys(
        dataset.to_table(columns=list(KEY_COLUMNS)),
        agent=agent,
        policy_versions=policy_versions,
        exclude_ids=exclude_ids,
        tenants=tenants,
    )
    before = lake.table(table, version=start_version) if start_version >= 0 and keys.num_rows else None
    if before is not None:
        seen = pc.unique(before.to_pyarrow_dataset().to_table(columns=["transition_id"])["transition_id"])
        keys = keys.filter(pc.invert(pc.is_in(keys["transition_id"], value_set=seen)))
    wanted = pc.unique(keys["transition_id"])
    if ids_only:
        rows = pa.table({"transition_id": wanted.sort()})
    else:
        have = set(dataset.schema.names)
        wanted_rows = pds.field("transition_id").isin(wanted)
        rows = dataset.to_table(columns=[c for c in COLUMNS if c in have], filter=wanted_rows)
        if "policy_sha256" not in have:  # a table from before transitions v4: no row carries a hash
            rows = rows.append_column("policy_sha256", pa.nulls(rows.num_rows, pa.string()))
        rows = _filter_keys(rows, agent=agent, policy_versions=policy_versions, exclude_ids=None, tenants=tenants)
        rows = _one_per_id(rows).sort_by("transition_id")  # file order is not stable; the seed should be enough
    return TransitionData(rows=rows, table_uri=uri, version_start=start_version, version_end=end.version())


@dataclass
class Example:
    """One transition as token lists, truncated to fit ``max_seq_len``."""

    input_ids: list[int]  # prompt + response
    n_prompt: int
    loss_mask: list[int]  # per response token
    old_logprobs: list[float] | None  # per response token; None when the row has none
    advantage: float
    ret: float
    policy_version: str | None = None  # the policy that sampled it (trainer.offpolicy)
    prox_logprobs: list[float] | None = None  # per response token, the round's starting policy; None: on-policy


def to_examples(rows: pa.Table, *, max_seq_len: int) -> list[Example]:
    """Turn table rows into examples; rows with nothing to train on are skipped and counted."""
    out: list[Example] = []
    skipped = truncated = 0
    for r in rows.to_pylist():
        prompt, resp, mask = r["prompt_ids"] or [], r["response_ids"] or [], r["loss_mask"] or []
        lps = r["response_logprobs"]
        if not prompt or not resp or len(mask) != len(resp) or not any(mask):
            skipped += 1
            continue
        if lps is not None and (len(lps) != len(resp) or any(x is None or math.isnan(x) for x in lps)):
            lps = None  # unusable behaviour logprobs: train on-policy for this row (ratio 1)
        if len(prompt) + len(resp) > max_seq_len:
            truncated += 1
            resp, mask = resp[: max_seq_len - 1], mask[: max_seq_len - 1]
            lps = lps[: max_seq_len - 1] if lps is not None else None
            prompt = prompt[-(max_seq_len - len(resp)) :]  # keep the prompt's end, nearest the response
            if not any(mask):
                skipped += 1
                continue
        out.append(
            Example(
                input_ids=list(prompt) + list(resp),
                n_prompt=len(prompt),
                loss_mask=[int(m) for m in mask],
                old_logprobs=list(lps) if lps is not None else None,
                advantage=float(r["advantage"]),
                ret=float(r["return"]),
                policy_version=r.get("policy_version"),
            )
        )
    if skipped or truncated:
        log.warning(
            "transitions: %d skipped (nothing to train on), %d truncated to %d", skipped, truncated, max_seq_len
        )
    return out


@dataclass
class Batch:
    """One micro-batch. Token tensors are (B, T); target tensors are (B, T-1)."""

    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor | None  # (B, T) long; None when packed (position_ids say where rows split)
    position_ids: torch.Tensor  # (B, T) long, restarting at 0 for each packed sequence
    mask: torch.Tensor  # (B, T-1) float: 1 where the target token is trained
    old_logprobs: torch.Tensor  # (B, T-1) float: behaviour logprobs, NaN where unknown
    prox_logprobs: torch.Tensor  # (B, T-1) float: the round's starting policy on stale rows, NaN elsewhere
    advantages: torch.Tensor  # (B, T-1) float: the sequence's advantage on each of its tokens
    returns: torch.Tensor  # (B, T-1) float
    seq_index: torch.Tensor  # (B, T-1) long: which example a target belongs to, -1 for none
    n_seqs: int
    n_tokens: int  # real (non-pad) tokens, for tokens/s

    def to(self, device: torch.device | str) -> Batch:
        moved: dict[str, Any] = {  # tensors moved, counts as they are
            k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in vars(self).items()
        }
        return Batch(**moved)


def collate(examples: Sequence[Example], *, pad_id: int = 0, pack: bool = False, max_seq_len: int = 1024) -> Batch:
    """Pad examples into rows (one example per row), or pack several into rows of ``max_seq_len``."""
    rows: list[list[int]] = []  # indices of the examples in each row
    if pack:
        length = 0
        for i, ex in enumerate(examples):
            if not rows or length + len(ex.input_ids) > max_seq_len:
                rows.append([])
                length = 0
            rows[-1].append(i)
            length += len(ex.input_ids)
    else:
        rows = [[i] for i in range(len(examples))]
    T = max(sum(len(examples[i].input_ids) for i in row) for row in rows)
    B = len(rows)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    pos = torch.zeros((B, T), dtype=torch.long)
    tok_mask = torch.zeros((B, T))  # in token space; shifted to target space at the end
    old = torch.full((B, T), float("nan"))
    prox = torch.full((B, T), float("nan"))
    adv = torch.zeros((B, T))
    ret = torch.zeros((B, T))
    seq = torch.full((B, T), -1, dtype=torch.long)
    for b, row in enumerate(rows):
        at = 0
        for i in row:
            ex = examples[i]
            n, p = len(ex.input_ids), ex.n_prompt
            input_ids[b, at : at + n] = torch.tensor(ex.input_ids)
            attn[b, at : at + n] = 1
            pos[b, at : at + n] = torch.arange(n)
            tok_mask[b, at + p : at + n] = torch.tensor(ex.loss_mask, dtype=torch.float)
            if ex.old_logprobs is not None:
                old[b, at + p : at + n] = torch.tensor(ex.old_logprobs)
            if ex.prox_logprobs is not None:
                prox[b, at + p : at + n] = torch.tensor(ex.prox_logprobs)
            adv[b, at + p : at + n] = ex.advantage
            ret[b, at + p : at + n] = ex.ret
            seq[b, at + p : at + n] = i
            at += n
        if pack and at < T:
            pos[b, at:] = torch.arange(T - at)  # padding continues as its own "sequence"
    seq = torch.where(tok_mask > 0, seq, -1)
    return Batch(
        input_ids=input_ids,
        attention_mask=None if pack else attn,
        position_ids=pos,
        mask=tok_mask[:, 1:],
        old_logprobs=old[:, 1:],
        prox_logprobs=prox[:, 1:],
        advantages=adv[:, 1:],
        returns=ret[:, 1:],
        seq_index=seq[:, 1:],
        n_seqs=len(examples),
        n_tokens=int(attn.sum()),
    )


def epoch_chunks(examples: Sequence[Example], *, batch_size: int, seed: int, epoch: int = 0) -> Iterator[list[Example]]:
    """The examples of each micro-batch of ``epoch``, shuffled by ``seed``: every rank of a data-parallel
    run draws the same chunks in the same order, and trains its own share of each (``trainer.train``)."""
    order = list(range(len(examples)))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    for i in range(0, len(order), batch_size):
        yield [examples[j] for j in order[i : i + batch_size]]


def iter_batches(
    examples: Sequence[Example],
    *,
    batch_size: int,
    seed: int,
    epoch: int = 0,
    pad_id: int = 0,
    pack: bool = False,
    max_seq_len: int = 1024,
) -> Iterator[Batch]:
    """Shuffle (seeded per epoch) and yield micro-batches of ``batch_size`` examples."""
    for chunk in epoch_chunks(examples, batch_size=batch_size, seed=seed, epoch=epoch):
        yield collate(chunk, pad_id=pad_id, pack=pack, max_seq_len=max_seq_len)
