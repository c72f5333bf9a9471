"""Run output (issue 40 part 3): each attempt keeps what its target gave back, bounded by
KRON_OUTPUT_BYTES: the bounding itself, what each kind of target gives, how it travels in the
attempt's result (lone, batched, over Kafka), how the core keeps it on the attempt, and how
the API and the CLI show it. tests/integration/test_run_output_real.py runs it for real."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner

from api.routes import responses
from api.routes.render import run_detail
from api.routes.runs import task_attempt
from bench.receiver import Receiver
from kron import jobs_cli
from kron.clock import SystemClock
from kron.settings import Settings
from schemas import codec, names
from streams import output
from streams.changelog import _resolve
from streams.changelog_child import Writer
from streams.domain.commands import CommandRegistry
from streams.domain.retry import ErrorClass
from streams.domain.topics import TopicGrants
from streams.engine.core import Dispatch, _close_attempt
from streams.engine.records import AttemptRecord, ExecutionRecord
from streams.executor import Executor
from streams.reports import MAX_SEND_BYTES, ResultBatcher, result_item
from streams.targets import AttemptInfo, CommandRunner, HttpRunner, KafkaRunner, Outcome
from tests.golden.make_golden import SAMPLES
from tests.unit.test_core_scenarios import Partition, utc

INFO = AttemptInfo(exec_id="e1", job_id="j1", tenant="acme",
                   scheduled_for_iso="2026-12-01T00:00:00Z", attempt=1, fencing_token=1,
                   now_ms=0)
EURO = "€"  # 3 bytes in UTF-8


def nbytes(text: str) -> int:
    return len(text.encode())


# --- bounding --------------------------------------------------------------------------------


def test_short_ascii_is_kept_as_it_is() -> None:
    assert output.head(b"ok", 10) == output.tail(b"ok", 10) == "ok"
    assert output.head(b"", 10) == output.tail(b"", 10) == ""


def test_head_keeps_the_start_and_tail_the_end_within_the_bound() -> None:
    data = b"0123456789" * 10
    assert output.head(data, 15) == "012345678901234"
    assert output.tail(data, 15) == "567890123456789"


def test_a_character_cut_in_two_is_dropped_not_widened() -> None:
    data = (EURO * 10).encode()  # 30 bytes
    head, tail = output.head(data, 10), output.tail(data, 10)
    # 10 bytes hold three euros and a third of one: the third is dropped, so 9 bytes.
    assert head == tail == EURO * 3
    assert nbytes(head) == 9


def test_bytes_that_are_not_utf8_never_push_it_past_the_bound() -> None:
    # Each bad byte reads as U+FFFD, three bytes of UTF-8: 10 bytes would be 30.
    hostile = b"\xff" * 10
    for cut in (output.head, output.tail):
        text = cut(hostile, 10)
        assert set(text) == {"\ufffd"} and nbytes(text) <= 10


def test_nothing_is_stripped() -> None:
    raw = b"\x1b[31mred\x1b[0m\r\n\x00<script>"
    assert output.head(raw, 100) == output.tail(raw, 100) == raw.decode()


def test_a_zero_bound_keeps_nothing() -> None:
    assert output.head(b"abc", 0) == output.tail(b"abc", 0) == ""


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300), limit=st.integers(min_value=0, max_value=200))
def test_any_bytes_give_text_within_the_bound(data: bytes, limit: int) -> None:
    for cut, part in ((output.head, data[:limit]), (output.tail, data[-limit:] if limit else b"")):
        text = cut(data, limit)
        assert nbytes(text) <= limit
        try:
            whole = part.decode()
        except UnicodeDecodeError:
            continue
        # Valid UTF-8 loses at most the one character cut in two at the bound's end.
        assert whole.startswith(text) if cut is output.head else whole.endswith(text)
        assert len(whole) - len(text) <= 1


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200), limit=st.integers(min_value=1, max_value=300))
def test_text_that_fits_comes_back_whole(text: str, limit: int) -> None:
    data = text.encode()
    if len(data) <= limit:
        assert output.head(data, limit) == output.tail(data, limit) == text


def test_http_output_is_the_status_line_then_the_body_start() -> None:
    assert output.http("1.1", 200, b"OK", b"", 100) == "HTTP/1.1 200 OK"
    assert output.http("1.1", 503, b"Busy", b"try later", 100) == "HTTP/1.1 503 Busy\ntry later"
    assert output.http("1.0", 200, b"OK", b"x" * 100, 20) == "HTTP/1.0 200 OK\nxxxx"


def test_http_output_of_any_line_and_body_stays_within_the_bound() -> None:
    """Seen status lines are remembered (short reasons only); the answer is the same."""
    for reason in (b"OK", b"Sehr Gut \xc3\xbc", b"\xff" * 10, b"R" * 500):
        for body in (b"", b"ok", EURO.encode() * 5, b"\xfe" * 30, b"a" * 5000):
            for limit in (0, 10, 20, 64, 4096):
                text = output.http("1.1", 200, reason, body, limit)
                assert nbytes(text) <= limit
                line = b"HTTP/1.1 200 " + reason
                assert text == output.head(line + b"\n" + body if body else line, limit)
    assert all(len(reason) <= 64 for _, reason, _ in output._lines)


def test_kafka_output_names_the_topic_partition_and_offset() -> None:
    assert output.kafka("acme.events", 3, 41, 100) == "topic acme.events partition 3 offset 41"
    assert nbytes(output.kafka("acme." + "x" * 300, 3, 41, 64)) == 64


def test_the_setting_defaults_to_4_kib_and_is_bounded() -> None:
    assert Settings().output_bytes == 4096
    assert Settings(output_bytes=0).output_bytes == 0
    with pytest.raises(ValidationError):
        Settings(output_bytes=output.EXECUTION_OUTPUT_BUDGET + 1)


# --- the schemas: new versions, old ones still read -------------------------------------------

REPORTS_V2 = [names.EXECUTION_SUCCEEDED, names.EXECUTION_FAILED, names.ATTEMPTS_FINISHED]


@pytest.mark.parametrize(("name", "version"), [(n, 2) for n in REPORTS_V2]
                         + [(names.EXECUTION_STATE, 3)])
def test_output_is_a_new_nullable_version(name: str, version: int) -> None:
    registry = codec.default_codec().registry
    assert registry.latest(name).version == version
    fields = registry.latest(name).schema["fields"]
    if name == names.ATTEMPTS_FINISHED:
        fields = fields[1]["type"]["items"]["fields"]
    if name == names.EXECUTION_STATE:
        fields = next(f for f in fields if f["name"] == "attempts")["type"]["items"]["fields"]
    last = fields[-1]
    assert (last["name"], last["type"], last["default"]) == ("output", ["null", "string"], None)
    assert "response_excerpt" not in {f["name"] for f in fields}


def test_an_old_execution_reads_as_one_whose_attempts_kept_no_output() -> None:
    """ExecutionState v2 records (every execution written before) read with output null."""
    c = codec.default_codec()
    for record in SAMPLES[(names.EXECUTION_STATE, 2)]:
        decoded = c.decode(c.encode(names.EXECUTION_STATE, record, version=2))
        assert (decoded.version, decoded.reader_version) == (2, 3)
        assert all(a["output"] is None for a in decoded.record["attempts"])
    # v3 bytes read by a reader pinned to v2 lose only the outputs.
    new = SAMPLES[(names.EXECUTION_STATE, 3)][0]
    old = c.decode(c.encode(names.EXECUTION_STATE, new), names.EXECUTION_STATE,
                   reader_version=2).record
    assert [{**a, "output": o["output"]} for a, o in zip(old["attempts"], new["attempts"],
                                                          strict=True)] == new["attempts"]


@pytest.mark.parametrize("name", REPORTS_V2)
def test_an_old_report_reads_with_no_output(name: str) -> None:
    """A v1 report from a worker not yet upgraded: its response_excerpt (which the core
    never kept) is dropped, and the output is null."""
    c = codec.default_codec()
    for record in SAMPLES[(name, 1)]:
        decoded = c.decode(c.encode(name, record, version=1))
        assert (decoded.version, decoded.reader_version) == (1, 2)
        results = decoded.record.get("results", [decoded.record])
        assert all(r["output"] is None and "response_excerpt" not in r for r in results)


# --- HTTP targets ----------------------------------------------------------------------------

Serve = Callable[[bytes], Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """A loopback server answering every request with `answer` (raw bytes); returns its URL."""
    servers: list[asyncio.Server] = []

    async def start(answer: bytes) -> str:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"

    yield start
    for server in servers:
        server.close()


def answer(status_line: bytes, body: bytes) -> bytes:
    return (status_line + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
            + body)


def test_the_receiver_answers_a_numbered_body() -> None:
    with Receiver() as rcv, httpx.Client() as c:
        r = c.get(f"{rcv.url}/body/503/25")
    assert (r.status_code, r.content) == (503, b"body:01234567890123456789")


async def http_run(url: str, output_bytes: int) -> Outcome:
    runner = HttpRunner(allow_private=True, output_bytes=output_bytes)
    try:
        return await runner.run({"url": url, "method": "GET", "timeout_s": 5.0}, INFO)
    finally:
        await runner.close()


async def test_http_keeps_the_status_line_as_sent_and_the_body_start(serve: Serve) -> None:
    url = await serve(answer(b"HTTP/1.1 201 Made It", b'{"id": 7, "note": "' + b"n" * 9000))
    out = await http_run(url, 64)
    assert out.ok and out.status_code == 201
    assert out.output == 'HTTP/1.1 201 Made It\n{"id": 7, "note": "' + "n" * 24
    assert nbytes(out.output) == 64


async def test_a_failed_http_attempt_keeps_its_output_too(serve: Serve) -> None:
    url = await serve(answer(b"HTTP/1.1 503 Service Unavailable", b"down for maintenance"))
    out = await http_run(url, 4096)
    assert not out.ok and out.error_class is ErrorClass.TRANSIENT
    assert out.output == "HTTP/1.1 503 Service Unavailable\ndown for maintenance"


async def test_http_body_of_bad_and_multibyte_bytes_stays_within_the_bound(
        serve: Serve) -> None:
    url = await serve(answer(b"HTTP/1.1 200 OK", EURO.encode() * 10 + b"\xff" * 50))
    for limit in (16, 40, 100):
        out = await http_run(url, limit)
        assert out.output is not None and nbytes(out.output) <= limit
        assert out.output.startswith("HTTP/1.1 200 OK\n" + EURO * min(10, (limit - 16) // 3))


async def test_a_long_reason_phrase_is_bounded(serve: Serve) -> None:
    url = await serve(answer(b"HTTP/1.1 200 " + b"R" * 100_000, b"body"))
    out = await http_run(url, 32)
    assert out.output == "HTTP/1.1 200 " + "R" * 19


async def test_the_client_keeps_no_more_body_than_the_bound(serve: Serve) -> None:
    """The body past the bound is read (the connection may be reused) and dropped."""
    url = await serve(answer(b"HTTP/1.1 200 OK", b"z" * 1_000_000))
    runner = HttpRunner(allow_private=True, output_bytes=100)
    try:
        resp = await runner._client().request("GET", url, {}, None, 5.0)
    finally:
        await runner.close()
    assert resp.excerpt == b"z" * 100 and (resp.version, resp.reason) == ("1.1", b"OK")


async def test_no_output_with_a_zero_bound(serve: Serve) -> None:
    out = await http_run(await serve(answer(b"HTTP/1.1 200 OK", b"ok")), 0)
    assert out.ok and out.output is None


# --- command targets -------------------------------------------------------------------------

CHATTY = textwrap.dedent("""
    import sys, time
    for i in range(int(sys.argv[1])):
        print(f"line {i}", flush=True)
    sys.stderr.write("warning: almost done\\n")
    sys.stderr.flush()
    print("last line €", flush=True)
    if sys.argv[2] == "hang":
        time.sleep(60)
    sys.exit(int(sys.argv[2]) if sys.argv[2] != "hang" else 0)
