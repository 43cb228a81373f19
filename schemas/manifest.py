"""The manifest that pins a model version's files, as the one who serves it reads it back.

Every version folder holds ``manifest.json`` (written by ``trainer.artifacts.write_manifest``: each
file's sha256 and size), and the registry records the sha256 of the manifest's bytes
(``model_versions.manifest_sha256``): one hash for every byte of the version. Whoever has the folder
that vLLM loaded (the gateway, on the vLLM host) can recompute that hash and record it with each call,
so a row says which registered files sampled it, not only which name they were served under.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

MANIFEST_FILE = "manifest.json"


class ManifestHashes:
    """The sha256 of ``<folder>/manifest.json`` per folder, re-read only when the file's mtime or size changed.

    A folder without a readable manifest (on another host, a base model, a version from before
    manifests) hashes to None: the caller records that it does not know, and never fails for it.
    """

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, int, str]] = {}  # folder -> (mtime_ns, size, sha256)

    def sha256(self, folder: str | os.PathLike[str] | None) -> str | None:
        """The manifest's sha256 hex, or None when ``folder`` has no readable manifest."""
        if not folder:
            return None
        path = Path(folder) / MANIFEST_FILE
        key = os.fspath(folder)
        try:
            st = path.stat()
            seen = self._seen.get(key)
            if seen is not None and seen[:2] == (st.st_mtime_ns, st.st_size):
                return seen[2]
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except (OSError, ValueError):  # missing, unreadable, or a path the OS refuses
            self._seen.pop(key, None)
            return None
        if len(self._seen) > 1024:  # many adapters over a long life: stay bounded
            self._seen.clear()
        self._seen[key] = (st.st_mtime_ns, st.st_size, digest)
        return digest
