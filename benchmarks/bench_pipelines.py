"""Pipelines benchmark: Kafka -> `spans` (spans/s) and `spans` -> `transitions` (rollouts/s).

Each phase runs in a fresh child process (from a forkserver started before the benchmark's own work,
as Dagster's executor runs each step in a fresh process), so its peak RSS and its time are its own.
Next to each rate it prints a ceiling measured in the same run: the same rows written straight to
Parquet with pyarrow. The rollouts are produced once; each of ``--runs`` rounds ingests them into a
fresh lake and builds transitions there, and the table shows the median of the rounds (min and max below it), since
the machine is shared and single runs swing.

    .venv/bin/python benchmarks/bench_pipelines.py --rollouts 10000 --runs 5

Then the topic grows to ``--grow`` times as many rollouts and one more round runs on all of
them (a backlog of that size in one run: ingestion and the gold steps work in bounded batches and
chunks), and one more in the steady state: the last ``--rollouts`` arrive on a lake that already
holds the others, so its peak memory shows what the table's size costs a run. The produced rollouts
start ``--per-day`` a day, so a grown lake spans days as production's does. The steady rounds alternate
with rounds of the same increment into an empty lake, from a topic of its own on the same broker: the
steady/empty ratios compare rounds of the same broker and the same minutes of the machine.

``BROKER_LOG=<file>`` keeps the local broker's output there (by default it is discarded).

``--lake-rollouts 100000,1000000``: the same increment once more onto lakes of those sizes, built
straight to Delta (`benchmarks/lake_builder.py`), and on the largest the README's DuckDB queries and
``agentlake forget`` of one rollout (docs/benchmarks.md, "An increment on a big lake").

``--peer``: then Agent Lightning 0.3.0's own adapter on the steady increment's rollouts (the first
round's without ``--grow``), in the benchmark's own venv (``benchmarks/peer_agentlightning.py``), its
rollouts/s printed next to ours with the ratio.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import os
import queue
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import polars as pl  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from benchmarks.lake_builder import build_lake  # noqa: E402
from pipelines.bronze.ingest import ingest  # noqa: E402
from pipelines.gold.transitions_step import update_transitions  # noqa: E402
from pipelines.silver.trajectories_step import update_trajectories  # noqa: E402
from schemas.config import CreditSettings, KafkaSettings  # noqa: E402
from schemas.lake import Lake  # noqa: E402

DAY_NS = 86_400 * 10**9

if TYPE_CHECKING:
    from agentlake.stack.broker import LocalBroker


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _child(fn: Callable[[], dict[str, Any]], q: Any) -> None:
    start = _rss_mb()  # what the process starts from (the preloaded imports): the work's own memory is above it
    try:
        out = fn()
    except BaseException:
        q.put({"error": traceback.format_exc()})  # the parent raises it: a failed phase never leaves it waiting
        raise
    out["start_rss_mb"] = start
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # ingest's decoder processes are the child's own children: their largest peak, reported apart
    out["children_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    q.put(out)


# what each phase imports, loaded once by the forkserver rather than by every child
PRELOAD = [
    "benchmarks.lake_builder",
    "pipelines.bronze.ingest",
    "pipelines.gold.transitions_step",
    "pipelines.silver.trajectories_step",
    "pipelines.lake.forget",
    "pipelines.lake.query",
]


def in_child(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``fn`` (a module-level function, or a partial of one) in a fresh process; return its result plus
    its own peak RSS.

    The process comes from a forkserver, not a fork of this one: by the steady round this process holds
    the producer's leftovers and the peer's rollouts (its RSS grew from ~120 to ~440 MB in a ``--grow 30``
    run), which a forked child inherits as resident memory and whose objects its garbage collector walks,
    so the later rounds' children started heavier than the first's. The forkserver starts on the first call,
    with ``PRELOAD`` imported, and every child starts from that same state."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # no effect once the server runs
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(fn, q))
    p.start()
    while True:
        try:
            out = q.get(timeout=1.0)
            break
        except queue.Empty:
            if not p.is_alive() and q.empty():
                raise RuntimeError(f"a benchmark phase's process died (exit code {p.exitcode})") from None
    p.join()
    if "error" in out:
        raise RuntimeError(f"a benchmark phase failed in its process:\n{out['error']}")
    return out


def produce_rollouts(
    kafka: KafkaSettings,
    n: int,
    calls: int,
    prompt_len: int,
    response_len: int,
    *,
    first: int = 0,
    split: bool = False,
    keep: list[dict[str, Any]] | None = None,
    keep_from: int = 0,
    per_day: int = 0,
) -> int:
    """Spans through the real OTel SDK, encoded as the collector does, produced with kafka-python.

    ``per_day``: rollout number i starts on day i // per_day (0: every rollout on the same day).

    ``split``: as the OTel ``BatchSpanProcessor`` sends a long rollout: its id on the root span
    only, the children in two earlier records (keyed by trace id) and the root last.
    ``keep``: append each rollout from number ``keep_from`` on (ids, token ids, reward) for the peer.
    """
    from kafka import KafkaProducer

    from tests.pipelines.otel import Call, Rollout, make_spans, span_record

    rng = random.Random(first)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, linger_ms=20, batch_size=1 << 20)
    n_spans = 0
    for i in range(first, first + n):
        cs = []
        prompt = [rng.randrange(49152) for _ in range(prompt_len)]
        for _ in range(calls):
            resp = [rng.randrange(49152) for _ in range(response_len)]
            cs.append(Call(prompt=list(prompt), response=resp, logprobs=[-0.5] * response_len))
            prompt = prompt + resp + [rng.randrange(49152) for _ in range(8)]
        r = Rollout(
            f"roll-{i}",
            task_id=f"task-{i // 8}",
            calls=cs,
            final_reward=float(rng.random() < 0.5),
            ids_on_root_only=split,
        )
        if per_day > 0:
            r.t0_ns += (i // per_day) * DAY_NS
        if keep is not None and i >= keep_from:
            keep.append(
                {
                    "rollout_id": r.rollout_id,
                    "calls": [{"prompt": c.prompt, "response": c.response} for c in cs],
                    "final_reward": r.final_reward,
                }
            )
        spans = make_spans(r)
        n_spans += len(spans)
        pieces = [spans[:-1][0::2], spans[:-1][1::2], spans[-1:]] if split else [spans]
        for piece in pieces:
            rec = span_record(piece)
            producer.send(kafka.spans_topic, key=rec["key"], value=rec["value"], headers=rec["headers"])
    producer.flush(900)  # a loaded machine drains a long backlog slowly
    producer.close()
    return n_spans


def bench_topics(prefix: str, partitions: int | None = None) -> tuple[KafkaSettings, LocalBroker | None]:
    """Fresh span and reward topics named ``<prefix>.spans.<time>``, on $KAFKA_BOOTSTRAP_SERVERS or else on
    a local broker started here (returned, for the caller to stop)."""
    from agentlake.stack.broker import LocalBroker, ensure_topics

    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if not bootstrap:
        log = os.environ.get("BROKER_LOG")
        broker = LocalBroker(log_path=Path(log) if log else None).start()
        bootstrap = broker.bootstrap
    suffix = str(int(time.time()))
    extra = {} if partitions is None else {"partitions": partitions}
    kafka = KafkaSettings(
        bootstrap_servers=bootstrap,
        spans_topic=f"{prefix}.spans.{suffix}",
        rewards_topic=f"{prefix}.rewards.{suffix}",
        **extra,
    )
    ensure_topics(kafka, bootstrap, [kafka.spans_topic, kafka.rewards_topic])
    return kafka, broker


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=10_000)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--response-len", type=int, default=16)
    ap.add_argument("--batch-records", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3, help="rounds of ingest + transitions; medians are shown")
    ap.add_argument("--workers", type=int, default=None, help="decoder processes (default: ingest's own)")
    ap.add_argument("--split", action="store_true", help="each trace in three records, its rollout id on the root only")
    ap.add_argument(
        "--grow",
        type=int,
        default=4,
        help="then grow the topic to this many times --rollouts and run once more: memory must not follow (1: skip)",
    )
    ap.add_argument(
        "--straddle",
        action="store_true",
        help="fill the --grow steady lake with the topic's first batches instead of the rollouts before the "
        "increment's: the partitions are read unevenly, so the increment's rollouts are spread over the last "
        "few thousand and join groups (tasks) the lake holds already, whose transitions are rebuilt",
    )
    ap.add_argument(
        "--lake-rollouts",
        default="",
        help="comma-separated lake sizes (e.g. 100000,1000000): time one increment of --rollouts on a lake of "
        "each size, built straight to Delta from copies of the first round's lake (benchmarks/lake_builder.py)",
    )
    ap.add_argument(
        "--per-day",
        type=int,
        default=30_000,
        help="rollouts a day, in the built lakes and in the produced topic (0: every produced rollout on one "
        "day, so a --grow lake holds all of them in one day partition)",
    )
    ap.add_argument(
        "--peer",
        action="store_true",
        help="then run Agent Lightning 0.3.0's adapter on the last increment's rollouts in benchmarks/.venv-peer "
        "(made if missing; benchmarks/peer_agentlightning.py) and print its rollouts/s next to ours",
    )
    args = ap.parse_args()

    kafka, broker = bench_topics("bench")
    root = tempfile.mkdtemp(prefix="agentlake-bench-")
    rounds: list[dict[str, Any]] = []
    grown: dict[str, Any] | None = None
    sized: list[tuple[int, dict[str, Any]]] = []
    steady: dict[str, Any] | None = None
    paired: dict[str, Any] | None = None
    peer: dict[str, Any] | None = None
    kept: list[dict[str, Any]] | None = [] if args.peer else None
    try:
        t0 = time.perf_counter()
        n_spans = produce_rollouts(
            kafka,
            args.rollouts,
            args.calls,
            args.prompt_len,
            args.response_len,
            split=args.split,
            keep=kept if args.grow <= 1 else None,
            per_day=args.per_day,
        )
        print(f"produced {args.rollouts} rollouts, {n_spans} spans in {time.perf_counter() - t0:.1f}s", flush=True)
        for i in range(args.runs):
            r = one_round(kafka, Lake(os.path.join(root, f"lake{i}")), os.path.join(root, f"round{i}"), args)
            print(
                f"round {i + 1}: {r['spans_s']:,.0f} spans/s (ceiling {r['spans_ceil']:,.0f}), "
                f"{r['roll_s']:,.0f} rollouts/s (ceiling {r['roll_ceil']:,.0f})",
                flush=True,
            )
            rounds.append(r)
        for size in [int(x) for x in args.lake_rollouts.split(",") if x.strip()]:
            big = Lake(os.path.join(root, f"big{size}"))
            template = Lake(os.path.join(root, "lake0"))
            built = in_child(functools.partial(build_lake, template, big, size, per_day=args.per_day))
            print(f"built a lake of {built['rollouts']:,} rollouts in {built['seconds']:.0f}s", flush=True)
            r = one_round(kafka, big, os.path.join(root, f"big{size}-scratch"), args, ceilings=False)
            r["disk_mb"] = _du_mb(big.root)
            print(
                f"on {built['rollouts']:,}: ingest {r['ingest_s']:.2f}s, trajectories {r['traj_s']:.2f}s, "
                f"transitions {r['trans_s']:.2f}s",
                flush=True,
            )
            if size == max(int(x) for x in args.lake_rollouts.split(",") if x.strip()):
                r["scans"] = in_child(functools.partial(lake_scans, big))
            sized.append((built["rollouts"], r))
            shutil.rmtree(big.root, ignore_errors=True)
        if args.grow > 1:
            more = (args.grow - 1) * args.rollouts
            produce = functools.partial(
                produce_rollouts,
                kafka=kafka,
                calls=args.calls,
                prompt_len=args.prompt_len,
                response_len=args.response_len,
                split=args.split,
                keep=kept,
                keep_from=more,  # the steady increment: the last --rollouts
                per_day=args.per_day,
            )
            base = Lake(os.path.join(root, "steady"))
            if args.straddle:  # the fill stops after a number of batches, wherever each partition is then
                produce(n=more, first=args.rollouts)
                records_before = more * (3 if args.split else 1)
                in_child(functools.partial(_fill, base, kafka, -(-records_before // args.batch_records), args))
            else:  # the steady lake holds every rollout before the increment's: its rollouts join no group in it
                produce(n=more - args.rollouts, first=args.rollouts)
                in_child(functools.partial(_fill, base, kafka, None, args))
                produce(n=args.rollouts, first=more)
            # the same increment alone in a topic of its own on the same broker: its empty-lake rounds run
            # between the steady ones, so both sides see the same broker and the same hour of the machine
            alone = same_broker_topics(kafka, "alone")
            produce(n=args.rollouts, first=more, keep=None, kafka=alone)
            grown = one_round(kafka, Lake(os.path.join(root, "grown")), os.path.join(root, "grown-scratch"), args)
            # the steady state: the last --rollouts arrive on a lake that already holds the rest; --runs times,
            # each on a copy of the filled lake (hard links: Delta never rewrites a file in place)
            steady_rounds, alone_rounds = [], []
            for i in range(args.runs):
                fresh = Lake(os.path.join(root, f"alone{i}"))
                alone_rounds.append(one_round(alone, fresh, os.path.join(root, f"alone{i}-scratch"), args))
                shutil.rmtree(fresh.root, ignore_errors=True)
                copy = os.path.join(root, f"steady{i}")
                shutil.copytree(base.root, copy, copy_function=os.link)
                steady_rounds.append(one_round(kafka, Lake(copy), os.path.join(root, f"steady{i}-scratch"), args))
                shutil.rmtree(copy, ignore_errors=True)
            steady, paired = median_round(steady_rounds), median_round(alone_rounds)
        if kept:
            peer = run_peer_on(kept, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if broker is not None:
            broker.stop()

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    def spread(key: str) -> str:
        return f"{min(r[key] for r in rounds):,.0f}..{max(r[key] for r in rounds):,.0f}"

    spans_s, ceil_s, roll_s, roll_ceil = med("spans_s"), med("spans_ceil"), med("roll_s"), med("roll_ceil")
    print()
    print(f"median of {len(rounds)} rounds; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end")
    print(f"{'measure':<34}{'pipeline':>14}{'pyarrow->parquet':>18}{'ratio':>8}{'peak RSS MB':>13}")
    print(
        f"{'spans/s, Kafka -> spans':<34}{spans_s:>14,.0f}{ceil_s:>18,.0f}{spans_s / ceil_s:>8.2f}"
        f"{med('ingest_rss_mb'):>13.0f}"
    )
    print(
        f"{'rollouts/s, spans -> transitions':<34}{roll_s:>14,.0f}{roll_ceil:>18,.0f}{roll_s / roll_ceil:>8.2f}"
        f"{med('gold_rss_mb'):>13.0f}"
    )
    print(f"{'  min..max spans/s':<34}{spread('spans_s'):>14}{spread('spans_ceil'):>18}")
    print(f"{'  min..max rollouts/s':<34}{spread('roll_s'):>14}{spread('roll_ceil'):>18}")
    print()
    last = rounds[-1]
    decoders = med("decoder_rss_mb")
    where = f"decoder processes peaked at {decoders:.0f} MB RSS each" if decoders else "decoded in process"
    print(
        f"ingest: {last['rows']} spans in {med('ingest_s'):.2f}s (median), {last['commits']} commits "
        f"(batch {args.batch_records} records), {where}; targets: 50,000 spans/s, 2,000 rollouts/s"
    )
    print(
        f"gold: {last['rollouts']} rollouts -> {last['transitions']} transitions; trajectories "
        f"{med('traj_s'):.2f}s, transitions {med('trans_s'):.2f}s (medians)"
    )
    if sized:
        print()
        print(f"one increment of {last['rollouts']:,} rollouts onto a lake of N rollouts (built straight to Delta)")
        print(
            f"{'N':>10}{'ingest s':>10}{'traj s':>9}{'trans s':>9}{'x empty':>9}"
            f"{'ingest MB':>11}{'gold MB':>9}{'x empty':>9}{'lake MB':>9}"
        )
        base_s = last["ingest_s"] + last["traj_s"] + last["trans_s"]
        base_mb = max(last["ingest_rss_mb"], last["gold_rss_mb"])
        for n, r in [(0, last), *sized]:
            total = r["ingest_s"] + r["traj_s"] + r["trans_s"]
            mb = max(r["ingest_rss_mb"], r["gold_rss_mb"])
            print(
                f"{n:>10,}{r['ingest_s']:>10.2f}{r['traj_s']:>9.2f}{r['trans_s']:>9.2f}{total / base_s:>9.2f}"
                f"{r['ingest_rss_mb']:>11.0f}{r['gold_rss_mb']:>9.0f}{mb / base_mb:>9.2f}{r.get('disk_mb', 0):>9.0f}"
            )
        for n, r in sized:
            for label, secs in r.get("scans", {}).items():
                if label not in ("start_rss_mb", "peak_rss_mb", "children_rss_mb"):
                    print(f"  on {n:,}: {label}: {secs:.2f}s")
    if grown is not None:
        print()
        print("memory against table size (peak RSS MB, and how far it rose above the process's start)")
        print(f"{'rollouts':<24}{'ingest':>16}{'gold':>16}{'spans/s':>12}{'rollouts/s':>12}")
        empty = median_round(rounds)
        rows = [(f"{empty['rollouts']:,.0f} new", empty), (f"{grown['rollouts']:,.0f} new", grown)]
        if steady is not None and paired is not None:
            rows.append((f"{paired['rollouts']:,.0f} new, between", paired))
            rows.append((f"{steady['rollouts']:,.0f} new on {grown['rollouts'] - steady['rollouts']:,.0f}", steady))
        for label, r in rows:
            print(
                f"{label:<24}{r['ingest_rss_mb']:>9.0f} (+{r['ingest_work_mb']:.0f}){r['gold_rss_mb']:>9.0f} "
                f"(+{r['gold_work_mb']:.0f}){r['spans_s']:>12,.0f}{r['roll_s']:>12,.0f}"
            )
        print(
            f"(medians of {args.runs} rounds each but the backlog's; 'between': the steady increment into an empty "
            "lake from a topic of its own on the same broker, each round just before a steady one)"
        )
        if steady is not None and not steady["rollouts"]:
            print(
                "the steady round found no new rollouts: the --straddle fill read the whole topic "
                "(lower --batch-records)"
            )
        elif steady is not None and paired is not None:
            print(f"steady / empty (target <= 1.2x), against the rounds between: {ratios(paired, steady)}")
            print(f"steady / empty, against the first rounds (an emptier broker, earlier): {ratios(empty, steady)}")
    if peer is not None:
        if steady is not None and grown is not None:
            on = grown["rollouts"] - steady["rollouts"]
            print_peer(steady, f"{steady['rollouts']:,.0f} new on a lake of {on:,.0f}", peer)
        else:
            print_peer(rounds[-1], f"the last round, {last['rollouts']:,} onto an empty lake", peer)


def same_broker_topics(kafka: KafkaSettings, name: str) -> KafkaSettings:
    """Fresh span and reward topics beside ``kafka``'s, on the same broker."""
    from agentlake.stack.broker import ensure_topics

    other = kafka.model_copy(
        update={"spans_topic": f"{kafka.spans_topic}.{name}", "rewards_topic": f"{kafka.rewards_topic}.{name}"}
    )
    ensure_topics(other, other.bootstrap_servers, [other.spans_topic, other.rewards_topic])
    return other


