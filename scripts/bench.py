#!/usr/bin/env python3
"""Startup and syscall-cost benchmark: sbx against bare bwrap, measured in the same run.

    .venv/bin/python scripts/bench.py            # a table of medians, p95s and ratios to bare bwrap
    python scripts/bench.py --json     # the same for machines
    python scripts/bench.py --quick    # fewer rounds

Rows are interleaved round by round (so drift on a busy 2-core machine hits every row
alike); the first rounds are warm-up and discarded. Nothing here is asserted by the tests.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sandbox import Sandbox  # the installed sbx: run this with the venv's python (see the README)
from sandbox.launch import bare_argv, prepare

logging.getLogger("sbx").setLevel(logging.ERROR)  # row 5b runs below strict's floor on purpose

DEVNULL = subprocess.DEVNULL
DD = ["dd", "if=/dev/zero", "of=/dev/null", "bs=1", "count=1000000", "status=none"]  # ~2M read/write calls
FIND = ["find", "/usr/lib", "/usr/share", "-xdev"]  # opens and getdents: the Landlock path checks


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn`` took; a row that prepares something untimed returns its own duration."""
    start = time.perf_counter()
    result = fn()
    return result if isinstance(result, float) else time.perf_counter() - start


def run(argv: list[str], **kw) -> Callable[[], object]:
    def go():
        subprocess.run(argv, stdout=DEVNULL, stderr=DEVNULL, check=False, **kw)
    return go


def sbx_cli() -> list[str]:
    script = Path(sys.executable).with_name("sbx")
    if script.exists():
        return [str(script)]
    from sandbox.integrity import CLI_MAIN, import_root, isolated_python

    return isolated_python(sys.executable, import_root(), CLI_MAIN)


ALLOW_ALL_BPF = (6).to_bytes(2, "little") + bytes(2) + (0x7FFF0000).to_bytes(4, "little")  # ret ALLOW


def bare(sandbox: Sandbox, argv: list[str], allow_all_filter: bool = False) -> Callable[[], float]:
    """bwrap with exactly the arguments and descriptors sbx prepares for ``sandbox`` (its
    view, namespaces and, for root, its identity), running ``argv`` in place of stage 2;
    optionally with a one-instruction allow-all seccomp filter: the floor any filter pays.
    The preparation is not timed."""
    def go() -> float:
        plan = sandbox.plan(argv)
        prepared = prepare(plan, sandbox.capabilities.bwrap_path, sandbox._bpf)
        fds, extra = list(prepared.pass_fds), ()
        if allow_all_filter:
            fd = os.memfd_create("allow-all")
            os.write(fd, ALLOW_ALL_BPF)
            os.lseek(fd, 0, os.SEEK_SET)
            fds.append(fd)
            extra = ("--seccomp", str(fd))
        try:
            command = bare_argv(prepared, sandbox.capabilities.bwrap_path, argv, extra)
            start = time.perf_counter()
            subprocess.run(command, pass_fds=fds, stdout=DEVNULL, stderr=DEVNULL, env={}, check=False)
            return time.perf_counter() - start
        finally:
            prepared.discard()
            if allow_all_filter:
                os.close(fd)
    return go


def quiet(sandbox: Sandbox, argv: list[str]) -> Callable[[], object]:
    return lambda: sandbox.run(argv, stdout=DEVNULL, stderr=DEVNULL)


def build_rows(workdir: str, heavy: bool) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    strict = Sandbox("strict", workdir)
    standard = Sandbox("standard", workdir)
    seccomp_only = Sandbox("strict", workdir, tier="KernelSeccompOnly", allow_degraded=True)
    proxied = Sandbox("strict", workdir, allow_hosts=["pypi.org"])
    cli = [*sbx_cli(), "run", "--profile", "strict", "--workdir", workdir, "--", "true"]
    rows = {
        "1 bare true": run(["true"]),
        "2 bare bwrap (strict's namespaces and mounts)": bare(strict, ["/usr/bin/true"]),
        "3 sbx run --profile strict -- true (cold CLI)": run(cli),
        "4 Sandbox.run(['true']) warm, strict": quiet(strict, ["true"]),
        "5a Sandbox.run(['true']) warm, standard": quiet(standard, ["true"]),
        "5b Sandbox.run(['true']) warm, strict at KernelSeccompOnly": quiet(seccomp_only, ["true"]),
        "5c Sandbox.run(['true']) warm, strict with a network allowlist (the proxy mode)": quiet(proxied, ["true"]),
        "p python -I -S -c pass (interpreter start)": run([sys.executable, "-I", "-S", "-c", "pass"]),
        "p python -I -c pass (front end interpreter start, with the venv's site)": run(
            [sys.executable, "-I", "-c", "pass"], cwd="/"),
        "p python -I -c 'import sandbox.cli, sandbox.api' (front end start and imports)": run(
            [sys.executable, "-I", "-c", "import sandbox.cli, sandbox.api"], cwd="/"),
    }
    notes = {"bwrap": strict.capabilities.bwrap_path}
    if heavy:
        rows["6a dd 2M read/write, bare"] = run(DD)
        rows["6b dd 2M read/write, sbx strict"] = quiet(strict, DD)
        rows["6c dd 2M read/write, bare bwrap + allow-all seccomp filter (the floor)"] = bare(strict, DD, True)
        rows["6d find /usr/lib /usr/share, bare"] = run(FIND)
        rows["6e find /usr/lib /usr/share, sbx strict"] = quiet(strict, FIND)
        rows["6f find /usr/lib /usr/share, bare bwrap + allow-all seccomp filter (the floor)"] = bare(strict, FIND,
                                                                                                         True)
        # The same filters without Landlock: what the seccomp filter itself costs over the floor.
        rows["6g find /usr/lib /usr/share, sbx strict at KernelSeccompOnly"] = quiet(seccomp_only, FIND)
    return rows, notes


