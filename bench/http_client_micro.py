"""Micro-benchmark of HttpRunner.run: client CPU per request, old implementation vs current.

    .venv/bin/python bench/http_client_micro.py [--n 5000] [--rounds 3] [--old-rev REV]

A small aiohttp server answers 200 on 127.0.0.1 in a child process, so time.process_time()
here counts only the client (the runner, its HTTP library and the event loop). "old" is
streams/targets.py as of --old-rev (by default the aiohttp runner), loaded from git into a
module of its own; "new" is the working tree's. Rounds alternate old and new, so drifting
machine load hits both alike; the median round is reported. uvloop, as in the worker.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streams import targets as new_targets  # noqa: E402
from streams.targets import AttemptInfo  # noqa: E402

# The last commit whose HttpRunner is the aiohttp one (1b18a47 has the httpx one).
OLD_REV = "fbc94c0"
INFO = AttemptInfo(exec_id="e1", job_id="j1", tenant="acme",
                   scheduled_for_iso="2026-01-01T00:00:00Z",
                   attempt=1, fencing_token=7, now_ms=0)


def _serve(port_out: Any) -> None:
    from aiohttp import web

    async def hook(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text='{"ok":true}', content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_route("*", "/hook", hook)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        port_out.send(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()

    uvloop.run(main())


def load_old(rev: str) -> types.ModuleType:
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:streams/targets.py"],
                            check=True, capture_output=True, text=True).stdout
    module = types.ModuleType("old_targets")
    sys.modules["old_targets"] = module  # dataclasses look their module up by name
    exec(compile(source, f"{rev}:streams/targets.py", "exec"), module.__dict__)
    return module


async def measure(impl: types.ModuleType, url: str, n: int, in_flight: int) -> tuple[float, float]:
    """(client CPU ms per 1000 requests, requests/s) for n requests, in_flight at a time."""
    runner = impl.HttpRunner(allow_private=True)
    target = {"url": url, "method": "POST", "body": '{"job":"bench"}', "timeout_s": 10.0,
              "headers": {"Content-Type": "application/json"}}
    failures = 0

    async def lane(count: int) -> None:
        nonlocal failures
        for _ in range(count):
            out = await runner.run(target, INFO)
            failures += not out.ok

    async def batch(total: int) -> None:
        await asyncio.gather(*(lane(total // in_flight + (i < total % in_flight))
                               for i in range(in_flight)))

    try:
        await batch(min(500, n))  # warm-up: connections open, code paths hot
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await batch(n)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        await runner.close()
    if failures:
        raise SystemExit(f"{failures} requests failed")
    return cpu / n * 1e6, n / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--old-rev", default=OLD_REV)
    args = ap.parse_args()
    impls = {"old": load_old(args.old_rev), "new": new_targets}

    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    server = ctx.Process(target=_serve, args=(send,), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{recv.recv()}/hook"
    try:
        for in_flight in (1, 64):
            results: dict[str, list[tuple[float, float]]] = {name: [] for name in impls}
            for _ in range(args.rounds):
                for name, impl in impls.items():
                    results[name].append(uvloop.run(measure(impl, url, args.n, in_flight)))
            for name, rows in results.items():
                cpu = statistics.median(r[0] for r in rows)
                rps = statistics.median(r[1] for r in rows)
                print(f"in_flight={in_flight:<3} {name}: {cpu:7.1f} CPU ms/1000 req  "
                      f"{rps:7.0f} req/s   (rounds: "
                      + ", ".join(f"{c:.0f}ms/{r:.0f}" for c, r in rows) + ")", flush=True)
    finally:
        server.terminate()
        server.join()


if __name__ == "__main__":
    main()
