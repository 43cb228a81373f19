"""The one OTLP layer: how agentlake reads and writes OpenTelemetry trace requests.

The collector (checking spans, splitting a request per trace) and the pipeline (decoding records into
`spans` rows) read the same bytes; what those bytes mean is decided here once:

- ``lite``: the request schema with nested attribute values left as bytes (the pipeline's parse);
- ``values``: an ``AnyValue`` (full or lite) as plain Python;
- ``packed``: token-id and logprob arrays on the wire, checked and decoded without per-item parsing;
- ``wire``: protobuf field encoding, to build a request from the encodings of its parts.

Only ``opentelemetry-proto``, protobuf and numpy are imported: never the collector or the pipeline.
"""
