"""One translation of the lake's storage options for every client that is not delta-rs.

Settings hold the object-store credentials once, in delta-rs's spelling (``lake.storage_options``:
``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_ALLOW_HTTP``, ``GOOGLE_SERVICE_ACCOUNT``,
``AZURE_STORAGE_ACCOUNT_NAME`` ...). Files that are not Delta tables (checkpoints, adapters) go
through a pyarrow filesystem built here from the same options, so a lake on S3, GCS or Azure needs
no second set of credentials.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

import pyarrow.fs as pafs

from schemas.uris import is_local, local_path, normalize_uri

CHUNK = 8 << 20  # bytes per read and write when copying files


# Storage options that are credentials (delta-rs / object_store keys): AWS_SECRET_ACCESS_KEY,
# AWS_SESSION_TOKEN, AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_KEY, GOOGLE_SERVICE_ACCOUNT_KEY ...
_SECRET_OPTION = re.compile(r"secret|password|token|sas|_key$", re.IGNORECASE)


def is_secret_option(key: str) -> bool:
    """True for a storage option that holds a credential (an access key id is not one)."""
    return bool(_SECRET_OPTION.search(key))


def without_secrets(storage_options: Mapping[str, str]) -> dict[str, str]:
    """The options with every credential's value masked: what may be stored or shown."""
    return {k: ("***" if is_secret_option(k) else v) for k, v in storage_options.items()}


def _opts(storage_options: Mapping[str, str] | None) -> dict[str, str]:
    return {k.upper(): str(v) for k, v in (storage_options or {}).items()}


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def filesystem(
    uri: str, storage_options: Mapping[str, str] | None = None, *, s3_extra: Mapping[str, object] | None = None
) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem for ``uri`` and the path inside it (``bucket/key`` for object stores).

    ``s3_extra``: further ``pyarrow.fs.S3FileSystem`` arguments (timeouts, bucket creation) for S3.
    """
    if is_local(uri):
        return pafs.LocalFileSystem(), local_path(uri)
    norm = normalize_uri(uri)
    scheme, rest = norm.split("://", 1)
    opts = _opts(storage_options)
    if scheme == "s3":
        endpoint = opts.get("AWS_ENDPOINT_URL") or opts.get("AWS_ENDPOINT") or ""
        kwargs: dict[str, object] = {}
        if endpoint:
            kwargs["endpoint_override"] = endpoint.split("://", 1)[-1]
            kwargs["scheme"] = "http" if endpoint.startswith("http://") else "https"
        if "AWS_ACCESS_KEY_ID" in opts:
            kwargs["access_key"] = opts["AWS_ACCESS_KEY_ID"]
            kwargs["secret_key"] = opts.get("AWS_SECRET_ACCESS_KEY", "")
            if "AWS_SESSION_TOKEN" in opts:
                kwargs["session_token"] = opts["AWS_SESSION_TOKEN"]
        region = opts.get("AWS_REGION") or opts.get("AWS_DEFAULT_REGION")
        if region:
            kwargs["region"] = region
        if endpoint:
            kwargs["force_virtual_addressing"] = _truthy(opts.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST"))
        return pafs.S3FileSystem(**kwargs, **(s3_extra or {})), rest
    if scheme in ("gs", "gcs"):
        return pafs.GcsFileSystem(), rest
    if scheme in ("az", "azure", "abfs", "abfss"):
        account = opts.get("AZURE_STORAGE_ACCOUNT_NAME") or opts.get("AZURE_STORAGE_ACCOUNT") or ""
        key = opts.get("AZURE_STORAGE_ACCOUNT_KEY") or opts.get("AZURE_STORAGE_ACCESS_KEY")
        authority, slash, key_path = rest.partition("/")
        container_path = authority.split("@", 1)[0] + slash + key_path  # abfss://container@account.../path
        return pafs.AzureFileSystem(account_name=account, account_key=key), container_path
    raise ValueError(f"{uri!r}: no filesystem for the scheme {scheme!r} (use s3://, gs://, az:// or a local path)")


def upload_dir(
    local_dir: str | os.PathLike[str],
    uri: str,
    storage_options: Mapping[str, str] | None = None,
    *,
    exclude: Collection[str] = (),
) -> int:
    """Copy every file under ``local_dir`` to ``uri`` (same relative paths) but ``exclude``; the bytes copied."""
    fs, base = filesystem(uri, storage_options)
    src = Path(local_dir)
    total = 0
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = path.relative_to(src).as_posix()
        if rel in exclude:
            continue
        dest = posixpath.join(base, rel)
        fs.create_dir(posixpath.dirname(dest), recursive=True)
        with open(path, "rb") as fin, fs.open_output_stream(dest) as fout:
            while chunk := fin.read(CHUNK):
                fout.write(chunk)
                total += len(chunk)
    return total


def download_file(
    uri: str,
    dest: str | os.PathLike[str],
    storage_options: Mapping[str, str] | None = None,
    *,
    on_chunk: Callable[[bytes], object] | None = None,
) -> int | None:
    """Copy one object to ``dest``, passing each chunk to ``on_chunk`` (a hash); the bytes, None when absent."""
    fs, path = filesystem(uri, storage_options)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    total = 0
    with fs.open_input_stream(path) as fin, open(dest, "wb") as fout:
        while chunk := fin.read(CHUNK):
            if on_chunk is not None:
                on_chunk(chunk)
            fout.write(chunk)
            total += len(chunk)
    return total


def read_bytes(uri: str, storage_options: Mapping[str, str] | None = None) -> bytes | None:
    """The whole object at ``uri`` (meant for small files: manifests), or None when there is none."""
    fs, path = filesystem(uri, storage_options)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as fin:
        return bytes(fin.read())


def write_bytes(uri: str, data: bytes, storage_options: Mapping[str, str] | None = None) -> None:
    """Write ``data`` as the object at ``uri`` (replacing it), creating parent folders on a local path."""
    fs, path = filesystem(uri, storage_options)
    fs.create_dir(posixpath.dirname(path), recursive=True)
    with fs.open_output_stream(path) as fout:
        fout.write(data)
