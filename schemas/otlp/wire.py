"""Protobuf wire encoding, to build an OTLP request out of the encodings of its parts.

The wire format lets a message be written as the concatenation of its fields, and a nested message
as its own bytes behind a tag and a length. So a request holding the spans of one trace is built from
each span's encoding, copied byte for byte, wrapped in its scope and resource: nothing is rebuilt
field by field. Field tags are taken from ``opentelemetry-proto``'s descriptors, by name.
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.message import Message
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans

LENGTH_DELIMITED = 2  # wire type of strings, bytes and nested messages


def varint(n: int) -> bytes:
    """A non-negative int as a base-128 varint."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field_tag(message: type[Message], field: str, wire_type: int = LENGTH_DELIMITED) -> bytes:
    """The tag that starts ``field`` of ``message`` on the wire."""
    return varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | wire_type)


def length_delimited(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    return tag + varint(len(payload)) + payload


REQUEST_RESOURCE_SPANS = field_tag(ExportTraceServiceRequest, "resource_spans")
RESOURCE = field_tag(ResourceSpans, "resource")
RESOURCE_SCOPE_SPANS = field_tag(ResourceSpans, "scope_spans")
RESOURCE_SCHEMA_URL = field_tag(ResourceSpans, "schema_url")
SCOPE = field_tag(ScopeSpans, "scope")
SCOPE_SPANS = field_tag(ScopeSpans, "spans")
SCOPE_SCHEMA_URL = field_tag(ScopeSpans, "schema_url")


def resource_head(rs: ResourceSpans) -> bytes:
    """The fields of ``rs`` that come before its scopes: its resource, when set."""
    return length_delimited(RESOURCE, rs.resource.SerializeToString()) if rs.HasField("resource") else b""


def resource_tail(rs: ResourceSpans) -> bytes:
    """The fields of ``rs`` that come after its scopes: its schema URL, when set."""
    return length_delimited(RESOURCE_SCHEMA_URL, rs.schema_url.encode()) if rs.schema_url else b""


def scope_head(ss: ScopeSpans) -> bytes:
    """The fields of ``ss`` other than its spans: scope and schema URL, when set."""
    head = length_delimited(SCOPE, ss.scope.SerializeToString()) if ss.HasField("scope") else b""
    if ss.schema_url:
        head += length_delimited(SCOPE_SCHEMA_URL, ss.schema_url.encode())
    return head


def scope_spans(head: bytes, spans: Iterable[bytes]) -> bytes:
    """A ``ResourceSpans.scope_spans`` field: ``scope_head`` and the encoded spans."""
    return length_delimited(RESOURCE_SCOPE_SPANS, head + b"".join(length_delimited(SCOPE_SPANS, s) for s in spans))


def resource_spans(head: bytes, scopes: Iterable[bytes], tail: bytes) -> bytes:
    """A ``ExportTraceServiceRequest.resource_spans`` field: ``resource_head``, scopes, ``resource_tail``."""
    return length_delimited(REQUEST_RESOURCE_SPANS, head + b"".join(scopes) + tail)
