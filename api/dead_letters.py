"""The dead-letters view: kron.dead-letters folded per tenant (the projector applies it).

Keys (in the projection's store, next to the other views):
  dl/<tenant>/<inverted ms>/<id>   one dead letter of the tenant, newest first: its view
  dx/<id>                          where that view is (tenant, index key)

A dead letter's id is ``dl_`` and a digest of its event id, so a path never carries the
colons and topic names of the record's own id. Whose it is: an alert's envelope names its
tenant; a refused command's dead letter is written with none (the worker could not trust
the record), so its tenant is the one the command's own envelope names. A record that does
not decode is nobody's: an operator reads it with ``kron replay``.

A redrive (POST /v1/dead-letters/{id}:redrive) is itself a DeadLetter record on the topic,
``error_class`` ``redriven``, naming the dead letter in ``causation_id``: the view marks it
then, so a rebuild from the topic alone says which were redriven.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Final

from schemas import codec
from schemas.errors import DecodeError
from schemas.jsonable import jsonable
from streams.alerts import ERROR_CLASSES, read_alert

if TYPE_CHECKING:
    from api.projection import Batch

INVERT: Final = (1 << 63) - 1
REDRIVEN: Final = "redriven"


def dead_letter_id(event_id: str) -> str:
    return "dl_" + hashlib.blake2b(event_id.encode(), digest_size=16).hexdigest()


def index_prefix(tenant: str) -> bytes:
    return f"dl/{tenant}/".encode()


def _index_key(tenant: str, occurred_at_ms: int, dl_id: str) -> bytes:
    return index_prefix(tenant) + f"{INVERT - occurred_at_ms:019d}/{dl_id}".encode()


def _where(dl_id: str) -> bytes:
    return f"dx/{dl_id}".encode()


def apply_dead_letter(batch: Batch, rec: dict[str, Any], raw: bytes) -> None:
    env = rec["envelope"]
    if rec["error_class"] == REDRIVEN:
        _mark_redriven(batch, rec)
        return
    view = view_of(rec)
    if view is None:
        return
    dl_id, tenant = view["id"], view.pop("tenant")
    key = _index_key(tenant, env["occurred_at_ms"], dl_id)
    old = batch.get(_where(dl_id))
    if old is not None:  # the same dead letter again (a redelivery): keep its redrive mark
        view["redriven"] = (batch.get(old["key"].encode()) or {}).get("redriven")
    batch.put(key, view)
    batch.put(_where(dl_id), {"tenant": tenant, "key": key.decode()})


def view_of(rec: dict[str, Any]) -> dict[str, Any] | None:
    """The listed form of a dead letter, with its tenant; None if it is nobody's."""
    env = rec["envelope"]
    view: dict[str, Any] = {
        "id": dead_letter_id(env["event_id"]), "error_class": rec["error_class"],
        "error": rec["error"], "occurred_at_ms": env["occurred_at_ms"], "redriven": None}
    if rec["error_class"] in ERROR_CLASSES:
        view.update(tenant=env["tenant"], kind="alert", command=None, alert=_alert_of(rec))
        return view if env["tenant"] else None
    command = _command_of(rec.get("value"))
    if command is None:
        return None
    name, body = command
    view.update(tenant=body["envelope"]["tenant"], kind="command",
                alert=None, command={
                    "name": name, "job_id": body.get("job_id"),
                    "body": jsonable({k: v for k, v in body.items() if k != "envelope"})})
    return view


def _alert_of(rec: dict[str, Any]) -> dict[str, Any]:
    """An alert's facts; one written before alerts carried them has its job, run and
    error only."""
    alert = read_alert(rec)
    if alert is None:
        return {"event": str(ERROR_CLASSES[rec["error_class"]]),
                "job_id": rec["envelope"]["correlation_id"], "job_name": None,
                "run_id": (rec.get("key") or b"").decode("utf-8", "replace"), "task_id": None,
                "attempt": None, "state": None, "error": rec["error"], "output": None,
                "scheduled_for_ms": None}
    return {"event": str(alert.event), "job_id": alert.job_id, "job_name": alert.job_name,
            "run_id": alert.run_id, "task_id": alert.task_id, "attempt": alert.attempt,
            "state": alert.state, "error": alert.error, "output": alert.output,
            "scheduled_for_ms": alert.scheduled_for_ms}


def _command_of(value: bytes | None) -> tuple[str, dict[str, Any]] | None:
    """A refused command's schema name (CreateJob, ...) and record, if it decodes."""
    if value is None:
        return None
    try:
        decoded = codec.decode(value)
    except DecodeError:
        return None
    if not decoded.name.startswith("kron.commands.") or not decoded.record["envelope"]["tenant"]:
        return None
    return decoded.name.removeprefix("kron.commands."), decoded.record


def _mark_redriven(batch: Batch, rec: dict[str, Any]) -> None:
    env = rec["envelope"]
    where = batch.get(_where(env["causation_id"] or ""))
    # Only the dead letter's own tenant's redrive marks it (the API checked; a record from
    # elsewhere naming another tenant's dead letter changes nothing).
    if where is None or where["tenant"] != env["tenant"]:
        return
    view = batch.get(where["key"].encode())
    if view is not None and view["redriven"] is None:
        view["redriven"] = {"command_id": env["correlation_id"], "at_ms": env["occurred_at_ms"]}
        batch.put(where["key"].encode(), view)
