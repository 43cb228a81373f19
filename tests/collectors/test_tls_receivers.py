"""TLS on OTLP/HTTP, OTLP/gRPC and the gateway, with a throwaway CA (tests/tls.py).

The real OTel SDK exporters (their certificate options) talk to a collector serving TLS; the
collector's sink is in memory, since what is under test is the transport, and the spans that
arrive are compared with the ones the SDK made. Mutual TLS (``tls_client_cafile``) refuses a
client without a certificate the CA signed. The gateway serves HTTPS to a real httpx client.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from collectors.gateway.serve import GatewayServer
from collectors.receivers import CollectorServer
from collectors.sink import MemorySink
from schemas.config import Settings, load_settings
from schemas.errors import ConfigError
from tests.collectors.helpers import LoopThread, running_collector, spans_of
from tests.collectors.test_gateway import UPSTREAM, FakeVllm
from tests.tls import KEY_PASSWORD, TlsFiles, make_tls_files


@pytest.fixture(autouse=True)
def no_ca_bundle_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE replace a session's own CA file (psf/requests#3829),
    so with them set (as on this machine) the HTTP exporter's ``certificate_file`` would be ignored."""
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def client_key(tls: TlsFiles) -> Path:
    """The client key without its password: the OTel exporters take no key password."""
    key = serialization.load_pem_private_key(tls.client_key.read_bytes(), KEY_PASSWORD.encode())
    path = tls.client_key.with_name("client-plain.key")
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return path


def tls_settings(tmp_path: Path, tls: TlsFiles, *, mutual: bool = False) -> Settings:
    files = {"tls_certfile": str(tls.server_cert), "tls_keyfile": str(tls.server_key)}
    if mutual:
        files["tls_client_cafile"] = str(tls.ca)
    return load_settings(
        environ={},
        discover=False,
        overrides={"state": {"dir": str(tmp_path / "state")}, "collector": files, "gateway": files},
    )