def ratios(empty: dict[str, Any], steady: dict[str, Any]) -> str:
    """The steady round's time and peak RSS over the empty lake's, for the gold steps and ingestion."""
    return (
        f"gold time {empty['roll_s'] / steady['roll_s']:.2f}x, "
        f"gold peak RSS {steady['gold_rss_mb'] / empty['gold_rss_mb']:.2f}x; "
        f"ingest time {empty['spans_s'] / steady['spans_s']:.2f}x, "
        f"ingest peak RSS {steady['ingest_rss_mb'] / empty['ingest_rss_mb']:.2f}x"
    )


def median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each measure's median over ``rounds`` (one round's figures are not a figure on a shared machine)."""
    return {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}


def run_peer_on(rollouts: list[dict[str, Any]], root: str) -> dict[str, Any]:
    """Agent Lightning's adapter on these rollouts, in its own venv (benchmarks/peer_agentlightning.py)."""
    import json

    from benchmarks.peer_agentlightning import run_peer

    path = os.path.join(root, "peer-rollouts.jsonl")
    with open(path, "w") as f:
        for r in rollouts:
            f.write(json.dumps(r) + "\n")
    result = run_peer(path)
    print(
        f"peer: Agent Lightning {result['version']} on {result['rollouts']:,} rollouts: "
        f"adapt {result['adapt_rollouts_s']:,.0f} rollouts/s, decode + adapt {result['decode_adapt_rollouts_s']:,.0f}",
        flush=True,
    )
    return result


