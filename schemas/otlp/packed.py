"""Token-id and logprob arrays on the wire, checked and decoded without parsing them item by item.

Token ids and logprobs arrive as an ``ArrayValue`` of one ``AnyValue`` per token: parsing thousands of
small messages costs more than the rest of the span. Serialized canonically (as protobuf re-serializes
a parsed message), every item has a fixed layout, so the bytes alone show whether an array is clean
and what it holds. The collector checks arrays this way (``clean_token_ids``, ``clean_logprobs``);
the pipeline decodes all arrays of a batch in one numpy pass (``decode_arrays``). Both take the bytes
of the ``ArrayValue`` (the lite view's ``AnyValue.array_value``). Anything else is left to the slow
path, which reads the message and names what is wrong.

Item layouts:
- an id: ``0x0a`` (``values``), its length, ``0x18`` (``int_value``) and a varint;
- a logprob: ``0x0a 0x09 0x21`` (``double_value``) and 8 little-endian bytes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue

from schemas import span_checks
from schemas.otlp.wire import field_tag
from schemas.span_checks import TOKEN_ID_LIMIT

# The attributes whose arrays are read this way: token ids (every convention) and logprobs.
TOKEN_ID_KEYS = frozenset(k for keys in span_checks.TOKEN_ID_KEYS for k in keys)
LOGPROB_KEYS = frozenset(span_checks.LOGPROB_KEYS)
PACKED_KEYS = TOKEN_ID_KEYS | LOGPROB_KEYS

_ITEM = field_tag(ArrayValue, "values")[0]
_INT = field_tag(AnyValue, "int_value", wire_type=0)[0]
_DOUBLE = field_tag(AnyValue, "double_value", wire_type=1)[0]
_DOUBLE_ITEM_SIZE = 11  # item tag, length 9, double tag, 8 bytes
_DOUBLE_HEAD = bytes([_ITEM, _DOUBLE_ITEM_SIZE - 2, _DOUBLE])

# Ids below 2**31: a varint of at most 4 bytes, or of 5 whose last byte is at most 7; the item's length
# byte is the varint's plus 1.
_TOKEN_IDS = re.compile(
    b"(?:%s[\\x02-\\x06]%s(?:[\\x80-\\xff]{0,3}[\\x00-\\x7f]|[\\x80-\\xff]{4}[\\x00-\\x07]))*"
    % (re.escape(bytes([_ITEM])), re.escape(bytes([_INT])))
)


def clean_token_ids(wire: bytes) -> bool:
    """Whether ``wire`` is an array of ints, each in ``[0, 2**31)`` (empty included)."""
    return _TOKEN_IDS.fullmatch(wire) is not None


def clean_logprobs(wire: bytes) -> bool:
    """Whether ``wire`` is an array of doubles, none NaN (empty included)."""
    if not wire:
        return True
    values = doubles(np.frombuffer(wire, np.uint8))
    return values is not None and not np.isnan(values).any()


def int_items(b: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Bytes of int items to their int64 values and each item's offset; None if they are anything else.

    Every item has exactly four bytes below 0x80 (item tag, length, int tag, last varint byte), so
    their positions give every item's bounds at once, and checking them checks the whole layout.
    Varints longer than 5 bytes (negative or huge ids) are refused too, and left to the slow path.
    """
    ends = np.flatnonzero(b < 0x80)
    if ends.size == 0 or ends.size % 4:
        return None
    g = ends.reshape(-1, 4)
    tag, length, int_tag, last = g[:, 0], g[:, 1], g[:, 2], g[:, 3]
    varint_sizes = last - int_tag
    if (
        tag[0] != 0
        or last[-1] != b.size - 1
        or not (tag[1:] == last[:-1] + 1).all()
        or not (length == tag + 1).all()
        or not (int_tag == length + 1).all()
        or not (b[tag] == _ITEM).all()
        or not (b[int_tag] == _INT).all()
        or not (b[length] == varint_sizes + 1).all()
        or int(varint_sizes.max()) > 5
    ):
        return None
    start = int_tag + 1
    out = (b[start] & 0x7F).astype(np.int64)
    for j in range(1, int(varint_sizes.max())):
        longer = varint_sizes > j
        out[longer] |= (b[start[longer] + j] & 0x7F).astype(np.int64) << (7 * j)
    return out, tag


def int_array(data: bytes) -> np.ndarray | None:
    """One array of int items to int64, or None if it is not exactly that."""
    got = int_items(np.frombuffer(data, np.uint8))
    return None if got is None else got[0]


def doubles(b: np.ndarray) -> np.ndarray | None:
    """Bytes of double items to float64 (fixed width: one reshape decodes them); None if anything else."""
    if b.size == 0 or b.size % _DOUBLE_ITEM_SIZE:
        return None
    rows = b.reshape(-1, _DOUBLE_ITEM_SIZE)
    head = np.frombuffer(_DOUBLE_HEAD, np.uint8)
    if not (rows[:, : len(_DOUBLE_HEAD)] == head).all():
        return None
    return np.ascontiguousarray(rows[:, len(_DOUBLE_HEAD) :]).view("<f8").ravel()


def decode_arrays(pieces: Sequence[bytes], is_int: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """Many arrays decoded in one pass: their values, concatenated, and each one's length.

    Ints come back as int32 (ids at or above 2**31 refuse the fast pass), doubles as float32. None
    when any piece is not cleanly one kind, or holds NaN; the caller then reads them one by one.
    """
    sizes = np.fromiter(map(len, pieces), np.int64, len(pieces))
    b = np.frombuffer(b"".join(pieces), np.uint8)
    if not is_int:
        if (sizes % _DOUBLE_ITEM_SIZE).any():
            return None
        values = doubles(b) if b.size else np.zeros(0)
        # NaN is refused by span_checks.logprobs_problem: such a batch takes the slow path, which says so
        if values is None or np.isnan(values).any():
            return None
        return values.astype(np.float32), sizes // _DOUBLE_ITEM_SIZE
    if not b.size:
        return np.zeros(0, np.int32), sizes
    got = int_items(b)
    if got is None:
        return None
    values, tags = got
    starts = np.cumsum(sizes) - sizes
    first = np.searchsorted(tags, starts)  # the first item at or after each piece's start
    nonempty = sizes > 0
    f = first[nonempty]
    # every piece starts on an item: a piece that is not one whole array never passes as one
    if (f >= tags.size).any() or (tags[f] != starts[nonempty]).any() or int(values.max()) >= TOKEN_ID_LIMIT:
        return None
    return values.astype(np.int32), np.diff(np.append(first, tags.size))
