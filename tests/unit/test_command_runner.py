"""The command runner on real child processes: what a registered command can see and keep.

No mocks: each test starts the worker's sandbox and a real program (the test's own Python),
and looks at what the program printed or left behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from streams.domain.commands import CommandRegistry
from streams.domain.retry import ErrorClass
from streams.targets import AttemptInfo, CommandRunner

INFO = AttemptInfo(exec_id="e1", job_id="j1", tenant="acme",
                   scheduled_for_iso="2026-12-01T00:00:00Z", attempt=2, fencing_token=2,
                   now_ms=0)
SECRET = "s3cret-sasl-password"

# The child scripts; each is a registered command's template, with one enum parameter.
PROBE = textwrap.dedent("""
    import json, os, resource, sys
    home = os.environ.get("HOME", "")
    json.dump(dict(os.environ), open(sys.argv[2], "w"))
    print("CWD", os.getcwd() == home, "HOME", os.path.isdir(home))
    print("LIMITS", resource.getrlimit(resource.RLIMIT_CPU)[0],
          resource.getrlimit(resource.RLIMIT_NOFILE)[0],
          resource.getrlimit(resource.RLIMIT_CORE)[0])
    print("SESSION", os.getsid(0) == os.getpid(), "ARGV", sys.argv[1:2])
""")
# Leaves a grandchild behind (same process group), writes its pid, and sleeps.
FORKER = textwrap.dedent("""
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    open(sys.argv[1], "w").write(str(child.pid))
    time.sleep(int(sys.argv[2]))
""")


def registry(tmp_path: Path) -> CommandRegistry:
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "forker.py").write_text(FORKER)
    py = sys.executable
    return CommandRegistry.parse(f"""
