"""A single-node test broker with a SASL/SCRAM listener beside its plaintext one."""

from __future__ import annotations

from kron import localkafka

JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


def sasl_properties(cluster: localkafka.Cluster, sasl_port: int,
                    extra: dict[str, str] | None = None) -> str:
    """server.properties for the cluster's node with a SASL_PLAINTEXT (SCRAM-SHA-512)
    listener on ``sasl_port``, plus ``extra`` (an authorizer, say)."""
    node = cluster.nodes[0]
    props = dict(line.split("=", 1) for line in
                 localkafka.server_properties(cluster, node).splitlines() if line)
    plain, ctrl = node.broker_port, node.controller_port
    props |= {
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},CONTROLLER://127.0.0.1:{ctrl},"
                     f"SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{plain},"
                                f"SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "listener.security.protocol.map":
            "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": JAAS,
        **(extra or {}),
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())
