"""JSON text of attribute values, written by one encoder built once (the JSON columns of `spans`)."""

from __future__ import annotations

import json
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

import numpy as np


def _default(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(f"cannot write {type(v).__name__} as JSON")


# json.dumps(..., default=...) builds an encoder per call; the C encoder, made once, writes the same text.
_JSON = json.JSONEncoder(default=_default)
_C_ENCODER = (
    c_make_encoder(None, _default, encode_basestring_ascii, None, ": ", ", ", False, False, True)
    if c_make_encoder is not None
    else None
)


def dumps(obj: Any) -> str:
    """``json.dumps(obj)`` (numpy arrays as lists), without its per-call setup."""
    if _C_ENCODER is None:
        return _JSON.encode(obj)
    return "".join(_C_ENCODER(obj, 0))
