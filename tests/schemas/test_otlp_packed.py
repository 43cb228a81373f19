"""Packed token arrays: the numpy pass and the collector's byte checks agree with protobuf's reading."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue

from schemas import span_checks
from schemas.otlp.packed import clean_logprobs, clean_token_ids, decode_arrays, int_array
from schemas.otlp.values import any_value


def _ints(values: list[int]) -> bytes:
    return ArrayValue(values=[AnyValue(int_value=v) for v in values]).SerializeToString()


def _doubles(values: list[float]) -> bytes:
    return ArrayValue(values=[AnyValue(double_value=v) for v in values]).SerializeToString()


def test_varints_match_protobuf() -> None:
    values = [0, 1, 127, 128, 16383, 16384, 49151, 2**31 - 1, 2**34]
    data = ArrayValue(values=[AnyValue(int_value=v) for v in values]).SerializeToString()
    got = int_array(data)
    assert got is not None and got.tolist() == values
    # anything but int items (a string, a negative 10-byte varint) is refused, never misread
    mixed = ArrayValue(values=[AnyValue(int_value=3), AnyValue(string_value="ab")]).SerializeToString()
    assert int_array(mixed) is None
    assert int_array(ArrayValue(values=[AnyValue(int_value=-1)]).SerializeToString()) is None


def test_pieces_decode_together_only_when_each_is_a_whole_array() -> None:
    got = decode_arrays([_ints([1, 300]), b"", _ints([70000]), _ints([5, 6, 7])], is_int=True)
    assert got is not None
    assert got[0].tolist() == [1, 300, 70000, 5, 6, 7] and got[1].tolist() == [2, 0, 1, 3]
    # Two broken halves of one array join into a clean one: refused, so each half meets the slow path.
    whole = _ints([1, 300])
    assert decode_arrays([whole[:3], whole[3:]], is_int=True) is None
    assert decode_arrays([_ints([2**31])], is_int=True) is None  # out of int32: the slow path's error
    doubles = _doubles([-0.5, -2.0])
    got = decode_arrays([doubles, b"", doubles[:11]], is_int=False)
    assert got is not None and got[0].tolist() == [-0.5, -2.0, -0.5] and got[1].tolist() == [2, 0, 1]
    assert decode_arrays([doubles[:5]], is_int=False) is None


_items = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(lambda v: AnyValue(int_value=v)),
    st.integers(0, 2**31 + 5).map(lambda v: AnyValue(int_value=v)),
    st.floats(allow_nan=True, allow_infinity=True, width=32).map(lambda v: AnyValue(double_value=v)),
    st.booleans().map(lambda v: AnyValue(bool_value=v)),
    st.text(max_size=3).map(lambda v: AnyValue(string_value=v)),
    st.just(AnyValue()),
)
_arrays = st.one_of(
    st.lists(st.integers(0, 2**31 + 5), max_size=20).map(lambda vs: [AnyValue(int_value=v) for v in vs]),
    st.lists(st.floats(allow_nan=True, width=32), max_size=20).map(lambda vs: [AnyValue(double_value=v) for v in vs]),
    st.lists(_items, max_size=8),
)


@given(_arrays)
def test_collector_checks_agree_with_span_checks(items: list[AnyValue]) -> None:
    """An array the byte checks pass is one span_checks passes, read as protobuf reads it."""
    wire = ArrayValue(values=items).SerializeToString()
    plain = any_value(AnyValue(array_value=ArrayValue(values=items)))
    if clean_token_ids(wire):
        assert span_checks.token_ids_problem(plain) is None
    if clean_logprobs(wire):
        assert span_checks.logprobs_problem(plain) is None


@given(_arrays)
def test_decoded_arrays_are_protobufs_values(items: list[AnyValue]) -> None:
    """What the numpy pass decodes is exactly the items protobuf parses; what it refuses is not clean."""
    wire = ArrayValue(values=items).SerializeToString()
    plain = any_value(AnyValue(array_value=ArrayValue(values=items)))
    ids = decode_arrays([wire], is_int=True)
    if ids is not None:
        assert ids[0].tolist() == plain and ids[1].tolist() == [len(plain)]
    assert (ids is not None) == clean_token_ids(wire)
    logprobs = decode_arrays([wire], is_int=False)
    if logprobs is not None:
        assert logprobs[1].tolist() == [len(plain)]
        assert logprobs[0].tolist() == np.asarray(plain, np.float64).astype(np.float32).tolist()
    assert (logprobs is not None) == clean_logprobs(wire)