def print_peer(ours: dict[str, Any], label: str, peer: dict[str, Any]) -> None:
    """Our rates next to the peer's on the same rollouts, with the ratios."""
    gold = ours["roll_s"]
    from_kafka = ours["rollouts"] / (ours["ingest_s"] + ours["traj_s"] + ours["trans_s"])
    adapt, both = peer["adapt_rollouts_s"], peer["decode_adapt_rollouts_s"]
    print()
    print(
        f"side by side on the same {peer['rollouts']:,} rollouts ({peer['spans']:,} peer spans -> "
        f"{peer['triplets']:,} triplets; matched: {peer['rewards_matched']:,} final rewards, "
        f"{peer.get('tokens_matched', 0):,} calls' token ids); ours: {label}"
    )
    print(f"{'measure':<62}{'rollouts/s':>12}{'ours / peer':>13}")
    print(f"{'agentlake spans -> trajectories -> transitions (Delta)':<62}{gold:>12,.0f}")
    peer_adapt = f"Agent Lightning {peer['version']} TracerTraceToTriplet.adapt (memory)"
    print(f"{peer_adapt:<62}{adapt:>12,.0f}{gold / adapt:>13.1f}")
    print(f"{'agentlake Kafka -> spans -> transitions':<62}{from_kafka:>12,.0f}")
    print(f"{'Agent Lightning OTLP decode (its store) + adapt':<62}{both:>12,.0f}{from_kafka / both:>13.1f}")