[defaults.limits]
cpu_s = 77
open_files = 99
[commands.probe]
argv = ["{py}", "{tmp_path}/probe.py", "{{word}}", "{tmp_path}/env.json"]
tenants = ["acme"]
env = ["GREETING"]
max_timeout_s = 30
[commands.probe.params.word]
pattern = '[a-z; &|$()-]+'
[commands.forker]
argv = ["{py}", "{tmp_path}/forker.py", "{tmp_path}/grandchild.pid", "{{sleep}}"]
tenants = ["acme"]
max_timeout_s = 30
[commands.forker.params.sleep]
enum = ["0", "60"]
[commands.missing]
argv = ["/no/such/program"]
tenants = ["acme"]
""")


def runner(tmp_path: Path) -> CommandRunner:
    return CommandRunner(registry=registry(tmp_path), scratch_dir=tmp_path / "scratch")


def is_dir(path: str) -> bool:
    return os.path.isdir(path)


async def dies(pid: int, within_s: float = 5.0) -> bool:
    for _ in range(int(within_s * 10)):
        if not alive(pid):
            return True
        await asyncio.sleep(0.1)
    return not alive(pid)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too: it only waits for its parent to reap it.
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_the_child_sees_a_minimal_environment_and_its_limits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KRON_KAFKA_SASL_PASSWORD", SECRET)
    out = await runner(tmp_path).run(
        {"command": "probe", "args": {"word": "hi; rm -rf $(pwd) | x"},
         "env": {"GREETING": "hello"}}, INFO)
    assert out.ok, out
    text = out.output or ""
    raw_env = (tmp_path / "env.json").read_text()
    assert SECRET not in raw_env and SECRET not in text
    env = json.loads(raw_env)
    assert set(env) <= {"PATH", "LANG", "HOME", "GREETING", "KRON_EXEC_ID", "KRON_JOB_ID",
                        "KRON_ATTEMPT", "KRON_SCHEDULED_FOR", "LC_CTYPE"}
    assert env["KRON_EXEC_ID"] == "e1" and env["KRON_ATTEMPT"] == "2"
    assert env["GREETING"] == "hello"
    home = env["HOME"]
    assert home.startswith(str(tmp_path / "scratch")) and "CWD True HOME True" in text
    assert not is_dir(home)  # the scratch HOME is removed after the attempt
    assert "LIMITS 77 99 0" in text
    assert "SESSION True" in text
    # The hostile value is one argv item, never a shell's business.
    assert "ARGV ['hi; rm -rf $(pwd) | x']" in text


async def test_a_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    regs = registry(tmp_path)
    run = CommandRunner(registry=regs, scratch_dir=tmp_path / "scratch")
    target = {"command": "forker", "args": {"sleep": "60"}, "timeout_s": 2}
    began = time.monotonic()
    out = await run.run(target, INFO)
    assert out.error_class is ErrorClass.TIMEOUT and not out.ok
    assert time.monotonic() - began < 20
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    assert await dies(grandchild)


async def test_a_grandchild_left_after_a_normal_exit_is_killed(tmp_path: Path) -> None:
    out = await runner(tmp_path).run({"command": "forker", "args": {"sleep": "0"}}, INFO)
    assert out.ok, out
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    assert await dies(grandchild)


async def test_a_cancelled_attempt_kills_its_group(tmp_path: Path) -> None:
    run = runner(tmp_path)
    task = asyncio.ensure_future(run.run({"command": "forker", "args": {"sleep": "60"}}, INFO))
    pid_file = tmp_path / "grandchild.pid"
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text():
            break
        await asyncio.sleep(0.1)
    grandchild = int(pid_file.read_text())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await dies(grandchild)


@pytest.mark.parametrize(("target", "why"), [
    ({"argv": ["/bin/sh", "-c", "env"]}, "can't name a program"),
    ({"command": "probe", "args": {"word": "UPPER"}}, "target.args.word"),
    ({"command": "nope"}, "not a registered command"),
])
async def test_refused_targets_fail_permanently_and_run_nothing(
        tmp_path: Path, target: dict[str, object], why: str) -> None:
    out = await runner(tmp_path).run(target, INFO)
    assert not out.ok and out.error_class is ErrorClass.PERMANENT
    assert why in out.error and out.error.startswith("refused:")
    assert not (tmp_path / "scratch").exists() or not any((tmp_path / "scratch").iterdir())


async def test_another_tenant_is_refused(tmp_path: Path) -> None:
    info = AttemptInfo(exec_id="e1", job_id="j1", tenant="globex", scheduled_for_iso="x",
                       attempt=1, fencing_token=1, now_ms=0)
    out = await runner(tmp_path).run({"command": "probe", "args": {"word": "a"}}, info)
    assert out.error_class is ErrorClass.PERMANENT and "not granted" in out.error


async def test_a_program_that_does_not_exist_is_permanent(tmp_path: Path) -> None:
    out = await runner(tmp_path).run({"command": "missing"}, INFO)
    assert out.error_class is ErrorClass.PERMANENT
    assert "exited with 127" in out.error and "cannot run" in (out.output or "")


def test_the_runner_works_on_the_workers_uvloop(tmp_path: Path) -> None:
    """The worker runs on uvloop, whose subprocesses take fewer options than asyncio's."""
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as loop:
        out = loop.run(runner(tmp_path).run(
            {"command": "probe", "args": {"word": "uv"}}, INFO))
    assert out.ok, out
    assert "LIMITS 77 99 0" in (out.output or "")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_kron_command_user_runs_the_child_as_that_user(tmp_path: Path) -> None:
    import pwd

    import uvloop

    nobody = pwd.getpwnam("nobody")
    regs = CommandRegistry.parse('[commands.whoami]\nargv = ["/usr/bin/id"]\ntenants = ["*"]\n')
    run = CommandRunner(registry=regs, scratch_dir=tmp_path / "scratch", user="nobody")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as loop:
        out = loop.run(run.run({"command": "whoami"}, INFO))
    assert out.ok, out
    assert f"uid={nobody.pw_uid}" in (out.output or "")
    assert f"gid={nobody.pw_gid}" in (out.output or "")


def test_an_unknown_command_user_stops_the_worker_at_start(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        CommandRunner(registry=CommandRegistry(), scratch_dir=tmp_path, user="no-such-user-x")
