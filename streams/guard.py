"""What a tenant's target may reach, judged from the operator's grants.

The same rules hold wherever a target comes from: the API checks them at create (422), the
partition owner at every CreateJob, CreateJobs item and UpdateJob it applies (a command
produced straight to Kafka that breaks one is dead-lettered with its reason, and nothing is
armed), and the runners again at every attempt (the grants may have changed since).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from streams.domain.commands import CommandRegistry
from streams.domain.errors import PermanentError
from streams.engine.spec import branch
from streams.netguard import check_url

LEGACY_COMMAND: Final = (
    "a job can't name a program, an image or a working directory; it names a "
    "command the operator registered in KRON_COMMANDS_FILE: "
    '{"type": "command", "command": "NAME", "args": {...}}')


class TopicCheck(Protocol):
    def check(self, tenant: str, topic: str) -> None: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class TargetGuard:
    commands: CommandRegistry
    topics: TopicCheck | None
    allow_private: bool

    def check(self, tenant: str, target: Any) -> None:
        """Raises a PermanentError naming the field the tenant may not use."""
        target = branch(target)
        if not isinstance(target, Mapping):
            return  # the spec's own checks name a missing target
        if "argv" in target:
            raise PermanentError(f"target.argv: {LEGACY_COMMAND}", field="target.argv")
        if "command" in target:
            self.commands.resolve(tenant, target)
        elif "url" in target:
            # Literal addresses and blocked names only: the name is resolved and every
            # address checked when the attempt connects (streams/netguard.py).
            check_url(str(target["url"]), allow_private=self.allow_private, resolve=False)
        elif "topic" in target and self.topics is not None:
            self.topics.check(tenant, str(target["topic"]))
