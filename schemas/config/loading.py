"""Loading settings: defaults, the running stack, ``agentlake.toml`` and the environment, merged.

Precedence, lowest first: defaults, the running local stack, ``agentlake.toml`` (in the working
directory, or the file named by ``AGENTLAKE_CONFIG``), then environment variables. Environment
variables are ``AGENTLAKE_<SECTION>__<KEY>`` (``AGENTLAKE_COLLECTOR__HTTP_PORT=4318``), plus a few
conventional short names (``AGENTLAKE_LAKE``, ``KAFKA_BOOTSTRAP_SERVERS``, ``AGENTLAKE_STATE_DIR``).
Unknown keys and bad values raise ``ConfigError`` naming the key and the source it came from.

The running local stack: ``agentlake up`` writes the addresses it started with (broker, lake,
collector, gateway, vLLM, Dagster) to ``<state dir>/stack.json``, with the pid and start time of
each process (agentlake.stack.discovery; read by ``stack_file``). Any tool that loads settings takes
from it what nothing explicit sets, so ``dagster asset materialize``, ``agentlake replay`` or
``agentlake model publish`` find the live broker with no ``KAFKA_BOOTSTRAP_SERVERS``. A file whose
processes are gone is ignored.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from schemas import local_store
from schemas.config.lake import StateSettings
from schemas.config.secrets import SECRET_SETTINGS, redact
from schemas.config.settings import Settings
from schemas.config.stack_file import live_stack, stack_file
from schemas.errors import ConfigError

ENV_PREFIX = "AGENTLAKE_"
CONFIG_FILE_ENV = "AGENTLAKE_CONFIG"
DEFAULT_CONFIG_FILE = "agentlake.toml"


# Conventional short names -> (section, key).
ENV_ALIASES: dict[str, tuple[str, str]] = {
    "AGENTLAKE_LAKE": ("lake", "root"),
    "KAFKA_BOOTSTRAP_SERVERS": ("kafka", "bootstrap_servers"),
    "AGENTLAKE_STATE_DIR": ("state", "dir"),
}
_NOT_SETTINGS = {CONFIG_FILE_ENV}


def _env_value(raw: str, annotation: Any) -> Any:
    """Env values are strings; JSON lets lists and dicts through (``'["a","b"]'``)."""
    text = raw.strip()
    if text[:1] in "[{":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return raw
    return raw


def _env_overrides(environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    sections = Settings.model_fields
    out: dict[str, dict[str, Any]] = {}
    for name, raw in environ.items():
        if name in ENV_ALIASES:
            section, key = ENV_ALIASES[name]
        elif name.startswith(ENV_PREFIX) and name not in _NOT_SETTINGS:
            rest = name[len(ENV_PREFIX) :].lower()
            if "__" not in rest:
                raise ConfigError(
                    f"environment variable {name}: unknown setting; use AGENTLAKE_<SECTION>__<KEY>, "
                    f"sections: {', '.join(sections)}"
                )
            section, key = rest.split("__", 1)
            if section not in sections:
                raise ConfigError(
                    f"environment variable {name}: unknown section {section!r}; expected one of {', '.join(sections)}"
                )
        else:
            continue
        out.setdefault(section, {})[key] = _env_value(raw, None)
    return out


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for k, v in extra.items():
        if isinstance(v, Mapping) and isinstance(merged.get(k), Mapping):
            merged[k] = {**merged[k], **v}
        else:
            merged[k] = v
    return merged


def _error_key(loc: tuple[Any, ...]) -> str:
    """The setting an error is about; a secret's own path stops at it (a token may be a dict key)."""
    parts: list[str] = []
    for part in loc:
        parts.append(str(part))
        if ".".join(parts) in SECRET_SETTINGS:
            break
    return ".".join(parts)


