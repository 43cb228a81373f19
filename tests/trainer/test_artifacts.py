"""Manifests and local copies on a local lake: what is checked quickly, what fully, what is refused."""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from collectors.gateway.recording import served_policy
from tests.objectstore import ObjectStore
from trainer.artifacts import MANIFEST_FILE, local_copy, store_version, verify_folder, write_manifest
from trainer.errors import ArtifactError
from trainer.offpolicy import source_of


def _version_folder(root: Path) -> Path:
    folder = root / "models" / "v0001"
    (folder / "sub").mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 64)
    (folder / "sub" / "extra.json").write_text('{"a": 1}')
    return folder


def test_manifest_lists_every_file_and_its_hash_pins_them(tmp_path: Path) -> None:
    folder = _version_folder(tmp_path)
    digest = write_manifest(folder)
    data = (folder / MANIFEST_FILE).read_bytes()
    assert digest == hashlib.sha256(data).hexdigest()
    files = json.loads(data)["files"]
    assert sorted(files) == ["adapter_model.safetensors", "sub/extra.json"]
    assert files["sub/extra.json"] == {"sha256": hashlib.sha256(b'{"a": 1}').hexdigest(), "size": 8}
    assert write_manifest(folder) == digest  # deterministic: the same files, the same hash
    verify_folder(folder, digest)

    # Same size, one byte changed: the quick check (sizes) passes, the full check names the file.
    weights = folder / "adapter_model.safetensors"
    weights.write_bytes(b"\xff" + weights.read_bytes()[1:])
    verify_folder(folder, digest, hashes=False)
    with pytest.raises(ArtifactError, match=r"adapter_model\.safetensors has sha256 .* its manifest says"):
        verify_folder(folder, digest)
    (folder / "sub" / "extra.json").unlink()
    with pytest.raises(ArtifactError, match=r"extra\.json is missing"):
        verify_folder(folder, digest, hashes=False)
    with pytest.raises(ArtifactError, match="the registry recorded"):
        verify_folder(folder, "0" * 64)


def test_a_local_lake_registers_the_folder_itself_and_refuses_it_when_damaged(tmp_path: Path) -> None:
    folder = _version_folder(tmp_path / "lake")
    stored = store_version(folder, lake_root=str(tmp_path / "lake"), version="v0001")
    assert stored.uri == str(folder) and stored.bytes_uploaded == 0  # no copy
    assert sorted(p.name for p in (tmp_path / "lake" / "models").iterdir()) == ["v0001"]
    row = {
        "version": "v0001",
        "path": str(folder),
        "artifact_uri": stored.uri,
        "manifest_sha256": stored.manifest_sha256,
    }
    assert local_copy(row, cache_dir=tmp_path / "cache") == folder
    (folder / "adapter_model.safetensors").write_bytes(b"short")
    with pytest.raises(ArtifactError, match=r"adapter_model\.safetensors has 5 bytes"):
        local_copy(row, cache_dir=tmp_path / "cache")


def test_rows_from_before_stored_artifacts_use_the_trainer_folder_or_say_what_to_do(tmp_path: Path) -> None:
    folder = _version_folder(tmp_path)
    old = {"version": "v0001", "path": str(folder), "artifact_uri": None, "manifest_sha256": None}
    assert local_copy(old, cache_dir=tmp_path / "cache") == folder
    with pytest.raises(ArtifactError, match="no stored artifact .* copy that folder here or train a new version"):
        local_copy({**old, "path": str(tmp_path / "elsewhere")}, cache_dir=tmp_path / "cache")


def test_a_manifest_naming_a_path_outside_its_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "v0001"
    folder.mkdir()
    data = json.dumps({"manifest": 1, "files": {"../../etc/passwd": {"sha256": "0" * 64, "size": 1}}}).encode()
    (folder / MANIFEST_FILE).write_bytes(data)
    with pytest.raises(ArtifactError, match="a path outside the version folder"):
        verify_folder(folder, hashlib.sha256(data).hexdigest())


def test_a_downloaded_version_is_loaded_from_a_folder_named_after_it(object_store: ObjectStore, tmp_path: Path) -> None:
    """vLLM reports the folder it loaded as the adapter's root; the gateway records its last part.

    A download into ``<cache>/<version>-<hash>/`` made every call to that adapter ``policy@v0001-<hash>``,
    which is no registry version: the trainer saw none of that data as on-policy.
    """
    root, opts = object_store.lake_root(), object_store.storage_options
    stored = store_version(_version_folder(tmp_path / "trainer"), lake_root=root, version="v0001", storage_options=opts)
    row = {"version": "v0001", "path": None, "artifact_uri": stored.uri, "manifest_sha256": stored.manifest_sha256}
    cache = tmp_path / "cache"
    folder = local_copy(row, cache_dir=cache, storage_options=opts)
    assert folder == cache / stored.manifest_sha256[:16] / "v0001"
    verify_folder(folder, stored.manifest_sha256)
    recorded = served_policy("policy", {"policy": ("base", str(folder))}).version
    assert recorded == "policy@v0001" and source_of(recorded) == "v0001"
    # A second fetch uses the verified copy, and no temporary folder is left beside it.
    assert local_copy(row, cache_dir=cache, storage_options=opts) == folder
    assert sorted(p.name for p in folder.parent.iterdir()) == ["v0001"]

    # Fetches racing into an empty cache (threads of one process, as a loader may run them): each gets
    # the one verified folder, and the losers' temporary folders are gone.
    fresh = tmp_path / "fresh-cache"
    with ThreadPoolExecutor(4) as pool:
        got = set(pool.map(lambda _: local_copy(row, cache_dir=fresh, storage_options=opts), range(4)))
    assert got == {fresh / stored.manifest_sha256[:16] / "v0001"}
    verify_folder(next(iter(got)), stored.manifest_sha256)
    assert sorted(p.name for p in (fresh / stored.manifest_sha256[:16]).iterdir()) == ["v0001"]
