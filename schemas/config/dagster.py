"""``[dagster]``: the orchestrator's instance and webserver."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from schemas.config.base import Section


class DagsterSettings(Section):
    # "production": the instance on PostgreSQL, dagster-webserver, dagster-daemon and a code server as
    # separate processes (what a deployment runs); "dev": `dagster dev` on SQLite in `home`.
    profile: Literal["production", "dev"] = "production"
    home: Path = Path("dagster_home")  # the dev profile's instance; production's is <state dir>/dagster
    host: str = "127.0.0.1"  # the webserver
    port: int = Field(3000, ge=0, le=65535)
    # production: an external database (postgresql://user@host:port/db) instead of the local PostgreSQL;
    # its password comes from the environment (DAGSTER_PG_PASSWORD), never from here.
    postgres_url: str = ""
    postgres_port: int = Field(0, ge=0, le=65535)  # the local PostgreSQL; 0: last time's while free

    @field_validator("postgres_url")
    @classmethod
    def _no_password_in_url(cls, v: str) -> str:
        if not v:
            return v
        url = urlsplit(v)
        if url.scheme not in ("postgresql", "postgres") or not url.hostname:
            raise ValueError("expected postgresql://user@host:port/database")
        if url.password:
            raise ValueError("keep the password out of settings: put it in DAGSTER_PG_PASSWORD")
        return v
