"""Which Kafka topics a tenant's jobs may publish to.

A tenant publishes to its own namespace, topics named ``<tenant>.<anything valid>``. The
operator grants more per tenant with ``KRON_KAFKA_TARGET_TOPICS``::

    acme=shared.reports.*|audit-log,globex=partners.globex.*

per tenant a ``|``-separated list of patterns: ``xyz.*`` is every topic starting ``xyz.``,
anything else one exact topic name. kron's own topics (``<topic_prefix>.*`` and
``<topic_prefix>-*``, which hold its commands, state and changelogs) and Kafka's internal
ones (``__*``) are refused whatever the grants say: a job publishing there could forge
commands or corrupt state.

The same check runs where a job is created (the API, the engine) and again where an
attempt publishes (the worker's Kafka runner), so a grant withdrawn later stops jobs
created under it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from streams.domain.errors import PermanentError

__all__ = ["ENV_VAR", "FIELD", "TopicGrants", "is_valid_topic"]

ENV_VAR = "KRON_KAFKA_TARGET_TOPICS"
FIELD = "target.topic"
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_KAFKA_INTERNAL = "__"


def is_valid_topic(name: str) -> bool:
    """A legal Kafka topic name: 1..249 of ``A-Z a-z 0-9 . _ -``, not ``.`` or ``..``."""
    return _TOPIC.fullmatch(name) is not None and name not in (".", "..")


def _parse_pattern(pattern: str) -> str:
    stem = pattern[:-2] if pattern.endswith(".*") else pattern
    if not is_valid_topic(stem) or (stem != pattern and len(stem) > 247):
        raise ValueError(f"{pattern!r} is neither a topic name nor a prefix pattern "
                         f"like 'reports.*' (topic names are 1..249 of A-Z a-z 0-9 . _ -)")
    return pattern


def _matches(pattern: str, topic: str) -> bool:
    if pattern.endswith(".*"):
        return topic.startswith(pattern[:-1])
    return topic == pattern


@dataclass(frozen=True, kw_only=True, slots=True)
class TopicGrants:
    """kron's topic prefix and each tenant's extra patterns (``xyz.*`` or an exact name)."""

    own_prefix: str
    grants: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType({}))

    @classmethod
    def parse(cls, raw: str, *, own_prefix: str) -> TopicGrants:
        """``tenant=pattern|pattern,tenant=...``; ValueError naming the entry at fault.

        A tenant named twice gets the patterns of both entries."""
        grants: dict[str, tuple[str, ...]] = {}
        for entry in (e.strip() for e in raw.split(",")):
            if not entry:
                continue
            tenant, sep, patterns = entry.partition("=")
            tenant = tenant.strip()
            where = f"{ENV_VAR} entry {entry!r}"
            if not sep or not tenant:
                raise ValueError(f"{where} is not tenant=pattern|pattern (e.g. "
                                 f"'acme=shared.reports.*|audit-log')")
            parsed: list[str] = []
            for pattern in (p.strip() for p in patterns.split("|")):
                if not pattern:
                    raise ValueError(f"{where} has an empty pattern; give topic names or "
                                     f"prefixes like 'reports.*', separated by '|'")
                try:
                    parsed.append(_parse_pattern(pattern))
                except ValueError as exc:
                    raise ValueError(f"{where}: {exc}") from None
            merged = grants.get(tenant, ()) + tuple(parsed)
            grants[tenant] = tuple(dict.fromkeys(merged))
        return cls(own_prefix=own_prefix, grants=MappingProxyType(grants))

    def reserved(self, topic: str) -> bool:
        """kron's own topics and Kafka's internal ones: never a job's target."""
        if topic.startswith(_KAFKA_INTERNAL):
            return True
        return bool(self.own_prefix) and topic.startswith(
            (f"{self.own_prefix}.", f"{self.own_prefix}-"))

    def patterns_for(self, tenant: str) -> tuple[str, ...]:
        """What ``tenant`` may publish to, as patterns: its own namespace, then its grants."""
        own = (f"{tenant}.*",) if tenant else ()
        return own + tuple(p for p in self.grants.get(tenant, ()) if p not in own)

    def allows(self, tenant: str, topic: str) -> bool:
        try:
            self.check(tenant, topic)
        except PermanentError:
            return False
        return True

    def check(self, tenant: str, topic: str) -> None:
        """Raises :class:`PermanentError` (``field="target.topic"``) unless ``tenant`` may
        publish to ``topic``."""
        if not is_valid_topic(topic):
            raise PermanentError(f"{FIELD} {topic!r} is not a valid Kafka topic name "
                                 f"(1..249 of A-Z a-z 0-9 . _ -)", field=FIELD)
        if self.reserved(topic):
            own = (f"'{self.own_prefix}.*', '{self.own_prefix}-*' and "
                   if self.own_prefix else "")
            raise PermanentError(
                f"{FIELD} {topic!r} is an internal topic: no job may publish to kron's own "
                f"topics or Kafka's ({own}'__*'), whatever {ENV_VAR} grants", field=FIELD)
        if any(_matches(p, topic) for p in self.patterns_for(tenant)):
            return
        granted = self.grants.get(tenant, ())
        also = f", and {', '.join(repr(p) for p in granted)} granted to it" if granted else ""
        name = tenant or "tenant"
        raise PermanentError(
            f"{FIELD} {topic!r} is not a topic tenant {tenant!r} may publish to: a tenant's "
            f"Kafka targets are its own topics, named '{name}.<anything>'{also}. An operator "
            f"can grant more with {ENV_VAR}=\"{name}=<prefix>.*|<topic>\"", field=FIELD)