def in_process_phases(workdir: str, rounds: int) -> dict[str, float]:
    """Per-call costs inside a warm process, in milliseconds (medians)."""
    from sandbox.launch import prepare
    from sandbox.seccomp_policy import compiled_bpf, spec_from_profile

    sb = Sandbox("strict", workdir)
    spec = spec_from_profile(sb.profile.table("seccomp"), False)
    plan_t, prep_t, bpf_t = [], [], []
    for _ in range(rounds):
        bpf_t.append(timed(lambda: compiled_bpf(spec)))
        plan_t.append(timed(lambda: sb.plan(["true"])))
        p = sb.plan(["true"])
        start = time.perf_counter()
        prepared = prepare(p, sb.capabilities.bwrap_path, sb._bpf)
        prep_t.append(time.perf_counter() - start)
        prepared.discard()
    return {"planning (Sandbox.plan)": statistics.median(plan_t) * 1000,
            "BPF from the cache (compiled_bpf)": statistics.median(bpf_t) * 1000,
            "descriptors: memfds, pipe, config (prepare)": statistics.median(prep_t) * 1000,
            "stage 2 helper size, bytes": os.path.getsize(sb.plan(["true"]).stage2_helper)}


PROXY_CLIENT = r"""
import json, socket, sys, time
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
def connection():
    if mode == "direct":
        return socket.create_connection((host, port))
    s = socket.create_connection(("127.0.0.1", 3128))
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(4096)
    assert b" 200 " in head.split(b"\r\n")[0], head
    return s
start = time.perf_counter()
for _ in range(50):
    s = connection(); s.sendall(b"ping\n"); assert s.recv(5) == b"pong\n"; s.close()
latency = (time.perf_counter() - start) / 50
size = 256 << 20
s = connection(); s.sendall(f"bytes {size}\n".encode())
start, got = time.perf_counter(), 0
while got < size:
    chunk = s.recv(1 << 20)
    if not chunk:
        break
    got += len(chunk)
seconds = time.perf_counter() - start
print(json.dumps({"latency_ms": latency * 1000, "mb_per_s": got / seconds / 1e6}))
"""


def proxy_measurements(workdir: str, rounds: int = 3) -> dict[str, float]:
    """The allowlist's proxy against a direct connection on the host: per-connection latency
    (connect, CONNECT, one exchange) and the throughput of one 256 MB download; medians."""
    import socketserver
    import threading

    class Serve(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            while line := self.rfile.readline():
                if line == b"ping\n":
                    self.wfile.write(b"pong\n")
                    self.wfile.flush()
                elif line.startswith(b"bytes "):
                    left, block = int(line.split()[1]), bytes(1 << 20)
                    while left > 0:
                        self.wfile.write(block[:left])
                        left -= len(block)
                    return

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Serve)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    async def resolver(host: str, _port: int) -> list[str]:
        return ["127.0.0.1"]

    python = os.path.realpath(sys.executable)
    boxed = Sandbox("strict", workdir, allow_hosts=[f"bench.test:{port}"], network_resolver=resolver)
    out: dict[str, list[float]] = {}
    try:
        for _ in range(rounds):
            direct = subprocess.run([python, "-I", "-S", "-c", PROXY_CLIENT, "direct", "127.0.0.1", str(port)],
                                    capture_output=True, text=True, check=True)
            proxied = boxed.run([python, "-I", "-S", "-c", PROXY_CLIENT, "proxy", "bench.test", str(port)],
                                capture_output=True, text=True)
            for label, done in (("direct", direct), ("proxy", proxied)):
                seen = json.loads(done.stdout)
                out.setdefault(f"{label} latency ms", []).append(seen["latency_ms"])
                out.setdefault(f"{label} MB/s", []).append(seen["mb_per_s"])
    finally:
        server.shutdown()
    return {k: round(statistics.median(v), 2) for k, v in out.items()}


