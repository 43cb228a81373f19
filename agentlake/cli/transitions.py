"""`agentlake transitions rebuild | list | show`: credit variants of `transitions` (pipelines.gold.variants)."""

from __future__ import annotations

import json
from typing import Any, get_args

import typer

from agentlake.cli.app import ConfigOption, app, console, handle_errors, settings_or_exit
from schemas.config.training import CreditMode

transitions_app = typer.Typer(
    name="transitions",
    help="Credit variants: `transitions` rebuilt from the same trajectories under other credit settings.",
    no_args_is_help=True,
)
app.add_typer(transitions_app, name="transitions")

_MODES = get_args(CreditMode)


def _credit(base: Any, **changes: Any) -> Any:  # noqa: ANN401 - schemas.config.CreditSettings, imported lazily
    """``base`` (the settings' [credit]) with the options given on the command line, validated."""
    from pydantic import ValidationError

    from schemas.config import CreditSettings

    given = {k: v for k, v in changes.items() if v is not None}
    try:
        return CreditSettings(**{**base.model_dump(), **given})
    except ValidationError as exc:
        raise typer.BadParameter(
            "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        ) from None


@transitions_app.command("rebuild")
@handle_errors
def rebuild(
    mode: str | None = typer.Option(None, "--credit", help=f"credit mode: {', '.join(_MODES)} (default: [credit])"),
    gamma: float | None = typer.Option(None, "--gamma", help="discount over steps, 0..1 (discounted, per_step)"),
    advantage: str | None = typer.Option(None, "--advantage", help="a registered estimator (grpo, rloo, ...)"),
    normalize_std: bool | None = typer.Option(
        None, "--normalize-std/--no-normalize-std", help="GRPO: divide by the group's std"
    ),
    merge_calls: bool | None = typer.Option(None, "--merge-calls/--no-merge-calls", help="merge continued calls"),
    agent: str | None = typer.Option(None, "--agent", help="only calls of agents matching this glob"),
    name: str | None = typer.Option(
        None, "--name", help="variant name: writes transitions__<name> (default: spelled from the settings)"
    ),
    config: str | None = ConfigOption,
) -> None:
    """Write a variant table from every current trajectory with these credit settings (a new version of it).

    The main `transitions` table is left alone; train on the variant with `agentlake train --table`.
    """
    from pipelines.gold.retokenize import policy_retokenizer
    from pipelines.gold.token_check import policy_verifier
    from pipelines.gold.variants import rebuild_variant
    from schemas.lake import Lake

    if mode is not None and mode not in _MODES:
        raise typer.BadParameter(f"expected one of {', '.join(_MODES)}", param_hint="--credit")
    if advantage is not None:
        from pipelines.gold.estimators import ESTIMATORS  # every registered estimator; pipelines loads Dagster

        if advantage not in ESTIMATORS:
            raise typer.BadParameter(f"expected one of {', '.join(ESTIMATORS)}", param_hint="--advantage")
    s = settings_or_exit(config)
    credit = _credit(
        s.credit,
        mode=mode,
        gamma=gamma,
        advantage=advantage,
        normalize_std=normalize_std,
        merge_calls=merge_calls,
        agent_pattern=agent,
    )
    res = rebuild_variant(
        Lake.from_settings(s), credit, name=name, retokenizer=policy_retokenizer(s), verifier=policy_verifier(s)
    )
    console.print(
        f"[green]{res.table}[/] version {res.version}: {res.rows} transitions from {res.rollouts} rollouts "
        f"(trajectories version {res.trajectories_version})"
    )
    console.print(f"  credit: {credit.model_dump_json()}")
    if res.dropped:
        console.print("  dropped: " + ", ".join(f"{k} {v}" for k, v in sorted(res.dropped.items())))
    console.print(f"  train on it: agentlake train --once --table {res.table}")


@transitions_app.command("list")
@handle_errors
def list_variants(config: str | None = ConfigOption) -> None:
    """List the variants built in the lake, each with its version, rows and credit settings."""
    from pipelines.gold.variants import describe, variant_names
    from schemas.lake import Lake

    lake = Lake.from_settings(settings_or_exit(config))
    names = variant_names(lake)
    if not names:
        console.print("no credit variants yet: `agentlake transitions rebuild --credit ... --advantage ...` builds one")
    for name in names:
        info = describe(lake, name)
        if info is None:
            console.print(f"transitions__{name}: no credit settings recorded", soft_wrap=True)
            continue
        credit = info["credit"] or {}
        spelled = ", ".join(f"{k}={credit[k]}" for k in ("mode", "gamma", "advantage", "normalize_std") if k in credit)
        console.print(
            f"[green]{info['table']}[/] version {info['version']}, {info['rows']} rows: {spelled} "
            f"(from trajectories version {info['trajectories_version']})",
            soft_wrap=True,
        )


@transitions_app.command("show")
@handle_errors
def show(
    name: str = typer.Argument(..., help="the variant name (transitions__<name>)"),
    config: str | None = ConfigOption,
) -> None:
    """Print a variant's version, rows and the credit settings it was built with."""
    from pipelines.gold.variants import describe
    from schemas.lake import Lake

    s = settings_or_exit(config)
    info = describe(Lake.from_settings(s), name.removeprefix("transitions__"))
    if info is None:
        console.print(f"[yellow]no variant {name!r} built yet[/]: run `agentlake transitions rebuild --name {name}`")
        raise typer.Exit(1)
    console.print(json.dumps(info, indent=2))
