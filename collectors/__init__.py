"""Everything that accepts data from running agents: OTLP receivers, the LLM gateway, the sink.

records      pure decoding: OTLP protobuf/JSON and reward events -> Kafka records
sink         the one-method RecordSink seam (and an in-memory one)
kafka_sink   the no-loss Kafka producer behind it
intake       auth, decode, idempotent delivery; shared by both receivers and /v1/rewards
otlp_http    POST /v1/traces, POST /v1/rewards, GET /health (Starlette)
otlp_grpc    TraceService/Export (grpc.aio)
receivers    both receivers in one process; `python -m collectors`
listen       uvicorn on a socket we bind, signals left to the process shell
gateway      the OpenAI-compatible proxy in front of vLLM; `python -m collectors.gateway`
process      the signal/exit-code shell both entry points run in
"""
