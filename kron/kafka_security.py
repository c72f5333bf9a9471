"""Settings -> Kafka client security, for both client libraries kron uses.

confluent-kafka (API publisher and projection, replay reader, topic admin) takes librdkafka
properties; Faust (the worker) takes `broker_credentials` holding an `ssl.SSLContext`. Both
are derived here from the one Settings object so the two can't drift apart.
"""

from __future__ import annotations

import ssl
from typing import Any

from kron.settings import Settings


def confluent_security(s: Settings) -> dict[str, str]:
    """librdkafka security properties (security.protocol is always set, even PLAINTEXT, so
    every client config visibly carries a decision)."""
    proto = s.kafka_security_protocol
    out: dict[str, str] = {"security.protocol": proto}
    if proto.startswith("SASL_"):
        out["sasl.mechanisms"] = s.kafka_sasl_mechanism
        out["sasl.username"] = s.kafka_sasl_username
        out["sasl.password"] = s.kafka_sasl_password.get_secret_value()
    if proto.endswith("SSL"):
        if s.kafka_ssl_ca_file is not None:
            out["ssl.ca.location"] = str(s.kafka_ssl_ca_file)
        if s.kafka_ssl_cert_file is not None and s.kafka_ssl_key_file is not None:
            out["ssl.certificate.location"] = str(s.kafka_ssl_cert_file)
            out["ssl.key.location"] = str(s.kafka_ssl_key_file)
        # "https" makes librdkafka check the broker certificate names the broker host.
        out["ssl.endpoint.identification.algorithm"] = (
            "https" if s.kafka_ssl_check_hostname else "none")
    return out


def confluent_config(s: Settings, extra: dict[str, Any]) -> dict[str, Any]:
    """A whole confluent-kafka client config: the caller's own, then brokers and security
    (last, so no caller can accidentally fall back to plaintext)."""
    return {**extra, "bootstrap.servers": s.bootstrap_servers, **confluent_security(s)}


def ssl_context(s: Settings) -> ssl.SSLContext:
    """The TLS context for aiokafka: verifies the broker (system CAs, or the given CA file)
    and presents a client certificate when one is configured."""
    cafile = str(s.kafka_ssl_ca_file) if s.kafka_ssl_ca_file is not None else None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    if s.kafka_ssl_cert_file is not None and s.kafka_ssl_key_file is not None:
        ctx.load_cert_chain(str(s.kafka_ssl_cert_file), str(s.kafka_ssl_key_file))
    ctx.check_hostname = s.kafka_ssl_check_hostname  # the certificate itself is still verified
    return ctx


def faust_app_kwargs(s: Settings) -> dict[str, Any]:
    """`broker` and `broker_credentials` for faust.App. The URL scheme stays kafka:// for every
    protocol: Faust's aiokafka driver takes the protocol from the credentials object."""
    import faust  # the worker's dependency; imported here so API/CLI processes don't pay for it

    proto = s.kafka_security_protocol
    credentials: Any = None
    if proto == "SSL":
        credentials = faust.SSLCredentials(ssl_context(s))
    elif proto.startswith("SASL_"):
        credentials = faust.SASLCredentials(
            username=s.kafka_sasl_username,
            password=s.kafka_sasl_password.get_secret_value(),
            mechanism=s.kafka_sasl_mechanism,
            ssl_context=ssl_context(s) if proto == "SASL_SSL" else None)
    return {"broker": [f"kafka://{h.strip()}" for h in s.bootstrap_servers.split(",")],
            "broker_credentials": credentials}
