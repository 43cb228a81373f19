"""One spelling per lake location: every table path is normalized here before it is used or compared.

Pipelines, trainer, registry and CLI all build table locations with :func:`table_uri` and compare
them with :func:`same_location`, so ``lake``, ``./lake/``, ``/abs/lake`` and ``file:///abs/lake``
name one lake (and one training cursor), as do ``s3://bucket/lake/`` and ``s3a://bucket//lake``.

Rules (pure string work; local paths also read the working directory to become absolute):

- local paths (no scheme, ``file:``, ``file://``, ``file://localhost/``): ``~`` expanded, made absolute,
  ``.``/``..``, repeated and trailing slashes removed; returned as a plain path (delta-rs, DuckDB and
  Polars all take one);
- ``s3a://`` and ``s3n://`` are ``s3://`` (the same bucket namespace);
- every other scheme (``s3``, ``gs``, ``gcs``, ``az``, ``azure``, ``abfs``, ``abfss``, ``adl``, ``http(s)``,
  ``memory``, ...) is kept as given, lower-cased, with the bucket/container/host untouched and the key's
  empty and ``.`` segments and the trailing slash removed (``..`` is kept: object stores take it
  literally).
"""

from __future__ import annotations

import os
import re
from urllib.parse import unquote

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.DOTALL)
_SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3"}


def _split(uri: str) -> tuple[str | None, str]:
    """(scheme or None for a local path, the rest); a one-letter scheme is a Windows drive."""
    match = _SCHEME.match(uri)
    if match is None or len(match.group(1)) == 1:
        return None, uri
    return match.group(1).lower(), match.group(2)


def _local(path: str) -> str:
    out = os.path.abspath(os.path.expanduser(path))
    if os.name != "nt" and out.startswith("//") and not out.startswith("///"):
        out = out[1:]  # POSIX keeps a leading '//' as implementation-defined; it is '/' everywhere we run
    return out


def _file_path(rest: str) -> str:
    """The path of a ``file://`` URI's remainder (``/abs``, ``localhost/abs``, or a relative ``rel``)."""
    if rest.startswith("localhost/"):
        rest = rest[len("localhost") :]
    return unquote(rest)


def is_local(uri: str | os.PathLike[str]) -> bool:
    """Whether ``uri`` names the local file system (a plain path or a ``file:`` URI)."""
    scheme, _ = _split(os.fspath(uri).strip())
    return scheme is None or scheme == "file"


def normalize_uri(uri: str | os.PathLike[str]) -> str:
    """The one spelling of a lake or table location (see the module docstring for the rules)."""
    text = os.fspath(uri).strip()
    if not text:
        raise ValueError("empty lake or table location")
    scheme, rest = _split(text)
    if scheme is None:
        if text.startswith("file:"):  # file:/abs or file:rel (no authority)
            return _local(unquote(text[len("file:") :]))
        return _local(text)
    if scheme == "file":
        return _local(_file_path(rest))
    scheme = _SCHEME_ALIASES.get(scheme, scheme)
    authority, _, key = rest.partition("/")
    segments = [s for s in key.split("/") if s not in ("", ".")]
    return f"{scheme}://{authority}" + ("/" + "/".join(segments) if segments else "")


def table_uri(root: str | os.PathLike[str], *parts: str) -> str:
    """``root`` joined with ``parts`` (a table name, or a table and a sub-folder), normalized."""
    base = normalize_uri(root)
    if not parts:
        return base
    if is_local(base):
        return normalize_uri(os.path.join(base, *parts))
    return normalize_uri("/".join([base, *parts]))


def same_location(a: str | os.PathLike[str] | None, b: str | os.PathLike[str] | None) -> bool:
    """Whether two spellings name the same place (None matches only None)."""
    if a is None or b is None:
        return a is None and b is None
    return normalize_uri(a) == normalize_uri(b)


def local_path(uri: str | os.PathLike[str]) -> str:
    """The absolute local path of a local ``uri``; a ValueError for an object-store URI."""
    if not is_local(uri):
        raise ValueError(f"{os.fspath(uri)!r} is not a local path")
    return normalize_uri(uri)
