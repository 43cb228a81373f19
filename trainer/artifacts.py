"""A model version's files on the lake: stored beside the tables, pinned by one hash, verified on fetch.

Every version folder (``trainer.checkpoints``: the LoRA adapter or the full weights, ``checkpoint.json``,
``optimizer.pt`` for resuming) carries a ``manifest.json``::

    {"manifest": 1, "files": {"adapter_model.safetensors": {"sha256": "...", "size": 1234}, ...}}

and ``model_versions`` records where the files are (``artifact_uri``) and the sha256 of the manifest's
bytes (``manifest_sha256``), so one registry value pins every byte of the version. Where they are:

- a lake on an object store: ``<lake root>/models/<version>/<first 16 hex of manifest_sha256>/``.
  The trainer writes the folder on its own disk first (vLLM loads local paths; the registry's
  ``path``), then uploads it, manifest last: a manifest in the bucket means a complete upload. The
  hash in the key makes each attempt its own folder, so a round that lost the race for a version
  name, or died before registering, never overwrites the files of the registered one.
- a lake in a local folder: the checkpoint folder itself (``<lake>/models/<version>/``), no copy.

Whoever loads a version (the next round resuming from it, ``Publisher`` for vLLM, `agentlake model
publish|rollback`) asks :func:`local_copy` for a folder on this machine: the registered ``path`` or
an earlier download when its manifest matches the registry (and every file has its size), else a
download into ``<cache>/<hash prefix>/<version>/`` that checks each file's size and sha256 as it
arrives and is renamed into place only when all match. A mismatch is an ``ArtifactError`` that names
the file. The version is the last part of every folder this returns because vLLM reports an
adapter's folder as its root and the gateway records ``<served name>@<last part of the root>`` as
each call's policy version, which the trainer matches to registry versions
(``trainer.offpolicy.source_of``); the hash prefix above it keeps two attempts at one name apart.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from schemas.manifest import MANIFEST_FILE  # the gateway hashes the same file (schemas.manifest)
from schemas.storage import download_file, read_bytes, upload_dir, write_bytes
from schemas.uris import is_local, local_path, normalize_uri, table_uri
from trainer.errors import ArtifactError

log = logging.getLogger(__name__)

MODELS_DIR = "models"  # under the lake root
MANIFEST_FORMAT = 1
KEY_HASH_CHARS = 16  # of the manifest's sha256, in the object-store key


@dataclass(frozen=True)
class StoredArtifact:
    """Where one version's files were stored and the hash that pins them."""

    uri: str
    manifest_sha256: str
    bytes_uploaded: int  # 0 on a local lake, where the folder is the artifact
    seconds: float

    def metrics(self) -> dict[str, float]:
        """What storing cost, for the registry row's metrics."""
        return {"artifact_bytes_uploaded": float(self.bytes_uploaded), "artifact_store_seconds": self.seconds}