def made_spans(n: int = 3) -> list[ReadableSpan]:
    """Finished spans from the real SDK, to hand to an exporter."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "tls-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("tests")
    with tracer.start_as_current_span("rollout"):
        for i in range(n - 1):
            with tracer.start_as_current_span(f"step-{i}"):
                pass
    provider.shutdown()
    return list(memory.get_finished_spans())


def ids(spans: list[ReadableSpan]) -> set[tuple[str, str]]:
    return {(format(s.context.trace_id, "032x"), format(s.context.span_id, "016x")) for s in spans}


def http_exporter(port: int, tls: TlsFiles, key: Path | None = None) -> SpanExporter:
    return HttpExporter(
        endpoint=f"https://127.0.0.1:{port}/v1/traces",
        certificate_file=str(tls.ca),
        client_certificate_file=str(tls.client_cert) if key else None,
        client_key_file=str(key) if key else None,
        timeout=3,
    )


def grpc_exporter(port: int, tls: TlsFiles, key: Path | None = None) -> SpanExporter:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls.ca.read_bytes(),
        private_key=key.read_bytes() if key else None,
        certificate_chain=tls.client_cert.read_bytes() if key else None,
    )
    return GrpcExporter(endpoint=f"127.0.0.1:{port}", insecure=False, credentials=credentials, timeout=3)


@pytest.fixture()
def memory() -> MemorySink:
    return MemorySink()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sdk_exporter_sends_over_tls(protocol: str, tls: TlsFiles, tmp_path: Path, memory: MemorySink) -> None:
    with running_collector(tls_settings(tmp_path, tls), memory) as server:
        spans = made_spans()
        if protocol == "http":
            exporter = http_exporter(server.http_port, tls)
        else:
            exporter = grpc_exporter(server.grpc_port, tls)
        assert exporter.export(spans) == SpanExportResult.SUCCESS
        exporter.shutdown()
        assert set(spans_of(memory.records)) == ids(spans)
        # The TLS port speaks no plaintext.
        with pytest.raises(httpx.HTTPError):
            httpx.post(f"http://127.0.0.1:{server.http_port}/v1/traces", content=b"{}", timeout=3)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_mutual_tls_needs_a_client_certificate(
    protocol: str, tls: TlsFiles, client_key: Path, tmp_path: Path, memory: MemorySink
) -> None:
    make = http_exporter if protocol == "http" else grpc_exporter
    with running_collector(tls_settings(tmp_path, tls, mutual=True), memory) as server:
        port = server.http_port if protocol == "http" else server.grpc_port
        refused = make(port, tls)
        assert refused.export(made_spans()) == SpanExportResult.FAILURE
        refused.shutdown()
        assert memory.records == []
        spans = made_spans()
        accepted = make(port, tls, client_key)
        assert accepted.export(spans) == SpanExportResult.SUCCESS
        accepted.shutdown()
        assert set(spans_of(memory.records)) == ids(spans)


def test_missing_certificate_file_is_a_clear_error(tls: TlsFiles, tmp_path: Path) -> None:
    settings = tls_settings(tmp_path, tls)
    settings.collector.tls_keyfile = str(tmp_path / "nope.key")
    lt = LoopThread()
    try:
        with pytest.raises(ConfigError, match="tls_keyfile: .*nope.key is not a file"):
            lt.run(CollectorServer(settings, MemorySink()).start())
    finally:
        lt.close()
    with pytest.raises(ConfigError, match="tls_certfile and tls_keyfile"):
        load_settings(environ={}, discover=False, overrides={"gateway": {"tls_certfile": str(tls.server_cert)}})


@pytest.fixture()
def tls_gateway(tls: TlsFiles, tmp_path: Path) -> Iterator[tuple[GatewayServer, MemorySink]]:
    settings = tls_settings(tmp_path, tls, mutual=True)
    settings.gateway.port = 0
    settings.gateway.upstreams = [UPSTREAM]
    sink = MemorySink()
    lt = LoopThread()
    server = GatewayServer(settings, sink, client=httpx.AsyncClient(transport=httpx.ASGITransport(FakeVllm().app())))
    lt.run(server.start())
    try:
        yield server, sink
    finally:
        lt.run(server.stop(), timeout=60)
        lt.close()


def test_gateway_serves_https_with_client_certificates(
    tls_gateway: tuple[GatewayServer, MemorySink], tls: TlsFiles
) -> None:
    server, _ = tls_gateway
    url = f"https://127.0.0.1:{server.port}/v1/chat/completions"
    call = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(httpx.HTTPError):  # no client certificate
        httpx.post(url, json=call, verify=str(tls.ca), timeout=5)
    with pytest.raises(httpx.HTTPError):  # plaintext
        httpx.post(url.replace("https", "http"), json=call, timeout=5)
    ctx = ssl.create_default_context(cafile=str(tls.ca))
    ctx.load_cert_chain(str(tls.client_cert), str(tls.client_key), password=KEY_PASSWORD)
    r = httpx.post(url, json=call, verify=ctx, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "hi"


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mutual-tls"])
def test_the_stacks_health_probe_speaks_tls(mutual: bool, tls: TlsFiles, tmp_path: Path, memory: MemorySink) -> None:
    """`agentlake up` / `status` probe a collector serving TLS over TLS (before: plain http, never healthy)."""
    from agentlake.stack.health import http_ok, server_ok

    settings = tls_settings(tmp_path, tls, mutual=mutual)
    with running_collector(settings, memory) as server:
        c = settings.collector
        c.http_port = server.http_port
        assert c.http_url.startswith("https://")
        assert server_ok(c, f"{c.http_url}/health")
        assert not http_ok(f"http://{c.host}:{c.http_port}/health")  # what the probe did before
    assert not server_ok(c, f"{c.http_url}/health")  # stopped: not healthy
