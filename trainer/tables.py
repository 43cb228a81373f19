"""Opening the trainer's Delta tables (no torch here: the registry and the CLI import it)."""

from __future__ import annotations

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError


def open_table(uri: str, storage_options: dict[str, str] | None = None) -> DeltaTable | None:
    """The Delta table at ``uri``, or None when nothing was written there yet."""
    try:
        return DeltaTable(uri, storage_options=storage_options or None)
    except TableNotFoundError:
        return None
