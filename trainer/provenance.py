"""Which rows were sampled by files the registry knows: each call's (policy version, adapter hash).

The gateway records, with every call, the policy version (``<served name>@<version folder>``) and the
sha256 of the served adapter's ``manifest.json`` (``policy_sha256``; ``schemas.manifest``), which is
the registry's ``model_versions.manifest_sha256`` when the files are the registered ones. A version
name alone is a claim: a replica whose reload failed silently, a folder rewritten after it was
registered, or another lake's ``v0003`` serve under the same name. The hash is the proof.

A row is *unverified* when its hash is present and either its version is no registry version or the
registry holds another hash for it. Such a row was sampled by a policy nobody can name, so neither
the on-policy loss nor an importance ratio against it means what it says: a round does not train on
it (``trainer.round``, counted as ``refused_unknown_adapter`` in the version's metrics) and the asset
check ``transitions_served_adapters_known`` (``pipelines.defs.checks``) reports it.

A row without a hash (rows from before transitions v4, a gateway on another host than vLLM, a base
model, a version from before manifests) proves nothing either way and is kept, as before; so is a row
of a version registered without a hash (``model_versions`` before v2), which nothing can check.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from trainer.offpolicy import source_of

HASH_CHARS_SHOWN = 16  # of a sha256 in logs and metrics keys


def registered_hashes(registry_rows: Iterable[Mapping[str, Any]]) -> dict[str, str | None]:
    """{version: manifest_sha256} of every registry row (None: registered before hashes were recorded)."""
    return {str(r["version"]): r.get("manifest_sha256") for r in registry_rows}


def is_unverified(policy_version: str | None, policy_sha256: str | None, registered: Mapping[str, str | None]) -> bool:
    """Whether a row's recorded (version, hash) is one the registry does not know (see the module docstring)."""
    if not policy_sha256:
        return False
    version = source_of(policy_version)
    if version not in registered:
        return True
    known = registered[version]
    return known is not None and known != policy_sha256


def pair_name(policy_version: str | None, policy_sha256: str | None) -> str:
    """``agentlake-policy@v0003#<first 16 hex of the hash>``: one unverified pair, for logs and metrics."""
    return f"{policy_version}#{(policy_sha256 or '')[:HASH_CHARS_SHOWN]}"


def split_unverified(rows: pa.Table, registered: Mapping[str, str | None]) -> tuple[pa.Table, dict[str, int]]:
    """(rows to train on, refused rows per ``pair_name``): rows whose (version, hash) the registry does not know go."""
    if rows.num_rows == 0 or "policy_sha256" not in rows.column_names:
        return rows, {}
    keep: list[bool] = []
    refused: dict[str, int] = {}
    for pv, sha in zip(rows["policy_version"].to_pylist(), rows["policy_sha256"].to_pylist(), strict=True):
        bad = is_unverified(pv, sha, registered)
        keep.append(not bad)
        if bad:
            refused[pair_name(pv, sha)] = refused.get(pair_name(pv, sha), 0) + 1
    return rows.filter(pa.array(keep, pa.bool_())), refused