QUERIES = {  # README / docs/tables.md, and one rollout by id
    "reward per agent": "SELECT agent_name, avg(reward) FROM transitions GROUP BY 1",
    "success per day": "SELECT day, avg(final_reward) AS success FROM trajectories GROUP BY 1 ORDER BY 1",
    "one rollout by id": "SELECT rollout_id, n_llm_calls FROM trajectories WHERE rollout_id = '{rollout}'",
}


def lake_scans(lake: Lake) -> dict[str, Any]:
    """Seconds of the paths that read the lake outside the steps: the DuckDB queries and forgetting one rollout."""
    from pipelines.lake.forget import forget
    from pipelines.lake.query import run_query

    # two rollouts of the built copies (their ids are spread: lake_builder), found untimed
    scan = lake.scan("trajectories")
    assert scan is not None
    found = scan.filter(
        pl.col("rollout_id").str.ends_with("-c1-roll-17") | pl.col("rollout_id").str.ends_with("-c2-roll-5")
    )
    ids = sorted(found.select("rollout_id").collect()["rollout_id"].to_list())
    out: dict[str, Any] = {}
    for label, sql in QUERIES.items():
        t0 = time.perf_counter()
        run_query(lake, sql.format(rollout=ids[0]))
        out[label] = time.perf_counter() - t0
    t0 = time.perf_counter()
    forget(lake, "default", rollout=ids[-1], reason="benchmark")
    out["agentlake forget (one rollout)"] = time.perf_counter() - t0
    return out


