"""A wire-compatible view of OTLP trace requests that leaves array and kvlist values as bytes.

Token ids and logprobs arrive as ``ArrayValue`` messages of one ``AnyValue`` per token: parsing
them builds hundreds of small messages per LLM call, and ingestion only wants their bytes (which
``schemas.otlp.packed`` decodes batch-wide with numpy). Protobuf parses a length-delimited field as ``bytes`` just as
well as a message, so this view is the real OTLP schema (copied from ``opentelemetry-proto``'s
descriptors, in a private pool) with ``AnyValue.array_value`` and ``AnyValue.kvlist_value``
retyped to ``bytes``. Everything else reads exactly as the real messages do.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FileDescriptor
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

_BYTES_FIELDS = {"opentelemetry.proto.common.v1.AnyValue": ("array_value", "kvlist_value")}


def _files(f: FileDescriptor, out: list[FileDescriptor]) -> list[FileDescriptor]:
    """``f`` and what it imports, dependencies first (the order a pool accepts them in)."""
    for dep in f.dependencies:
        _files(dep, out)
    if all(o.name != f.name for o in out):
        out.append(f)
    return out


def _lite_pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    for f in _files(trace_service_pb2.DESCRIPTOR, []):
        proto = descriptor_pb2.FileDescriptorProto()
        f.CopyToProto(proto)
        for message in proto.message_type:
            retype = _BYTES_FIELDS.get(f"{proto.package}.{message.name}", ())
            for field in message.field:
                if field.name in retype:
                    field.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
                    field.ClearField("type_name")
        pool.Add(proto)
    return pool


_POOL = _lite_pool()

ExportTraceServiceRequestLite: Any = message_factory.GetMessageClass(
    _POOL.FindMessageTypeByName("opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest")
)
"""``ExportTraceServiceRequest`` with ``AnyValue.array_value`` / ``kvlist_value`` as raw bytes."""
