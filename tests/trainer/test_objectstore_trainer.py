"""The trainer on an object-store lake (real SeaweedFS S3): reads, stored versions, fetches, refusals.

Every byte goes through the real store: transitions are a Delta table in the bucket, each version's
folder is uploaded beside the tables with its manifest, and a host without the folder downloads and
checks it. Corruption is caused by overwriting an object in the bucket, as a faulty disk or a
careless hand would.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from typer.testing import CliRunner

from agentlake.cli import app
from agentlake.stack.ports import free_port
from schemas.lake import Lake
from schemas.storage import filesystem, is_secret_option, read_bytes
from schemas.uris import table_uri
from serving.errors import PublishError
from serving.publish import Publisher
from tests.objectstore import ObjectStore
from tests.serving.helpers import FakeVllm
from tests.trainer.helpers import build_tokenizer, transition, write_transitions
from trainer.artifacts import MANIFEST_FILE, local_copy, verify_folder
from trainer.config import TrainConfig
from trainer.errors import ArtifactError
from trainer.lineage import Lineage
from trainer.registry import Registry
from trainer.round import count_pending, train_once


def _rows(start: int, n: int) -> list[dict[str, Any]]:
    tok = build_tokenizer()
    prompt, good, bad = (tok(t)["input_ids"] for t in ("what is two plus three", "good yes", "bad"))
    return [
        transition(i, prompt, good if i % 2 else bad, advantage=1.0 if i % 2 else -1.0) for i in range(start, start + n)
    ]


def _config(root: str, opts: dict[str, str], model: Path, checkpoints: Path) -> TrainConfig:
    return TrainConfig(
        lake_root=root,
        storage_options=opts,
        base_model=str(model),
        checkpoint_dir=str(checkpoints),
        min_new_transitions=4,
        lora_rank=4,
        batch_size=4,
        progress=False,
    )


def _bucket_files(uri: str, opts: dict[str, str]) -> dict[str, bytes]:
    """Every object under ``uri``, by its path relative to ``uri``."""
    fs, base = filesystem(uri, opts)
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    out = {}
    for info in infos:
        if info.type == pafs.FileType.File:
            with fs.open_input_stream(info.path) as f:
                out[info.path[len(base) + 1 :]] = f.read()
    return out


def _overwrite(uri: str, opts: dict[str, str], data: bytes) -> None:
    fs, path = filesystem(uri, opts)
    with fs.open_output_stream(path) as f:
        f.write(data)


def test_rounds_read_from_s3_store_versions_in_the_bucket_and_resume_on_a_fresh_host(
    object_store: ObjectStore, tiny_model_dir: Path, tmp_path: Path
) -> None:
    root, opts = object_store.lake_root(), object_store.storage_options
    end = write_transitions(root, _rows(0, 8), storage_options=opts)
    cfg = _config(root, opts, tiny_model_dir, tmp_path / "trainer-host" / "models")
    assert count_pending(cfg) == (8, end)

    first = train_once(cfg=cfg)
    assert (
        first.version == "v0001" and first.n_transitions == 8 and (first.version_start, first.version_end) == (-1, end)
    )
    registry = Registry(Lake(root, opts))
    row = registry.get("v0001")
    # The registry names the local copy (what vLLM loads here) and the stored one (what any host can fetch).
    assert row["path"] == first.path and Path(first.path).parent == tmp_path / "trainer-host" / "models"
    local_manifest = (Path(first.path) / MANIFEST_FILE).read_bytes()
    assert row["manifest_sha256"] == hashlib.sha256(local_manifest).hexdigest()
    assert row["artifact_uri"] == first.artifact_uri == table_uri(root, "models", "v0001", row["manifest_sha256"][:16])
    metrics = json.loads(row["metrics"])
    assert metrics["artifact_bytes_uploaded"] > 0
    # The bucket's secret key is in the storage options; neither the registry nor a checkpoint keeps it.
    secret_keys = [k for k in opts if is_secret_option(k)]
    stored_configs = [
        json.loads(row["config"]),
        json.loads((Path(first.path) / "checkpoint.json").read_text())["config"],
    ]
    assert secret_keys and all(c["storage_options"][k] == "***" for c in stored_configs for k in secret_keys)

    # In the bucket: every file of the folder, byte for byte, and a manifest whose hashes match them.
    stored = _bucket_files(row["artifact_uri"], opts)
    local = {p.relative_to(first.path).as_posix(): p.read_bytes() for p in Path(first.path).rglob("*") if p.is_file()}
    assert stored == local
    assert {"adapter_model.safetensors", "adapter_config.json", "checkpoint.json", "optimizer.pt"} <= set(stored)
    manifest = json.loads(stored[MANIFEST_FILE])["files"]
    assert set(manifest) == set(stored) - {MANIFEST_FILE}
    for rel, entry in manifest.items():
        assert entry == {"sha256": hashlib.sha256(stored[rel]).hexdigest(), "size": len(stored[rel])}, rel
    assert metrics["artifact_bytes_uploaded"] == sum(len(b) for rel, b in stored.items() if rel != MANIFEST_FILE)

    # Lineage: exactly the 8 transitions, read at the pinned version, and nothing left pending.
    lineage = Lineage(Lake(root, opts))
    assert lineage.summary("v0001") == {
        "transitions": 8,
        "distinct_transitions": 8,
        "tables": [table_uri(root, "transitions")],
        "table_versions": [end],
    }
    assert count_pending(cfg) == (0, end)
    assert train_once(cfg=cfg).reason.startswith("no new transitions")

    # A fresh trainer host: the serving version's folder is not on its disk, so resuming fetches it.
    registry.set_status("v0001", "published", published_at=dt.datetime.now(dt.UTC))
    shutil.rmtree(first.path)
    end2 = write_transitions(root, _rows(8, 4), storage_options=opts)
    fresh = cfg.replace(checkpoint_dir=str(tmp_path / "fresh-host" / "models"))
    second = train_once(cfg=fresh)
    assert second.version == "v0002" and second.parent_version == "v0001" and second.n_transitions == 4
    fetched = tmp_path / "fresh-host" / "models" / row["manifest_sha256"][:16] / "v0001"
    verify_folder(fetched, row["manifest_sha256"])  # every hash, not only sizes
    assert json.loads((fetched / "checkpoint.json").read_text())["version"] == "v0001"
    assert lineage.summary("v0002")["transitions"] == 4 and lineage.summary("v0002")["table_versions"] == [end2]
    assert registry.get("v0002")["artifact_uri"].startswith(f"{root}/models/v0002/")


def test_a_fresh_cache_downloads_and_verifies_and_a_changed_object_is_refused_by_name(
    object_store: ObjectStore, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # this host's state dir comes from its agentlake.toml below, not the session's AGENTLAKE_STATE_DIR
    monkeypatch.delenv("AGENTLAKE_STATE_DIR", raising=False)
    root, opts = object_store.lake_root(), object_store.storage_options
    write_transitions(root, _rows(0, 4), storage_options=opts)
    trained = train_once(cfg=_config(root, opts, tiny_model_dir, tmp_path / "trainer-host" / "models"))
    registry = Registry(Lake(root, opts))
    row = registry.get(trained.version)
    shutil.rmtree(trained.path)  # from here on, this machine is one that never trained v0001
    digest = row["manifest_sha256"]

    # `agentlake model fetch` on a host configured for the same lake: download, check, print the folder.
    state = tmp_path / "state"
    config = tmp_path / "agentlake.toml"
    options = "\n".join(f'{k} = "{v}"' for k, v in opts.items())
    config.write_text(f'[lake]\nroot = "{root}"\n[lake.storage_options]\n{options}\n[state]\ndir = "{state}"\n')
    fetched = CliRunner().invoke(app, ["model", "fetch", "v0001", "--config", str(config)])
    assert fetched.exit_code == 0, fetched.output
    folder = state / "models" / digest[:16] / "v0001"  # the version last: the gateway records that name
    assert str(folder) in "".join(fetched.output.split())  # rich wraps the long path
    verify_folder(folder, digest)
    assert sorted(p.name for p in folder.iterdir()) == sorted(_bucket_files(row["artifact_uri"], opts))
    # Once verified, the cached copy is used as is: the next call returns it without a download.
    assert local_copy(row, cache_dir=state / "models", storage_options=opts) == folder

    # One object changed in the bucket (same size, one byte different): a fresh cache refuses it by name.
    adapter_uri = table_uri(row["artifact_uri"], "adapter_model.safetensors")
    original = read_bytes(adapter_uri, opts)
    assert original is not None
    _overwrite(adapter_uri, opts, original[:-1] + bytes([original[-1] ^ 0xFF]))
    cache = tmp_path / "fresh-cache"
    with pytest.raises(ArtifactError, match=r"v0001: adapter_model\.safetensors at .* does not match its manifest"):
        local_copy(row, cache_dir=cache, storage_options=opts)
    assert not any(p.is_file() for p in cache.rglob("*"))  # nothing half-downloaded is left to be used

    # Publishing it from such a host fails before vLLM is touched, and the registry records why.
    publisher = Publisher(registry, f"http://127.0.0.1:{free_port()}", "policy", cache_dir=tmp_path / "pub-cache")
    with pytest.raises(PublishError, match="adapter_model.safetensors"):
        publisher.publish("v0001")
    failed = registry.get("v0001")
    assert failed["publish_status"] == "failed" and "adapter_model.safetensors" in failed["publish_error"]

    # A changed manifest is refused too: the registry's hash pins it.
    _overwrite(adapter_uri, opts, original)
    manifest_uri = table_uri(row["artifact_uri"], MANIFEST_FILE)
    _overwrite(manifest_uri, opts, read_bytes(manifest_uri, opts) + b" ")
    with pytest.raises(ArtifactError, match="manifest.json at .* the registry recorded"):
        local_copy(row, cache_dir=cache, storage_options=opts)


@pytest.mark.slow  # two hosts' rounds and downloads on the object store: ~8 s
def test_publish_and_rollback_from_a_host_that_never_trained_load_verified_downloads(
    object_store: ObjectStore, tiny_model_dir: Path, tmp_path: Path, vllm: FakeVllm
) -> None:
    root, opts = object_store.lake_root(), object_store.storage_options
    cfg = _config(root, opts, tiny_model_dir, tmp_path / "trainer-host" / "models").replace(min_new_transitions=1)
    for v in range(2):
        write_transitions(root, _rows(4 * v, 4), storage_options=opts)
        shutil.rmtree(train_once(cfg=cfg).path)  # the trainer host's disk is gone; the lake has the versions
    registry = Registry(Lake(root, opts))
    serving_host = tmp_path / "serving-host" / "models"
    publisher = Publisher(registry, vllm.url, "agentlake-policy", cache_dir=serving_host)

    assert publisher.publish("v0001").status == "published"
    assert publisher.publish("v0002").status == "published"
    assert publisher.rollback().version == "v0001"
    folders = {v: serving_host / registry.get(v)["manifest_sha256"][:16] / v for v in ("v0001", "v0002")}
    assert vllm.loads() == [str(folders["v0001"]), str(folders["v0002"]), str(folders["v0001"])]
    for v, folder in folders.items():
        verify_folder(folder, registry.get(v)["manifest_sha256"])
        assert (folder / "adapter_model.safetensors").exists() and (folder / "adapter_config.json").exists()
    assert registry.serving()["version"] == "v0001"