""")


def command_runner(tmp_path: Path, output_bytes: int) -> CommandRunner:
    (tmp_path / "chatty.py").write_text(CHATTY)
    registry = CommandRegistry.parse(f"""
[commands.chatty]
argv = ["{sys.executable}", "{tmp_path}/chatty.py", "{{lines}}", "{{end}}"]
tenants = ["acme"]
max_timeout_s = 30
[commands.chatty.params.lines]
pattern = '[0-9]+'
[commands.chatty.params.end]
enum = ["0", "3", "hang"]
""")
    return CommandRunner(registry=registry, scratch_dir=tmp_path / "scratch",
                         output_bytes=output_bytes)


async def run_chatty(tmp_path: Path, lines: int, end: str, output_bytes: int = 4096,
                     timeout_s: float | None = None) -> Outcome:
    target: dict[str, Any] = {"command": "chatty", "args": {"lines": str(lines), "end": end}}
    if timeout_s is not None:
        target["timeout_s"] = timeout_s
    return await command_runner(tmp_path, output_bytes).run(target, INFO)


async def test_a_command_keeps_the_tail_of_stdout_and_stderr(tmp_path: Path) -> None:
    out = await run_chatty(tmp_path, 3, "0")
    assert out.ok
    assert out.output == "line 0\nline 1\nline 2\nwarning: almost done\nlast line €\n"


async def test_a_long_command_output_keeps_only_its_tail(tmp_path: Path) -> None:
    out = await run_chatty(tmp_path, 100_000, "3", output_bytes=48)
    assert not out.ok and out.error_class is ErrorClass.TRANSIENT and "exited with 3" in out.error
    end = "line 99998\nline 99999\nwarning: almost done\nlast line €\n".encode()
    assert out.output == end[-48:].decode()
    assert nbytes(out.output) <= 48


async def test_a_timed_out_command_keeps_what_it_wrote(tmp_path: Path) -> None:
    out = await run_chatty(tmp_path, 1, "hang", timeout_s=1.5)
    assert out.error_class is ErrorClass.TIMEOUT
    assert out.output == "line 0\nwarning: almost done\nlast line €\n"


async def test_a_refused_command_has_no_output(tmp_path: Path) -> None:
    out = await command_runner(tmp_path, 4096).run(
        {"command": "chatty", "args": {"lines": "1", "end": "9"}}, INFO)
    assert out.error_class is ErrorClass.PERMANENT and out.output is None


# --- Kafka targets ---------------------------------------------------------------------------


async def test_a_kafka_target_gives_the_partition_and_offset_it_was_written_at() -> None:
    async def send(topic: str, key: Any, value: Any, headers: Any) -> tuple[int, int]:
        return 3, 41

    runner = KafkaRunner(send, TopicGrants(own_prefix="kron"))
    out = await runner.run({"topic": "acme.events", "value": b"v"}, INFO)
    assert out == Outcome(ok=True, output="topic acme.events partition 3 offset 41")
    quiet = KafkaRunner(send, TopicGrants(own_prefix="kron"), output_bytes=0)
    assert (await quiet.run({"topic": "acme.events"}, INFO)).output is None


async def test_the_changelog_producer_reports_where_a_target_record_landed() -> None:
    class Msg:
        def partition(self) -> int:
            return 5

        def offset(self) -> int:
            return 1234

    # The child process's side: a delivery report names the record's place ...
    writer = Writer({"bootstrap.servers": "127.0.0.1:1"}, out=None)  # type: ignore[arg-type]
    writer._on_published(7)(None, Msg())
    assert writer._published == [(7, None, 5, 1234)]
    # ... which resolves the worker's publish to it.
    fut = asyncio.get_running_loop().create_future()
    _resolve(fut, None, (5, 1234))
    assert await fut == (5, 1234)


# --- the attempt's result --------------------------------------------------------------------


def dispatch(**kw: Any) -> Dispatch:
    base: dict[str, Any] = dict(exec_id="e1", job_id="j1", tenant="acme",
                                scheduled_for_ms=1_700_000_000_000, attempt=2,
                                fencing_token=2, target={"url": "http://t.test/"},
                                lease_s=60.0)
    return Dispatch(**{**base, **kw})


def executor() -> Executor:
    async def report(*args: Any, **kw: Any) -> None:
        return None

    return Executor(runners={}, report=report, clock=SystemClock(), worker_id="w1")


@pytest.mark.parametrize("outcome", [
    Outcome(ok=True, status_code=200, output="HTTP/1.1 200 OK\nok"),
    Outcome(ok=False, error_class=ErrorClass.TRANSIENT, status_code=503, error="HTTP 503",
            output="HTTP/1.1 503 Service Unavailable\n" + "b" * 100),
    Outcome(ok=False, error_class=ErrorClass.TIMEOUT, error="timed out"),
])
def test_the_result_event_carries_the_output(outcome: Outcome) -> None:
    name, record = executor()._result(dispatch(), outcome, 5)
    assert record["output"] == outcome.output
    # The lone event and its batched form: both encode with the latest schemas.
    assert codec.decode(codec.encode(name, record)).record["output"] == outcome.output
    item = result_item(name, record)
    assert item["output"] == outcome.output
    batch = {"envelope": record["envelope"], "results": [item]}
    decoded = codec.decode(codec.encode(names.ATTEMPTS_FINISHED, batch))
    assert decoded.record["results"][0]["output"] == outcome.output


async def test_a_batch_sent_as_an_event_is_cut_below_the_message_limit() -> None:
    """500 results of 4 KiB would be a 2 MB record, over the broker's 1 MB."""
    sent: list[bytes] = []

    async def send(partition: int, value: bytes) -> None:
        sent.append(value)

    batcher = ResultBatcher(send=send, clock=SystemClock(), worker_id="w1", window_s=0)
    _, record = executor()._result(dispatch(), Outcome(ok=True, output="x" * 4096), 5)
    for i in range(500):
        batcher.add(0, {**result_item(names.EXECUTION_SUCCEEDED, record), "exec_id": f"e{i}"})
    await batcher.stop()
    assert len(sent) > 2 and all(len(v) <= MAX_SEND_BYTES for v in sent)
    batches = [codec.decode(v).record for v in sent]
    ids = [r["exec_id"] for b in batches for r in b["results"]]
    assert ids == [f"e{i}" for i in range(500)]
    assert len({b["envelope"]["event_id"] for b in batches}) == len(batches)


