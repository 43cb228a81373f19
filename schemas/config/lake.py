"""``[state]`` and ``[lake]``: where the local stack keeps its files, and where the Delta tables live."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, field_validator

from schemas.config.base import Section


class StateSettings(Section):
    """Where the local stack keeps pid files, logs and caches."""

    dir: Path = Path(".agentlake")


class LakeSettings(Section):
    """Where the Delta tables live.

    ``root``: a folder or an object-store URI (``s3://``, ``gs://``, ``az://`` ...), with the credentials in
    ``storage_options`` (delta-rs's keys: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``GOOGLE_SERVICE_ACCOUNT``,
    ``AZURE_STORAGE_ACCOUNT_NAME`` ...). A root set anywhere (file, environment) always wins.

    Empty (the default) means the local stack's lake, chosen by ``local_storage``: ``"objectstore"`` is
    the bucket ``agentlake-lake`` of the local SeaweedFS that `agentlake up` starts (the durable broker's
    store), ``"folder"`` is ``<state dir>/lake``. Loading settings resolves it: to what the running stack
    recorded in ``<state>/stack.json``; with no stack running, to the bucket when the store was ever
    started in this state folder (``<state>/objectstore.ports``), else to the folder. When `weed` is
    missing, `agentlake up` keeps the lake in the folder, with a warning. The resolved root is never an
    empty folder standing in for a stopped store: ``unavailable`` says so and lake users refuse to run.
    """

    root: str = ""
    storage_options: dict[str, str] = Field(default_factory=dict)
    local_storage: Literal["objectstore", "folder"] = "objectstore"
    # Days each table keeps its rows, by its time column (spans: start_time, rewards: event_time,
    # trajectories: start_time, transitions: day, quarantine: quarantined_at, training_lineage: consumed_at,
    # judgements: created_at).
    # The nightly maintenance job deletes older rows, records it in `deletions`, then compacts and
    # vacuums. A table not named (and the default, empty) keeps its rows forever.
    retention_days: dict[str, int] = Field(default_factory=dict)
    # The hourly compaction (`compact_recent` job): the cron it runs on and how many of the newest day
    # partitions it compacts in each day-partitioned table, so a busy day's small files stay few
    # between the nightly maintenance runs (docs/capacity.md). Switch the schedule off in Dagster's UI.
    compact_cron: str = "30 * * * *"
    compact_days: int = Field(2, ge=1, le=31)
    # Set by ``load_settings``: the root is the local stack's lake (not a user's), and, when that lake is
    # in a local object store that does not answer, why it cannot be used now.
    _local: bool = PrivateAttr(default=False)
    _unavailable: str = PrivateAttr(default="")

    @property
    def is_local(self) -> bool:
        """True when the lake is the local stack's (``root`` left empty by the user)."""
        return self._local or not self.root.strip()

    @property
    def unavailable(self) -> str | None:
        """Why the lake cannot be reached now (its local object store is stopped), else None."""
        return self._unavailable or None

    @field_validator("compact_cron")
    @classmethod
    def _cron(cls, v: str) -> str:
        try:  # Dagster's own check, where Dagster is installed (the stack); the SDK alone never schedules
            from dagster._utils.schedules import is_valid_cron_string
        except ImportError:  # pragma: no cover - the agent SDK without the stack extra
            return v
        if not is_valid_cron_string(v):
            raise ValueError(
                f"{v!r} is not a cron expression (five fields, e.g. '30 * * * *': minute 30 of every hour)"
            )
        return v

    @field_validator("retention_days")
    @classmethod
    def _retention_known(cls, v: dict[str, int]) -> dict[str, int]:
        for table, days in v.items():
            if table not in RETENTION_TABLES:
                raise ValueError(f"no retention for table {table!r}; tables with one: {', '.join(RETENTION_TABLES)}")
            if days < 1:
                raise ValueError(f"{table}: keep rows at least 1 day (leave the table out to keep them forever)")
        return v


# Tables a retention may delete from (the registry, model_versions, and the deletions record may not).
RETENTION_TABLES = ("spans", "rewards", "trajectories", "transitions", "quarantine", "training_lineage", "judgements")