def _fill(lake: Lake, kafka: KafkaSettings, batches: int | None, args: argparse.Namespace) -> dict[str, Any]:
    """Ingest the topic's first ``batches`` batches (None: all of it) and build their transitions (not measured)."""
    ingest(lake, kafka, "spans", batch_records=args.batch_records, workers=args.workers, max_batches=batches)
    update_trajectories(lake, kafka, idle_timeout_s=300)
    update_transitions(lake, CreditSettings())
    return {}


def _du_mb(path: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs) / 2**20


def _ingest_phase(lake: Lake, kafka: KafkaSettings, args: argparse.Namespace) -> dict[str, Any]:
    r = ingest(lake, kafka, "spans", batch_records=args.batch_records, workers=args.workers)
    return {"rows": r.rows, "seconds": r.seconds, "commits": r.commits}


def _parquet_ceiling(lake: Lake, scratch: str, table: str) -> dict[str, Any]:
    """The same rows, read back once (untimed), written straight to Parquet with pyarrow."""
    t = pl.read_delta(lake.uri(table)).to_arrow()
    t0 = time.perf_counter()
    pq.write_table(t, os.path.join(scratch, f"{table}.parquet"))
    return {"rows": t.num_rows, "seconds": time.perf_counter() - t0}


def _gold_phase(lake: Lake, kafka: KafkaSettings) -> dict[str, Any]:
    t0 = time.perf_counter()
    tr = update_trajectories(lake, kafka, idle_timeout_s=300)
    t1 = time.perf_counter()
    tn = update_transitions(lake, CreditSettings())
    t2 = time.perf_counter()
    return {"rollouts": tr.rollouts, "rows": tn.rows, "seconds": t2 - t0, "traj_s": t1 - t0, "trans_s": t2 - t1}