# --- the core keeps it on the attempt --------------------------------------------------------


def report(p: Partition, d: Dispatch, name: str, **fields: Any) -> None:
    rec = {"envelope": {"event_id": f"rep-{d.attempt}", "event_type": "execution.report",
                        "schema_version": 1, "occurred_at_ms": p.now, "tenant": "acme",
                        "causation_id": d.exec_id, "correlation_id": d.job_id,
                        "producer": "executor"},
           "exec_id": d.exec_id, "job_id": d.job_id, "scheduled_for_ms": d.scheduled_for_ms,
           "owner_epoch": 0, "attempt": d.attempt, "fencing_token": d.fencing_token,
           "started_at_ms": p.now, "finished_at_ms": p.now, "status_code": None, **fields}
    p.core.on_report(name, rec, p._ctx())


def dispatches(effects: list[Any]) -> list[Dispatch]:
    return [e for e in effects if isinstance(e, Dispatch)]


def test_the_core_keeps_each_attempts_output_lone_or_batched() -> None:
    t0 = utc(2026, 3, 1, 12, 0)
    p = Partition(t0)
    p.create("j1", run_at_ms=t0, retry={"max_attempts": 3, "backoff": "fixed", "base_s": 1.0,
                                         "max_s": 1.0})
    (first,) = dispatches(p.tick(t0))
    report(p, first, names.EXECUTION_FAILED, error_class="transient", error="HTTP 503",
           final=False, retry_after_s=None, status_code=503,
           output="HTTP/1.1 503 Service Unavailable\nbusy")
    (second,) = dispatches(p.tick(t0 + 2_000))
    item = {"exec_id": second.exec_id, "job_id": second.job_id,
            "scheduled_for_ms": second.scheduled_for_ms, "attempt": second.attempt,
            "fencing_token": second.fencing_token, "ok": True, "started_at_ms": p.now,
            "finished_at_ms": p.now, "status_code": 200, "error_class": None, "error": None,
            "retry_after_s": None, "output": "HTTP/1.1 200 OK\ndone"}
    p.core.on_report(names.ATTEMPTS_FINISHED, {"results": [item]}, p._ctx())
    ex = p.store.execution(first.exec_id)  # MemoryStore checks it against its Avro bytes
    assert ex is not None and ex["state"] == "succeeded"
    assert [a["output"] for a in ex["attempts"]] == [
        "HTTP/1.1 503 Service Unavailable\nbusy", "HTTP/1.1 200 OK\ndone"]