def spawn_async_throughput(workdir: str, total: int = 200, concurrency: int = 16, bare_bwrap: bool = False) -> float:
    """spawn_async of ``true``, ``concurrency`` at a time: completed sandboxes per second.
    ``bare_bwrap``: the same bwrap invocation (as in row 2) spawned through asyncio instead,
    what the namespaces alone allow on this machine."""
    import asyncio

    async def main() -> float:
        sb = Sandbox("strict", workdir)
        gate = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with gate:
                if bare_bwrap:
                    prepared = prepare(sb.plan(["/usr/bin/true"]), sb.capabilities.bwrap_path, sb._bpf)
                    try:
                        argv = bare_argv(prepared, sb.capabilities.bwrap_path, ["/usr/bin/true"])
                        process = await asyncio.create_subprocess_exec(*argv, pass_fds=prepared.pass_fds, env={})
                        await process.wait()
                    finally:
                        prepared.discard()
                    return
                process = await sb.spawn_async(["true"])
                await process.wait()

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(total)))
        return total / (time.perf_counter() - start)

    return asyncio.run(main())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--heavy-rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rounds = 12 if args.quick else args.rounds
    warmup = 3
    workdir = tempfile.mkdtemp(prefix="sbx-bench-")
    try:
        rows, notes = build_rows(workdir, heavy=True)
        light = {k: v for k, v in rows.items() if not k.startswith("6")}
        heavy = {k: v for k, v in rows.items() if k.startswith("6")}
        samples: dict[str, list[float]] = {k: [] for k in rows}
        for i in range(rounds + warmup):
            for name, fn in light.items():
                t = timed(fn)
                if i >= warmup:
                    samples[name].append(t)
        for i in range(args.heavy_rounds + 1):
            for name, fn in heavy.items():
                t = timed(fn)
                if i >= 1:
                    samples[name].append(t)
        phases = in_process_phases(workdir, rounds)
        throughput = spawn_async_throughput(workdir)
        bare_throughput = spawn_async_throughput(workdir, bare_bwrap=True)
        proxy = proxy_measurements(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    base = statistics.median(samples["2 bare bwrap (strict's namespaces and mounts)"])
    table = []
    for name, values in samples.items():
        values.sort()
        median = statistics.median(values)
        p95 = values[max(0, int(round(len(values) * 0.95)) - 1)]
        table.append({"row": name, "median_ms": round(median * 1000, 2), "p95_ms": round(p95 * 1000, 2),
                      "ratio_to_bare_bwrap": round(median / base, 2), "n": len(values)})
    heavy_ratios = {}
    for bare, boxed in (("6a", "6b"), ("6a", "6c"), ("6d", "6e"), ("6d", "6f"), ("6d", "6g")):
        b = next(r for r in table if r["row"].startswith(bare))
        s = next(r for r in table if r["row"].startswith(boxed))
        heavy_ratios[s["row"]] = round(s["median_ms"] / b["median_ms"], 3)
    report = {"machine": {"cpus": os.cpu_count(), "kernel": os.uname().release, "python": sys.version.split()[0]},
              "rows": table, "heavy_ratio_to_bare": heavy_ratios, "in_process_ms": phases,
              "spawn_async_per_second": round(throughput, 1),
              "bare_bwrap_through_asyncio_per_second": round(bare_throughput, 1), "proxy": proxy, "notes": notes}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{'row':<78} {'median ms':>10} {'p95 ms':>9} {'x bwrap':>8}")
    for r in table:
        print(f"{r['row']:<78} {r['median_ms']:>10.2f} {r['p95_ms']:>9.2f} {r['ratio_to_bare_bwrap']:>8.2f}")
    print("\nsyscall-heavy workloads, ratio to bare:")
    for name, ratio in heavy_ratios.items():
        print(f"  {name}: {ratio:.3f}x")
    print(f"\nspawn_async throughput of true (16 at a time): {throughput:.0f} per second; "
          f"bare bwrap spawned the same way: {bare_throughput:.0f} per second")
    print("\nnetwork allowlist proxy against a direct connection (medians):")
    for name, value in proxy.items():
        print(f"  {name}: {value:.2f}")
    print("\nin-process phases (median ms):")
    for name, value in phases.items():
        print(f"  {name}: {value:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