def hash_file(path: str | os.PathLike[str]) -> tuple[str, int]:
    """(sha256 hex, size in bytes) of one file, read in chunks."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def write_manifest(folder: str | os.PathLike[str]) -> str:
    """Hash every file under ``folder`` into its ``manifest.json``; the sha256 of the manifest's bytes."""
    root = Path(folder)
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel != MANIFEST_FILE:
            sha, size = hash_file(path)
            files[rel] = {"sha256": sha, "size": size}
    data = (json.dumps({"manifest": MANIFEST_FORMAT, "files": files}, indent=2, sort_keys=True) + "\n").encode()
    (root / MANIFEST_FILE).write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _manifest_files(data: bytes, where: str) -> dict[str, dict[str, Any]]:
    """The file table of a manifest, with every path checked to stay inside its folder."""
    try:
        doc = json.loads(data)
        files = doc["files"]
        entries = {str(rel): {"sha256": str(e["sha256"]), "size": int(e["size"])} for rel, e in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ArtifactError(f"{where}: not a readable manifest ({exc!r})") from exc
    for rel in entries:
        parts = PurePosixPath(rel).parts
        if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
            raise ArtifactError(f"{where}: manifest names {rel!r}, a path outside the version folder")
    return entries


def store_version(
    folder: str | os.PathLike[str],
    *,
    lake_root: str,
    version: str,
    storage_options: Mapping[str, str] | None = None,
) -> StoredArtifact:
    """Put a version folder under the lake (see the module docstring); its manifest is written if absent."""
    t0 = time.perf_counter()
    src = Path(folder).absolute()
    manifest = src / MANIFEST_FILE
    digest = hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.exists() else write_manifest(src)
    if is_local(lake_root):
        return StoredArtifact(normalize_uri(src), digest, 0, time.perf_counter() - t0)
    uri = table_uri(lake_root, MODELS_DIR, version, digest[:KEY_HASH_CHARS])
    try:
        n = upload_dir(src, uri, storage_options, exclude={MANIFEST_FILE})
        write_bytes(table_uri(uri, MANIFEST_FILE), manifest.read_bytes(), storage_options)
    except OSError as exc:
        raise ArtifactError(f"{version}: uploading {src} to {uri} failed ({exc}); nothing was registered") from exc
    seconds = time.perf_counter() - t0
    log.info("stored %s at %s (%.1f MB in %.2fs)", version, uri, n / 1e6, seconds)
    return StoredArtifact(uri, digest, n, seconds)


def verify_folder(folder: str | os.PathLike[str], manifest_sha256: str, *, hashes: bool = True) -> None:
    """Raise ``ArtifactError`` naming the first file of ``folder`` that its registered manifest disowns.

    ``hashes=False`` checks the manifest's hash and each file's size only: the quick check for a
    copy that was verified when it was written.
    """
    root = Path(folder)
    manifest = root / MANIFEST_FILE
    if not manifest.is_file():
        raise ArtifactError(f"{root} has no {MANIFEST_FILE}; it is not a stored model version")
    data = manifest.read_bytes()
    got = hashlib.sha256(data).hexdigest()
    if got != manifest_sha256:
        raise ArtifactError(
            f"{manifest} has sha256 {got}, the registry recorded {manifest_sha256}: a different or changed version"
        )
    for rel, entry in _manifest_files(data, str(manifest)).items():
        path = root / rel
        if not path.is_file():
            raise ArtifactError(f"{path} is missing (listed in {manifest})")
        size = path.stat().st_size
        if size != entry["size"]:
            raise ArtifactError(f"{path} has {size} bytes, its manifest says {entry['size']}")
        if hashes and (sha := hash_file(path)[0]) != entry["sha256"]:
            raise ArtifactError(f"{path} has sha256 {sha}, its manifest says {entry['sha256']}")


def _intact(folder: Path, manifest_sha256: str) -> bool:
    try:
        verify_folder(folder, manifest_sha256, hashes=False)
    except ArtifactError:
        return False
    return True


def local_copy(
    row: Mapping[str, Any],
    *,
    cache_dir: str | os.PathLike[str],
    storage_options: Mapping[str, str] | None = None,
) -> Path:
    """A folder on this machine holding registry ``row``'s version, downloaded and verified if need be."""
    version = str(row["version"])
    uri, digest = row.get("artifact_uri"), row.get("manifest_sha256")
    path = Path(row["path"]) if row.get("path") else None
    if not uri or not digest:  # registered before artifacts went to the lake: only the trainer's copy exists
        if path is not None and path.is_dir():
            return path
        raise ArtifactError(
            f"{version} has no stored artifact (registered before model_versions recorded one) and its "
            f"folder {path} is not on this machine: copy that folder here or train a new version"
        )
    if path is not None and _intact(path, digest):
        return path
    if is_local(uri):
        folder = Path(local_path(uri))
        verify_folder(folder, digest, hashes=False)  # raises, naming what is missing or changed
        return folder
    cached = Path(cache_dir).absolute() / digest[:KEY_HASH_CHARS] / version  # the version last: see the docstring
    if _intact(cached, digest):
        return cached
    return _download(version, uri, digest, cached, storage_options)


def _download(version: str, uri: str, digest: str, dest: Path, storage_options: Mapping[str, str] | None) -> Path:
    """Fetch every file the manifest lists into a temporary folder, check it, then rename it to ``dest``."""
    t0 = time.perf_counter()
    data = read_bytes(table_uri(uri, MANIFEST_FILE), storage_options)
    if data is None:
        raise ArtifactError(f"{version}: no {MANIFEST_FILE} at {uri}; the stored artifact is missing from the lake")
    got = hashlib.sha256(data).hexdigest()
    if got != digest:
        raise ArtifactError(
            f"{version}: {MANIFEST_FILE} at {uri} has sha256 {got}, the registry recorded {digest}: "
            "the stored artifact was changed after it was registered; refusing to use it"
        )
    # A temporary sibling of ``dest``, unique to this call (other processes or threads may fetch the
    # same version at once), so the rename into place is atomic on one file system.
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    except OSError as exc:
        raise ArtifactError(f"{version}: cannot create a folder beside {dest} to download into ({exc})") from exc
    total = 0
    try:
        for rel, entry in _manifest_files(data, f"{uri}/{MANIFEST_FILE}").items():
            sha = hashlib.sha256()
            size = download_file(table_uri(uri, rel), tmp / rel, storage_options, on_chunk=sha.update)
            if size is None:
                raise ArtifactError(f"{version}: {rel} is missing at {uri} (listed in its manifest)")
            if size != entry["size"] or sha.hexdigest() != entry["sha256"]:
                raise ArtifactError(
                    f"{version}: {rel} at {uri} does not match its manifest (sha256 {sha.hexdigest()}, "
                    f"{size} bytes; expected {entry['sha256']}, {entry['size']} bytes): the stored file is "
                    "corrupt or was changed; refusing to use it"
                )
            total += size
        (tmp / MANIFEST_FILE).write_bytes(data)
        if dest.exists() and not _intact(dest, digest):
            shutil.rmtree(dest)  # a damaged earlier copy: the verified download replaces it
        try:
            tmp.rename(dest)
        except OSError:
            if not _intact(dest, digest):  # not a concurrent fetch of the same version that finished first
                raise
    except OSError as exc:
        raise ArtifactError(f"{version}: downloading {uri} into {dest} failed ({exc})") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("fetched %s from %s (%.1f MB in %.2fs)", version, uri, total / 1e6, time.perf_counter() - t0)
    return dest
