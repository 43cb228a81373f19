"""Settings that are secrets, and how an error shows a value without them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

# Settings whose values are secrets: an error names them but never shows their value.
SECRET_SETTINGS = frozenset(
    {
        "collector.auth_tokens",
        "gateway.admin_token",
        "kafka.sasl_password",
        "kafka.ssl_key_password",
        "lake.storage_options",
    }
)
_SECRET_WORDS = ("password", "secret", "credential", "private_key")
HIDDEN = "<hidden>"


def _secret_name(name: str) -> bool:
    lowered = name.lower()
    return any(w in lowered for w in _SECRET_WORDS)


def _redact_url(value: str) -> str:
    """A URL with the password of its user part replaced."""
    try:
        url = urlsplit(value)
        if url.password is None:
            return value
        host = url.netloc.rpartition("@")[2]
        return url._replace(netloc=f"{url.username or ''}:{HIDDEN}@{host}").geturl()
    except ValueError:
        return HIDDEN


def redact(path: str, value: Any) -> Any:
    """``value`` of the setting ``path`` as an error may show it: secrets hidden, at any depth."""
    name = path.rsplit(".", 1)[-1]
    if path in SECRET_SETTINGS or _secret_name(name):
        return HIDDEN
    if isinstance(value, str) and "://" in value:
        return _redact_url(value)
    if isinstance(value, Mapping):
        return {k: redact(f"{path}.{k}", v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(path, v) for v in value]
    return value
