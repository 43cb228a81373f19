"""The closed loop on the embedded default: agents act, Dagster learns, vLLM serves the new policy.

One round = the agent (math, or text-to-SQL) solves a batch of tasks through the gateway (its spans go through the
collector into Kafka) -> Dagster, on its own (Kafka sensor, eager automation), materializes
spans -> rewards -> trajectories -> transitions -> once every rollout of the round is in
`transitions`, the loop launches the `policy` asset in the same Dagster instance (train one
version, hot-load it into vLLM) -> the next round's calls are served by that version. (In
production the "enough new transitions" sensor launches `policy`; here it is held back so each
round trains on exactly its own rollouts.) A held-out
task set is scored against vLLM directly (no spans, so evaluation never becomes training data)
before the first round and after the last: the same tasks with the same sampling seeds both times,
compared per task with a bootstrap interval over tasks (serving.evaluation), so the report says
whether the change is a gain beyond noise; both scores land in the `evaluations` table.

Two kinds of traffic (``LoopPlan.traffic``):

- ``grouped``, what RL trainers do: each task ``samples_per_task`` times, the reward in the trace
  when the rollout ends, group-relative advantages (GRPO).
- ``production``, what deployed agents see: every task once, traces without rewards; a separate
  process (``late_rewards``) posts each reward to ``/v1/rewards`` after a random delay, and
  ``never_rewarded`` of them never. Credit is a running baseline per agent; a rollout still without
  a reward ``reward_horizon_s`` after it ended is dropped. A round trains on the rewards that came
  in so far: those that come later are trained in a later round, as off-policy data from the
  version that sampled them (truncated importance sampling).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from opentelemetry import trace as otel_trace

from agentlake.stack import local
from examples.closed_loop.agents import AgentKit, Result, agent_kit
from examples.closed_loop.assets import materialize_all
from examples.closed_loop.late_rewards import LateRewards
from schemas.config import Settings
from schemas.errors import AgentlakeError
from schemas.lake import Lake
from schemas.topics import DEFAULT_TENANT

Step = Callable[[str], None]
Traffic = Literal["grouped", "production"]


@dataclass
class RoundRecord:
    round: int
    policy_version: str
    rollouts: int
    mean_reward: float
    seconds: float
    trained_version: str | None = None
    loss: float | None = None
    # production traffic: rewards posted in time for this round's training, posted later, never posted
    rewarded: int | None = None
    late: int | None = None
    never: int | None = None
    trained_rollouts: int | None = None  # rollouts this round's version trained on (training_lineage), any round's


@dataclass
class LoopReport:
    agent: str = "math"
    traffic: str = "grouped"
    rounds: list[RoundRecord] = field(default_factory=list)
    eval_before: float = 0.0
    eval_after: float = 0.0
    eval_tasks: int = 0
    seconds: float = 0.0
    plot: str | None = None
    # the paired evaluation: samples per task, each side's interval, the difference's, and the verdict
    eval_samples: int = 0
    eval_confidence: float = 0.95
    eval_before_ci: tuple[float, float] = (0.0, 0.0)
    eval_after_ci: tuple[float, float] = (0.0, 0.0)
    eval_diff: float = 0.0
    eval_diff_ci: tuple[float, float] = (0.0, 0.0)
    eval_verdict: str = ""
    eval_before_version: str = ""
    eval_after_version: str = ""
    eval_seconds: float = 0.0  # both evaluations together


@dataclass(frozen=True)
class LoopPlan:
    rounds: int = 4
    tasks_per_round: int = 8
    samples_per_task: int = 4  # production traffic: tasks_per_round * samples_per_task tasks, each once
    # The held-out set (AgentKit.heldout_tasks): enough tasks that the bootstrap interval over them is narrow
    # (about +-0.07 on a difference), a few seeded samples of each.
    eval_tasks: int = 128
    eval_samples: int = 3
    temperature: float = 0.7
    agent: str = "math"  # examples.closed_loop.agents.AGENTS
    traffic: Traffic = "grouped"
    concurrency: int = 8
    seed: int = 0
    train_timeout_s: float = 900.0
    # A few hundred samples must move a 135M model: a LoRA learning rate well above fine-tuning's.
    learning_rate: float = 3e-4
    epochs: int = 1
    # production traffic: reward delays are exponential with this mean (capped below the horizon);
    # the share never rewarded; how long after a round's rollouts the loop collects what came in
    reward_delay_mean_s: float = 30.0
    never_rewarded: float = 0.2
    settle_s: float = 45.0
    reward_horizon_s: float = 150.0

    @property
    def rollouts_per_round(self) -> int:
        return self.tasks_per_round * self.samples_per_task


EVAL_CONCURRENCY = 16  # CPU vLLM batches more requests at once; measured faster than 8 for the held-out set


def evaluate(settings: Settings, plan: LoopPlan, *, on_progress: Step = lambda _m: None) -> dict[str, list[float]]:
    """Each held-out task's rewards (task id -> one per sample) for the served policy at the agent's temperature.

    Sampled, not greedy: it is the reward agents get in production, and the quantity RL raises. Sample j
    of task i draws with seed ``sample_seed(plan.seed, i, j)``, so scoring another version draws the same
    way and the two are compared on the same tasks and the same seeds (no spans: never training data).
    """
    from serving.evaluation import sample_seed

    kit = agent_kit(plan.agent)
    tasks = kit.heldout_tasks(plan.eval_tasks)
    batch = [t for t in tasks for _ in range(plan.eval_samples)]
    results = kit.run_batch(
        settings.vllm.url,
        batch,
        model=settings.model.served_name,
        concurrency=max(plan.concurrency, EVAL_CONCURRENCY),
        temperature=plan.temperature,
        tracer=otel_trace.NoOpTracer(),
        seeds=[sample_seed(plan.seed, i, j) for i in range(len(tasks)) for j in range(plan.eval_samples)],
        on_done=lambda done, total: on_progress(f"scoring {settings.model.served_name}: {done}/{total} answers"),
    )
    rewards: dict[str, list[float]] = {}
    for task, result in zip(batch, results, strict=True):
        rewards.setdefault(task.task_id, []).append(result.reward)
    return rewards


def compare_evaluations(
    report: LoopReport,
    settings: Settings,
    plan: LoopPlan,
    before: dict[str, list[float]],
    after: dict[str, list[float]],
) -> None:
    """Fill the report's paired comparison and store both versions' scores in the `evaluations` table."""
    from serving.evaluation import compare, task_scores
    from serving.evaluation_table import paired_rows, record

    paired = compare(task_scores(before), task_scores(after), confidence=report.eval_confidence, seed=plan.seed)
    report.eval_before, report.eval_after = paired.before.mean, paired.after.mean
    report.eval_before_ci = (paired.before.low, paired.before.high)
    report.eval_after_ci = (paired.after.low, paired.after.high)
    report.eval_diff, report.eval_diff_ci = paired.diff.mean, (paired.diff.low, paired.diff.high)
    report.eval_verdict = paired.verdict
    record(
        Lake.from_settings(settings),
        paired_rows(
            paired,
            before_version=report.eval_before_version,
            after_version=report.eval_after_version,
            compare_before=True,
        ),
        task_set=f"demo-{plan.agent}-heldout",
        n_tasks=paired.n_tasks,
        n_samples=plan.eval_samples,
        confidence=paired.confidence,
        source="demo",
    )


def serving_version(settings: Settings) -> str:
    from trainer.registry import Registry

    row = Registry(Lake.from_settings(settings)).serving()
    return str(row["version"]) if row else "base"


def wait_for_transitions(
    settings: Settings, rollout_ids: set[str], *, tenant: str = DEFAULT_TENANT, timeout_s: float
) -> None:
    """Block until every rollout in ``rollout_ids`` of ``tenant`` has transitions in the lake.

    Rollout ids are keyed by tenant (another tenant's rollout of the same id is not this one); the
    demo's agents send without a token, so their spans land under the default tenant.
    """
    import polars as pl

    lake = Lake.from_settings(settings)
    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()
    while time.monotonic() < deadline:
        scan = lake.scan("transitions")
        if scan is not None:
            rows = scan.filter(pl.col("tenant") == tenant).select("rollout_id").unique().collect()
            seen = set(rows.get_column("rollout_id").to_list())
        if rollout_ids <= seen:
            return
        time.sleep(1)  # one scan of the table: cheap next to the round's seconds lost to a 3 s poll
    raise AgentlakeError(
        f"{len(rollout_ids - seen)} of {len(rollout_ids)} rollouts of tenant {tenant!r} never reached "
        f"`transitions` within {timeout_s:.0f}s; see the Dagster UI and {local.state_dir(settings) / 'logs'}"
    )


def wait_for_new_version(settings: Settings, current: str, *, timeout_s: float) -> str:
    """Block until the registry serves a version other than ``current`` (Dagster's sensors train it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        version = serving_version(settings)
        if version != current:
            return version
        time.sleep(1)  # one read of the registry
    raise AgentlakeError(
        f"no new policy version within {timeout_s:.0f}s of the round; see the runs in the Dagster UI "
        f"(http://{settings.dagster.host}:{settings.dagster.port}) and {local.state_dir(settings) / 'logs'}"
    )


def plot_rewards(report: LoopReport, path: Path) -> Path:
    """Reward per round, with the held-out accuracy before and after, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [r.round for r in report.rounds]
    ax.plot(xs, [r.mean_reward for r in report.rounds], marker="o", label="training rollouts")
    for r in report.rounds:
        ax.annotate(
            r.policy_version,
            (r.round, r.mean_reward),
            textcoords="offset points",
            xytext=(0, 6),
            ha="center",
            fontsize=8,
        )
    for mean, (low, high), color, when in (
        (report.eval_before, report.eval_before_ci, "grey", "before"),
        (report.eval_after, report.eval_after_ci, "green", "after"),
    ):
        ax.axhline(mean, color=color, linestyle="--", label=f"held-out {when} ({mean:.2f} [{low:.2f}, {high:.2f}])")
        ax.axhspan(low, high, color=color, alpha=0.12)
    ax.set_xlabel("round")
    ax.set_xticks(xs)
    ax.set_ylabel("mean reward")
    ax.set_ylim(-0.05, 1.05)
    title = f"agentlake closed loop: {report.agent} agent, {report.traffic} traffic, SmolLM2-135M"
    if report.eval_verdict:  # the paired difference under the title, where no curve or legend covers it
        low, high = report.eval_diff_ci
        title += (
            f"\nheld-out {report.eval_diff:+.3f} [{low:+.3f}, {high:+.3f}] "
            f"({report.eval_confidence:.0%} bootstrap over {report.eval_tasks} tasks): {report.eval_verdict}"
        )
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_closed_loop(
    settings: Settings, plan: LoopPlan, *, on_step: Step = lambda _m: None, on_progress: Step = lambda _m: None
) -> LoopReport:
    """Start everything, run ``plan.rounds`` rounds, score before/after; the caller runs `down`.

    ``on_step`` gets each step once (a log line); ``on_progress`` gets counts within a step (a status line).
    """
    from agentlake.stack.vllm import ensure_vllm_venv
    from serving.initial import ensure_initial_policies
    from trainer.model_store import ensure_model

    started = time.monotonic()
    kit = agent_kit(plan.agent)
    # The loop, not the sensor, decides when a round's data is complete (see the module docstring).
    settings.trainer.min_new_transitions = 10**9
    settings.trainer.learning_rate = plan.learning_rate
    settings.trainer.epochs = plan.epochs
    settings.trainer.seed = plan.seed
    if kit.micro_batch is not None and kit.micro_batch < settings.trainer.batch_size:
        steps = -(-settings.trainer.batch_size // kit.micro_batch)  # the same batch, in smaller steps
        settings.trainer.grad_accum *= steps
        settings.trainer.batch_size = kit.micro_batch
    if plan.traffic == "production":
        # One sample per task: no group to compare with, so a running baseline per agent; a rollout
        # whose reward never comes is dropped once the horizon has passed.
        settings.credit.advantage = "running_baseline"
        settings.credit.reward_horizon_s = plan.reward_horizon_s
        settings.credit.missing_reward = "drop"
    on_step(f"pulling {settings.model.base}")
    ensure_model(settings.model.base, settings.model.cache_dir)
    on_step("preparing the vLLM environment (first time: a few minutes)")
    ensure_vllm_venv(settings)
    local.up(settings, with_vllm=True, on_step=lambda part: on_step(f"starting {part}"))
    bootstrap = local.bootstrap_servers(settings)
    assert bootstrap is not None
    on_step("publishing the initial policy")
    ensure_initial_policies(settings)

    import agentlake

    c = settings.collector
    collector = f"http://{c.host}:{c.http_port}"
    # The agents trace through this provider's tracer, not the global one: OpenTelemetry sets the global
    # provider once per process, so a second loop in one process (tests) would send to the first's collector.
    tracer = agentlake.init(collector, service_name=kit.name, instrument_openai=False).get_tracer(kit.name)
    gateway = f"http://{settings.gateway.host}:{settings.gateway.port}"

    report = LoopReport(
        agent=plan.agent, traffic=plan.traffic, eval_tasks=plan.eval_tasks, eval_samples=plan.eval_samples
    )
    report.eval_before_version = serving_version(settings)
    on_step(
        f"scoring the initial policy ({report.eval_before_version}) on {plan.eval_tasks} held-out tasks "
        f"x {plan.eval_samples} samples"
    )
    t_eval = time.monotonic()
    before = evaluate(settings, plan, on_progress=on_progress)
    report.eval_seconds = time.monotonic() - t_eval
    rounds = _Rounds(settings, plan, kit, gateway, bootstrap, tracer, on_step, on_progress)
    if plan.traffic == "production":
        with LateRewards(collector, cwd=local.REPO_ROOT) as poster:
            rounds.poster = poster
            report.rounds = [rounds.run(rnd) for rnd in range(1, plan.rounds + 1)]
    else:
        report.rounds = [rounds.run(rnd) for rnd in range(1, plan.rounds + 1)]
    report.eval_after_version = serving_version(settings)
    on_step(f"scoring {report.eval_after_version} on the same held-out tasks with the same seeds")
    t_eval = time.monotonic()
    after = evaluate(settings, plan, on_progress=on_progress)
    report.eval_seconds += time.monotonic() - t_eval
    compare_evaluations(report, settings, plan, before, after)
    report.seconds = time.monotonic() - started
    out = local.state_dir(settings) / "demo"
    report.plot = str(plot_rewards(report, out / "reward_curve.png"))
    (out / "report.json").write_text(json.dumps(asdict(report), indent=2))
    return report


@dataclass
class _Rounds:
    """One round at a time: rollouts through the gateway, their data into the lake, one trained version."""

    settings: Settings
    plan: LoopPlan
    kit: AgentKit
    gateway: str
    bootstrap: str
    tracer: otel_trace.Tracer
    on_step: Step
    on_progress: Step
    poster: LateRewards | None = None
    rng: random.Random = field(init=False)
    pending: dict[str, float] = field(default_factory=dict)  # production: rollout -> when its reward is due
    trained: set[str] = field(default_factory=set)  # production: rollouts whose transitions were trained

    def __post_init__(self) -> None:
        self.rng = random.Random(self.plan.seed)

    def run(self, rnd: int) -> RoundRecord:
        plan, settings = self.plan, self.settings
        t0 = time.monotonic()
        version = serving_version(settings)
        production = plan.traffic == "production"
        n_tasks = plan.rollouts_per_round if production else plan.tasks_per_round
        tasks = self.kit.train_tasks(n_tasks, plan.seed * 1000 + rnd, f"train-s{plan.seed}-r{rnd}")
        batch = tasks if production else [t for t in tasks for _ in range(plan.samples_per_task)]
        label = f"round {rnd}/{plan.rounds}"
        self.on_step(f"{label}: {len(batch)} rollouts served by {version} ({plan.traffic} traffic)")
        results = self.kit.run_batch(
            self.gateway,
            batch,
            model=settings.model.served_name,
            concurrency=plan.concurrency,
            temperature=plan.temperature,
            reward_span=not production,
            tracer=self.tracer,
            on_done=lambda done, total: self.on_progress(f"{label}: {done}/{total} rollouts"),
        )
        import agentlake

        agentlake.flush()
        record = RoundRecord(
            round=rnd,
            policy_version=version,
            rollouts=len(results),
            mean_reward=statistics.fmean(r.reward for r in results),
            seconds=0.0,
        )
        if production:
            wanted = self._collect_late_rewards(results, record, label)
        else:
            wanted = {r.rollout_id for r in results}
        if not wanted:  # production traffic: no reward has come in yet, so there is nothing to learn from
            self.on_step(f"{label}: no rewarded rollout yet; {version} keeps serving")
            record.seconds = time.monotonic() - t0
            return record
        self.on_step(f"{label}: waiting for Dagster to ingest spans and build transitions")
        wait_for_transitions(settings, wanted, timeout_s=plan.train_timeout_s)
        self.on_step(f"{label}: Dagster trains and publishes a new policy version")
        materialize_all(settings, self.bootstrap, {"AGENTLAKE_TRAINER__MIN_NEW_TRANSITIONS": "1"}, select="policy")
        after = wait_for_new_version(settings, version, timeout_s=60)
        record.trained_version = after if after != version else None
        record.loss = _last_loss(settings, after)
        if production:  # what the version learned from: rewards that came in until it trained, any round's
            learned = trained_rollouts(settings, after)
            record.trained_rollouts = len(learned)
            self.trained |= learned
        record.seconds = time.monotonic() - t0
        return record

    def _collect_late_rewards(self, results: Sequence[Result], record: RoundRecord, label: str) -> set[str]:
        """Hand this round's rewards to the poster; the rollouts rewarded by now, not yet trained on."""
        assert self.poster is not None
        plan = self.plan
        now = time.monotonic()
        cap = 0.9 * plan.reward_horizon_s  # a reward that comes at all comes before the rollout is dropped
        sent = 0
        for r in results:
            if self.rng.random() < plan.never_rewarded:
                continue  # this outcome is never reported
            delay = min(self.rng.expovariate(1 / plan.reward_delay_mean_s), cap)
            self.poster.send(r.rollout_id, r.reward, delay)
            self.pending[r.rollout_id] = now + delay
            sent += 1
        self.on_step(
            f"{label}: {sent} of {len(results)} rewards will be posted, {len(self.pending)} are on their way; "
            f"collecting for {plan.settle_s:.0f}s"
        )
        time.sleep(plan.settle_s)
        failed = self.poster.failed()
        if failed:
            rid, error = next(iter(failed.items()))
            raise AgentlakeError(f"{len(failed)} rewards could not be posted (rollout {rid}: {error})")
        posted = self.poster.posted() - self.trained
        ours = {r.rollout_id for r in results}
        record.rewarded = len(posted & ours)
        record.never = sum(1 for r in results if r.rollout_id not in self.pending and r.rollout_id not in posted)
        record.late = len(ours) - record.rewarded - record.never
        for rid in posted:
            self.pending.pop(rid, None)
        return posted


def trained_rollouts(settings: Settings, version: str) -> set[str]:
    """The rollouts ``version`` trained on, as its `training_lineage` rows say."""
    import polars as pl

    scan = Lake.from_settings(settings).scan("training_lineage")
    if scan is None:
        return set()
    rows = scan.filter(pl.col("model_version") == version).select("rollout_id").unique().collect()
    return set(rows.get_column("rollout_id").drop_nulls().to_list())


def _last_loss(settings: Settings, version: str) -> float | None:
    from trainer.registry import Registry

    try:
        row = Registry(Lake.from_settings(settings)).get(version)
    except Exception:  # noqa: BLE001 - "base" or a registry hiccup: no loss to show
        return None
    metrics = json.loads(row.get("metrics") or "{}")
    value = metrics.get("final_loss", metrics.get("loss"))
    return float(value) if isinstance(value, int | float) else None
