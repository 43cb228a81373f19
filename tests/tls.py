"""TLS material for tests: a throwaway CA, a server certificate for 127.0.0.1, a client certificate."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

KEY_PASSWORD = "test-key-password"


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path  # encrypted with KEY_PASSWORD


def make_tls_files(folder: Path) -> TlsFiles:
    """A CA and two certificates it signed (PEM files under ``folder``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool):
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(name("agentlake test CA"))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            san = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    files = TlsFiles(*(folder / n for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")))
    files.ca.write_bytes(cert("agentlake test CA", ca_key, ca_key, ca=True).public_bytes(serialization.Encoding.PEM))
    for subject, cert_path, key_path, password in (
        ("127.0.0.1", files.server_cert, files.server_key, None),
        ("agentlake client", files.client_cert, files.client_key, KEY_PASSWORD),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        cert_path.write_bytes(cert(subject, key, ca_key, ca=False).public_bytes(serialization.Encoding.PEM))
        encryption = (
            serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
        )
        key_path.write_bytes(
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
        )
    return files
