"""Kafka client security: Settings -> confluent-kafka properties and Faust credentials, and
every confluent client kron builds (API, replay, topics) carries them.

No SASL/TLS broker runs here, so nothing below authenticates against a real cluster: the
client objects are real (librdkafka validates property names, file paths and mechanisms
when a client is constructed; aiokafka's mapping is Faust's own function), the handshake
is not exercised.
"""

from __future__ import annotations

import re
import shutil
import ssl
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import certifi
import faust
import pytest
from confluent_kafka import Consumer, Producer
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth
from pydantic import ValidationError

from kron.kafka_security import confluent_config, confluent_security, faust_app_kwargs
from kron.settings import Settings

REPO = Path(__file__).resolve().parents[2]
CA = certifi.where()  # any valid CA bundle will do for constructing clients


def secured(protocol: str, **kw: Any) -> Settings:
    base: dict[str, Any] = {"bootstrap_servers": "b1:9093,b2:9093",
                            "kafka_security_protocol": protocol}
    if protocol.startswith("SASL_"):
        base |= {"kafka_sasl_username": "kron", "kafka_sasl_password": "pw-123"}
    return Settings(**base | kw)


def test_plaintext_sets_only_the_protocol() -> None:
    assert confluent_security(Settings()) == {"security.protocol": "PLAINTEXT"}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_plaintext(mechanism: str) -> None:
    conf = confluent_security(secured("SASL_PLAINTEXT", kafka_sasl_mechanism=mechanism))
    assert conf == {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": mechanism,
                    "sasl.username": "kron", "sasl.password": "pw-123"}


@pytest.mark.parametrize(("check", "algorithm"), [(True, "https"), (False, "none")])
def test_ssl_with_client_certificate(check: bool, algorithm: str) -> None:
    conf = confluent_security(secured(
        "SSL", kafka_ssl_ca_file="/etc/kron/ca.pem", kafka_ssl_cert_file="/etc/kron/c.pem",
        kafka_ssl_key_file="/etc/kron/c.key", kafka_ssl_check_hostname=check))
    assert conf == {"security.protocol": "SSL", "ssl.ca.location": "/etc/kron/ca.pem",
                    "ssl.certificate.location": "/etc/kron/c.pem",
                    "ssl.key.location": "/etc/kron/c.key",
                    "ssl.endpoint.identification.algorithm": algorithm}


def test_sasl_ssl_has_both_halves() -> None:
    conf = confluent_security(secured("SASL_SSL", kafka_ssl_ca_file=CA))
    assert conf == {"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
                    "sasl.username": "kron", "sasl.password": "pw-123", "ssl.ca.location": CA,
                    "ssl.endpoint.identification.algorithm": "https"}


def test_security_wins_over_a_callers_config() -> None:
    s = secured("SASL_SSL")
    conf = confluent_config(s, {"security.protocol": "PLAINTEXT", "acks": "all"})
    assert conf["security.protocol"] == "SASL_SSL" and conf["acks"] == "all"
    assert conf["bootstrap.servers"] == "b1:9093,b2:9093"


@pytest.mark.parametrize("fields", [
    {"kafka_security_protocol": "SASL_SSL"},  # no credentials
    {"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_username": "u"},
    {"kafka_ssl_cert_file": "/c.pem"},  # a certificate without its key
    {"kafka_security_protocol": "TLS"},
    {"kafka_sasl_mechanism": "GSSAPI"},
])
def test_incomplete_or_unknown_security_settings_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Settings(**fields)


def test_env_vars_and_password_secrecy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"PROTOCOL": "SASL_SSL", "SASL_MECHANISM": "SCRAM-SHA-256",
                        "SASL_USERNAME": "kron", "SASL_PASSWORD": "s3cr3t-pw",
                        "SSL_CA_FILE": CA, "SSL_CHECK_HOSTNAME": "false"}.items():
        prefix = "KRON_KAFKA_SECURITY_" if name == "PROTOCOL" else "KRON_KAFKA_"
        monkeypatch.setenv(prefix + name, value)
    s = Settings()
    assert confluent_security(s)["sasl.mechanisms"] == "SCRAM-SHA-256"
    assert confluent_security(s)["ssl.endpoint.identification.algorithm"] == "none"
    for text in (repr(s), s.model_dump_json(), str(s.model_dump())):
        assert "s3cr3t-pw" not in text


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"])
@pytest.mark.parametrize("client", [Producer, Consumer])
def test_librdkafka_accepts_every_config(protocol: str, client: Any) -> None:
    # Construction validates names, values and the CA file; it doesn't connect.
    s = secured(protocol, kafka_ssl_ca_file=CA)
    c = client(confluent_config(s, {"group.id": "g", "log_level": 0}))
    if client is Consumer:
        c.close()


# --- Faust --------------------------------------------------------------------------------