def test_a_lease_that_expires_leaves_no_output() -> None:
    t0 = utc(2026, 3, 1, 12, 0)
    p = Partition(t0)
    p.create("j1", run_at_ms=t0, retry={"max_attempts": 1})
    (d,) = dispatches(p.tick(t0))
    p.tick(t0 + 11_000)  # the spec's lease_s is 10
    ex = p.store.execution(d.exec_id)
    assert ex is not None and ex["state"] == "failed"
    assert ex["attempts"][-1]["outcome"] == "lease_expired"
    assert ex["attempts"][-1]["output"] is None


def attempt(n: int, text: str | None) -> AttemptRecord:
    return {"attempt": n, "fencing_token": n, "worker": "w1", "started_at_ms": n,
            "finished_at_ms": n + 1, "outcome": "transient", "status_code": 503,
            "error": "HTTP 503", "output": text}


def test_older_outputs_give_way_past_the_executions_budget() -> None:
    budget = output.EXECUTION_OUTPUT_BUDGET
    chunk = "é" * 2048  # 4 KiB of UTF-8 in 2,048 characters: the budget counts bytes
    attempts = [attempt(n, chunk) for n in range(1, 20)] + [attempt(20, None)]
    ex: ExecutionRecord = {"attempts": attempts}  # type: ignore[typeddict-item]
    _close_attempt(ex, {"finished_at_ms": 99, "output": chunk}, "transient")
    kept = [a["output"] for a in ex["attempts"]]
    assert kept[-1] == chunk and sum(nbytes(k) for k in kept if k) <= budget
    assert kept.count(chunk) == budget // 4096
    assert all(k is None for k in kept[:-budget // 4096])  # the oldest went first


# --- the API and the CLI -----------------------------------------------------------------------


def view(attempts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"exec_id": "e1", "job_id": "j1", "state": "failed", "trigger": "schedule",
            "scheduled_for_ms": 1_700_000_000_000, "attempt": len(attempts),
            "worker": "w1", "started_at_ms": 1_700_000_000_000,
            "finished_at_ms": 1_700_000_001_000, "lateness_ms": 0,
            "last_error": "HTTP 503", "reason": None, "dst_outcome": None,
            "status_code": 503, "attempts": attempts}


def test_the_run_shows_each_attempts_output_and_none_for_older_views() -> None:
    new = dict(attempt(2, "HTTP/1.1 503 Service Unavailable\n\x1b[2Jbusy"))
    old = {k: v for k, v in attempt(1, None).items() if k != "output"}  # projected before
    shown = run_detail(view([old, new]))
    assert [a["output"] for a in shown["attempts"]] == [None, new["output"]]
    body = json.loads(json.dumps(shown, default=str))  # as the API sends it: a JSON string
    responses.RunDetail.model_validate(body)
    assert body["attempts"][1]["output"] == "HTTP/1.1 503 Service Unavailable\n\x1b[2Jbusy"
    assert task_attempt(new)["output"] == new["output"]
    responses.TaskAttempt.model_validate(json.loads(json.dumps(task_attempt(old),
                                                               default=str)))


def test_the_cli_prints_the_output_with_control_characters_escaped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    shown = json.loads(json.dumps(run_detail(view([
        dict(attempt(1, "HTTP/1.1 503 Busy\n\x1b[2J\u202eevil\tend")),
        dict(attempt(2, None))])), default=str))
    monkeypatch.setattr(jobs_cli, "_call", lambda *a, **kw: shown)
    result = CliRunner().invoke(jobs_cli.jobs_app, ["run-get", "e1", "--key", "k"],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "--- attempt 1 output ---\nHTTP/1.1 503 Busy\n\\x1b[2J\\u202eevil\tend\n" in (
        result.output)
    assert "attempt 2 output" not in result.output and "\x1b" not in result.output
    as_json = CliRunner().invoke(jobs_cli.jobs_app, ["run-get", "e1", "--key", "k", "--json"])
    assert json.loads(as_json.output)["attempts"][0]["output"] == shown["attempts"][0]["output"]
