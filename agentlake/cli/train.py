"""`agentlake train`: training rounds outside Dagster (``--once`` for one, else a polling loop)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, cast, get_args

import typer

from agentlake.cli.app import ConfigOption, app, console, handle_errors, settings_or_exit
from schemas.config.training import Parallel as ParallelMode

if TYPE_CHECKING:
    from schemas.config import Settings
    from trainer.round import RoundResult


def _parallel_mode(value: str | None) -> str | None:
    if value is not None and value not in get_args(ParallelMode):
        raise typer.BadParameter(f"expected one of {', '.join(get_args(ParallelMode))}")
    return value


# `agentlake train --parallel` takes the values of ``trainer.parallel``, spelled once in its settings type.
ParallelOption = typer.Option(
    None,
    "--parallel",
    callback=_parallel_mode,
    help="With --nproc: ddp (a full model per process) or fsdp (sharded; default trainer.parallel).",
)


@app.command()
@handle_errors
def train(
    once: bool = typer.Option(False, "--once", help="Run one round and exit (else poll for new data)."),
    publish: bool = typer.Option(False, "--publish", help="Publish the new version to vLLM afterwards."),
    force: bool = typer.Option(False, "--force", help="Train even with fewer than trainer.min_new_transitions."),
    max_steps: int | None = typer.Option(None, "--max-steps", help="Stop after this many optimizer steps."),
    version_start: int | None = typer.Option(
        None, "--from-version", help="Train on the transitions added after this table version, even if trained on."
    ),
    version_end: int | None = typer.Option(None, "--to-version", help="Read the transitions table at this version."),
    agent: str | None = typer.Option(None, "--agent", help="Only transitions of agents matching this glob."),
    table: str | None = typer.Option(
        None, "--table", help="Train on this table: transitions, or a credit variant transitions__<name>."
    ),
    interval: float = typer.Option(60.0, "--interval", help="Seconds between polls without --once."),
    nproc: int | None = typer.Option(
        None, "--nproc", min=1, help="Train data-parallel in N processes (torchrun; default trainer.nproc)."
    ),
    parallel: str | None = ParallelOption,
    config: str | None = ConfigOption,
) -> None:
    """Train a new policy version on the transitions no earlier version trained on (each once).

    With ``trainer.agents`` listed, one round per agent's policy line (``--agent``: the lines it matches).
    With ``--nproc N`` > 1 each round is a torchrun job of N data-parallel processes on this machine
    (``trainer.distributed``: gloo on CPU, NCCL with one GPU per process; ``--parallel fsdp`` shards the
    model over them); publishing stays here."""
    from trainer.distributed import train_rounds

    settings = settings_or_exit(config)
    if table is not None:
        from schemas.tables import base_table

        if base_table(table) != "transitions":
            raise typer.BadParameter(
                "expected transitions or a variant transitions__<name> (agentlake transitions rebuild)",
                param_hint="--table",
            )
    given = dict(max_steps=max_steps, version_start=version_start, version_end=version_end, agent=agent, table=table)
    overrides = {k: v for k, v in given.items() if v is not None}
    while True:
        for result in train_rounds(
            settings,
            nproc=nproc,
            parallel=cast("ParallelMode | None", parallel),  # _parallel_mode checked it
            force=force,
            overrides=overrides,
            echo=_echo,
        ):
            _report(settings, result, publish=publish)
        if once:
            return
        time.sleep(interval)


def _echo(line: str) -> None:
    console.print(line, markup=False, highlight=False)


def _report(settings: Settings, result: RoundResult, *, publish: bool) -> None:
    """Print one line's round and publish its new version when asked."""
    from schemas.config.serving import policy_served_name

    name = policy_served_name(settings.model.served_name, result.agent)
    line = f"{name}: " if result.agent else ""
    if result.version is None:
        console.print(f"[yellow]{line}skipped:[/] {result.reason}")
    else:
        m = result.metrics
        console.print(
            f"{line}[green]{result.version}[/] from {result.n_transitions} transitions "
            f"(read at table version {result.version_end}): "
            f"loss {m.get('first_loss', 0):.4f} -> {m.get('final_loss', 0):.4f}, "
            f"{m.get('tokens_per_s', 0):.0f} tok/s, saved to {result.path}"
        )
        if result.tracking_url:  # the round's run (trainer.trackers): MLflow's page, or a TensorBoard/W&B folder
            console.print(f"  run: {result.tracking_url}", markup=False, highlight=False)
        if publish:
            from agentlake.stack.vllm import vllm_restarter
            from serving.publish import gated_publisher

            pub = gated_publisher(
                settings, restart=vllm_restarter(settings, on_step=lambda msg: console.print(f"  {msg}"))
            )
            outcome = pub.publish(result.version)
            console.print(f"  {outcome.status} as {name} in {outcome.seconds:.2f}s")
            from trainer.trackers import log_eval

            log_eval(result.tracking_url, outcome.scores)  # the gate's scores beside the round's curves