def _client_cert(tmp: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a client certificate")
    cert, key = tmp / "client.pem", tmp / "client.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=kron", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def test_faust_plaintext() -> None:
    kw = faust_app_kwargs(Settings(bootstrap_servers="h1:9092, h2:9092"))
    assert kw == {"broker": ["kafka://h1:9092", "kafka://h2:9092"], "broker_credentials": None}
    assert credentials_to_aiokafka_auth(None) == {"security_protocol": "PLAINTEXT"}


def test_faust_ssl_with_client_certificate(tmp_path: Path) -> None:
    cert, key = _client_cert(tmp_path)
    kw = faust_app_kwargs(secured("SSL", kafka_ssl_ca_file=CA, kafka_ssl_cert_file=cert,
                                  kafka_ssl_key_file=key, kafka_ssl_check_hostname=False))
    creds = kw["broker_credentials"]
    assert isinstance(creds, faust.SSLCredentials)
    auth = credentials_to_aiokafka_auth(creds)
    assert auth["security_protocol"] == "SSL"
    ctx: ssl.SSLContext = auth["ssl_context"]
    assert ctx.verify_mode is ssl.CERT_REQUIRED and ctx.check_hostname is False


@pytest.mark.parametrize(("protocol", "tls"), [("SASL_PLAINTEXT", False), ("SASL_SSL", True)])
@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_faust_sasl(protocol: str, tls: bool, mechanism: str) -> None:
    kw = faust_app_kwargs(secured(protocol, kafka_sasl_mechanism=mechanism,
                                  kafka_ssl_ca_file=CA))
    assert isinstance(kw["broker_credentials"], faust.SASLCredentials)
    auth = credentials_to_aiokafka_auth(kw["broker_credentials"])
    assert auth["security_protocol"] == protocol and auth["sasl_mechanism"] == mechanism
    assert (auth["sasl_plain_username"], auth["sasl_plain_password"]) == ("kron", "pw-123")
    ctx = auth["ssl_context"]
    assert (ctx is not None) is tls
    if tls:
        assert ctx.check_hostname is True and ctx.verify_mode is ssl.CERT_REQUIRED
    assert "pw-123" not in repr(kw["broker_credentials"])


def test_the_workers_faust_app_gets_the_credentials(tmp_path: Path) -> None:
    from streams.app import Engine

    s = secured("SASL_SSL", kafka_ssl_ca_file=CA, data_dir=tmp_path)
    faust_app = Engine._build_app(SimpleNamespace(settings=s))  # type: ignore[arg-type]
    assert isinstance(faust_app.conf.broker_credentials, faust.SASLCredentials)
    assert [str(u) for u in faust_app.conf.broker] == ["kafka://b1:9093", "kafka://b2:9093"]


# --- every confluent client in api/, replay/, kron/ -------------------------------------

class Recorder:
    """Stands in for a confluent client class: records the config, then stops the caller
    (the real client would try to reach the (absent) brokers)."""

    configs: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, config: dict[str, Any]) -> None:
        Recorder.configs.append(config)
        raise _Recorded


class _Recorded(Exception):
    pass


def _constructions(monkeypatch: pytest.MonkeyPatch, s: Settings) -> dict[str, dict[str, Any]]:
    import api.projection
    import api.publisher
    import kron.topics
    import replay.reader

    for module, name in [(api.publisher, "Producer"), (api.projection, "Consumer"),
                         (replay.reader, "Consumer"), (kron.topics, "AdminClient")]:
        monkeypatch.setattr(module, name, Recorder)
    Recorder.configs = []
    calls = {
        "api.publisher": lambda: api.publisher.CommandPublisher(s),
        # The views aren't touched before the consumer exists.
        "api.projection": lambda: api.projection.Projector(s, None)._consumer(),  # type: ignore[arg-type]
        "replay.read_topic": lambda: next(replay.reader.read_topic(s, "t")),
        "replay.topic_offsets": lambda: replay.reader.topic_offsets(s, "t"),
        "kron.topics": lambda: kron.topics.create_topics(s),
    }
    out: dict[str, dict[str, Any]] = {}
    for name, call in calls.items():
        with pytest.raises(_Recorded):
            call()
        out[name] = Recorder.configs[-1]
    return out


def test_every_client_constructor_gets_the_security_entries(
        monkeypatch: pytest.MonkeyPatch) -> None:
    s = secured("SASL_SSL", kafka_ssl_ca_file=CA)
    expected = confluent_security(s)
    for name, config in _constructions(monkeypatch, s).items():
        assert {k: config.get(k) for k in expected} == expected, name
        assert config["bootstrap.servers"] == s.bootstrap_servers, name


def test_no_confluent_client_is_built_without_the_security_config() -> None:
    """Catches a client added later that skips confluent_config. kron/localkafka.py's admin
    client talks to the local dev broker it started itself (plaintext by construction);
    replay/reader.py's other constructor is for a bare bootstrap string (tests, bench)."""
    allowed = {("kron/localkafka.py", 1), ("replay/reader.py", 1)}
    found: dict[str, int] = {}
    for path in [*REPO.glob("api/*.py"), *REPO.glob("replay/*.py"), *REPO.glob("kron/*.py")]:
        rel = str(path.relative_to(REPO))
        for line in path.read_text().splitlines():
            if re.search(r"\b(Producer|Consumer|AdminClient)\((?!\))", line) and \
                    "confluent_config(" not in line and not line.lstrip().startswith("#"):
                found[rel] = found.get(rel, 0) + 1
    assert set(found.items()) <= allowed, found