def one_round(
    kafka: KafkaSettings, lake: Lake, scratch: str, args: argparse.Namespace, *, ceilings: bool = True
) -> dict[str, Any]:
    """Ingest into ``lake``, build transitions there, and measure both ceilings on the same rows
    (without ``ceilings``: on a lake that held more before, where they would read all of it)."""
    os.makedirs(scratch, exist_ok=True)
    ing = in_child(functools.partial(_ingest_phase, lake, kafka, args))
    nan = {"rows": float("nan"), "seconds": 1.0}
    ing_ceil = in_child(functools.partial(_parquet_ceiling, lake, scratch, "spans")) if ceilings else nan
    gold = in_child(functools.partial(_gold_phase, lake, kafka))
    gold_ceil = in_child(functools.partial(_parquet_ceiling, lake, scratch, "transitions")) if ceilings else nan
    return {
        "rows": ing["rows"],
        "commits": ing["commits"],
        "ingest_s": ing["seconds"],
        "spans_s": ing["rows"] / ing["seconds"],
        "spans_ceil": ing_ceil["rows"] / ing_ceil["seconds"],
        "ingest_rss_mb": ing["peak_rss_mb"],
        "decoder_rss_mb": ing["children_rss_mb"],
        "rollouts": gold["rollouts"],
        "transitions": gold["rows"],
        "traj_s": gold["traj_s"],
        "trans_s": gold["trans_s"],
        "roll_s": gold["rollouts"] / gold["seconds"],
        # the ceiling for the gold step: the rollouts' transitions rows written straight to Parquet
        "roll_ceil": gold["rollouts"] / gold_ceil["seconds"],
        "gold_rss_mb": gold["peak_rss_mb"],
        "ingest_work_mb": ing["peak_rss_mb"] - ing["start_rss_mb"],
        "gold_work_mb": gold["peak_rss_mb"] - gold["start_rss_mb"],
    }


if __name__ == "__main__":
    main()