def _format(err: ValidationError, sources: Mapping[str, str]) -> str:
    lines = []
    for e in err.errors():
        key = _error_key(e["loc"])
        src = sources.get(key) or sources.get(key.split(".")[0], "defaults")
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        shown = "" if e["type"] == "extra_forbidden" else f" (got {redact(key, e.get('input'))!r})"
        lines.append(f"{key}: {msg}{shown} [from {src}]")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def load_settings(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    discover: bool = True,
) -> Settings:
    """Read settings from defaults, the running stack, the TOML file, the environment, then ``overrides``.

    ``discover=False`` ignores the running local stack (``<state dir>/stack.json``).
    """
    environ = os.environ if environ is None else environ
    sources: dict[str, str] = {}
    data: dict[str, Any] = {}

    from_env = environ.get(CONFIG_FILE_ENV, "").strip()
    explicit = path is not None or bool(from_env)
    file = Path(path if path is not None else (from_env or DEFAULT_CONFIG_FILE))
    if file.is_dir():
        raise ConfigError(f"config file {file} is a directory; point {CONFIG_FILE_ENV} or --config at a .toml file")
    if file.exists():
        try:
            data = tomllib.loads(file.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from exc
        for section, values in data.items():
            if not isinstance(values, dict):
                raise ConfigError(f"{file}: {section!r} must be a [table] of settings, got {redact(section, values)!r}")
            for key in values:
                sources[f"{section}.{key}"] = str(file)
    elif explicit:
        raise ConfigError(f"config file {file} does not exist")

    env = _env_overrides(environ)
    for section, values in env.items():
        for key in values:
            alias = next((n for n, sk in ENV_ALIASES.items() if sk == (section, key) and n in environ), None)
            sources[f"{section}.{key}"] = f"${alias or f'{ENV_PREFIX}{section.upper()}__{key.upper()}'}"
    data = _merge(data, env)
    if overrides:
        data = _merge(data, {k: dict(v) for k, v in overrides.items()})
    local_broker = ""
    state = data.get("state")
    state_dir = state.get("dir") if isinstance(state, Mapping) else None
    if not isinstance(state_dir, str | os.PathLike):
        state_dir = StateSettings().dir
    live: dict[str, dict[str, Any]] = {}
    if discover:
        live, own_broker = live_stack(state_dir)
        for section, values in live.items():
            if section == "lake":  # resolved below, with the rest of the local lake's rule
                continue
            current = data.get(section)
            current = dict(current) if isinstance(current, Mapping) else {}
            # Explicit settings win; an empty Kafka address means "the local broker", so it is found.
            found = {k: v for k, v in values.items() if k not in current or current[k] == ""}
            for key in found:
                sources[f"{section}.{key}"] = str(stack_file(state_dir))
            if found:
                data[section] = {**current, **found}
            if section == "kafka" and own_broker and "bootstrap_servers" in found:
                local_broker = str(found["bootstrap_servers"]).strip()
    lake = dict(data["lake"]) if isinstance(data.get("lake"), Mapping) else {}
    local_lake = not str(lake.get("root") or "").strip()
    unavailable = ""
    if local_lake:
        found, where, unavailable = _local_lake(lake, state_dir, live.get("lake") if discover else None, discover)
        for key in found:
            sources[f"lake.{key}"] = where
        data["lake"] = {**lake, **found}
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        # ``from None``: the ValidationError's own text shows every input, secrets included.
        raise ConfigError(_format(exc, sources)) from None
    settings.kafka._local_broker = local_broker
    settings.lake._local = local_lake
    settings.lake._unavailable = unavailable
    return settings


def _local_lake(
    lake: Mapping[str, Any],
    state_dir: str | os.PathLike[str],
    recorded: Mapping[str, Any] | None,
    discover: bool,
) -> tuple[dict[str, Any], str, str]:
    """Where a lake left empty lives: (root and storage options, where that was read, why it is unavailable).

    The running stack's record first; with none running, the local object store's bucket when that
    store was ever started here (its ports file), else ``<state>/lake``. The local store's options
    replace any the user set (as `agentlake up` does): those belong to a lake of their own.
    ``discover=False`` reads neither file: the folder.
    """
    folder = str(Path(state_dir) / "lake")
    mode = lake.get("local_storage", "objectstore")
    if recorded and recorded.get("root"):
        options = recorded.get("storage_options")
        found: dict[str, Any] = {"root": recorded["root"], "storage_options": dict(options or {})}
        return found, str(stack_file(state_dir)), ""
    if not discover or mode == "folder":
        where = "lake.local_storage" if mode == "folder" else "defaults"
        return {"root": folder, "storage_options": {}}, where, ""
    ports_file = Path(state_dir) / local_store.PORTS_FILE
    ports = local_store.read_ports(ports_file)
    if not ports or not isinstance(ports.get("s3"), int):
        return {"root": folder, "storage_options": {}}, "defaults (no local object store was started yet)", ""
    endpoint = local_store.endpoint_of(ports)
    found = {"root": local_store.LAKE_ROOT, "storage_options": local_store.lake_storage_options(endpoint)}
    unavailable = ""
    if not local_store.listening(endpoint):
        unavailable = (
            f"the lake is in the local object store at {endpoint} ({local_store.LAKE_ROOT}), which is not running: "
            "run `agentlake up` (or set lake.root to use another lake)"
        )
    return found, str(ports_file), unavailable
