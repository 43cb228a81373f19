"""`agentlake forget`: delete a tenant's data from every lake table (logic in pipelines.lake.forget)."""

from __future__ import annotations

import typer
from rich.table import Table

from agentlake.cli.app import ConfigOption, app, console, handle_errors, settings_or_exit


@app.command()
@handle_errors
def forget(
    tenant: str = typer.Option(..., "--tenant", help="the tenant whose data goes (as the collector's tokens name it)"),
    rollout: str | None = typer.Option(None, "--rollout", help="only this rollout of the tenant"),
    before: str | None = typer.Option(
        None, "--before", help="only rollouts begun before this date or time (YYYY-MM-DD or ISO 8601; UTC if no zone)"
    ),
    reason: str | None = typer.Option(None, "--reason", help="why (kept in the deletions table)"),
    by: str | None = typer.Option(None, "--by", help="who asked (default: your login name)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="show what would be deleted; delete nothing"),
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask before deleting"),
    config: str | None = ConfigOption,
) -> None:
    """Delete a tenant's rows (all, one rollout, or rollouts begun before a date) from every table.

    The deleted files are vacuumed at once (their data is gone from storage, not only from the
    current snapshot), and the deletion is recorded in the `deletions` table, which a rebuild from
    Kafka (`agentlake replay`) applies again.
    """
    from pipelines.lake.forget import forget as run_forget
    from pipelines.lake.forget import parse_before
    from schemas.lake import Lake

    if rollout is not None and before is not None:
        raise typer.BadParameter("give --rollout or --before, not both", param_hint="--before")
    cutoff = None
    if before is not None:
        try:
            cutoff = parse_before(before)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--before") from exc
    lake = Lake.from_settings(settings_or_exit(config))
    planned = run_forget(lake, tenant, rollout=rollout, before=cutoff, dry_run=True)
    what = planned.selector.describe()
    if not planned.planned.tables:
        console.print(f"{what}: no rows match; nothing to delete" + ("" if dry_run else " (the request is recorded)"))
    else:
        t = Table("table", "rows to delete", title=f"forget {what}")
        for step in planned.planned.tables:
            t.add_row(step.table, str(step.rows))
        console.print(t)
    if dry_run:
        console.print("[dim]dry run: nothing deleted[/]")
        return
    if planned.planned.tables and not yes:
        typer.confirm(f"Delete these {planned.planned.rows} rows for good?", abort=True)
    done = run_forget(lake, tenant, rollout=rollout, before=cutoff, requested_by=by, reason=reason)
    if done.tables:
        t = Table("table", "rows deleted", "version", "files removed", title="deleted")
        for res in done.tables.values():
            t.add_row(res.table, str(res.rows), str(res.version), str(res.files_removed))
        console.print(t)
    console.print(
        f"[green]forgot[/] {what}: {done.rows} rows; recorded as deletion {done.deletion_id} "
        f"(deletions version {done.record_version})"
    )
