#!/usr/bin/env python3
"""Foreign descriptors under concurrent spawns: the thread-safety measurement.

N threads each repeatedly open a file holding a unique tag, make it inheritable, and spawn
a probe with that descriptor preserved. Each child lists its descriptors with fcntl and
reads the first bytes of every one above 2. A child holding another spawn's tag is a leak;
a child missing its own tag means preserved files broke under load.

    python scripts/fd_leak_harness.py                 # Sandbox.spawn, 8 threads x 25
    python scripts/fd_leak_harness.py --control       # plain Popen(close_fds=False)
    python scripts/fd_leak_harness.py --json

The control mode must show foreign descriptors: it proves the harness sees leaks.
Throughput and latency are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PROBE = (REPO / "sandbox" / "probes_src" / "fdprobe.py").read_text()
PROBE_ARGV = ["/usr/bin/python3", "-I", "-S", "-c", PROBE]


def measure(threads: int = 8, per_thread: int = 25, control: bool = False, profile: str = "strict") -> dict:
    workdir = tempfile.mkdtemp(prefix="sbx-harness-")
    sandbox = None
    if not control:
        from sandbox import Sandbox

        sandbox = Sandbox(profile, workdir)
    lock = threading.Lock()
    results: dict = {"spawns": 0, "foreign": 0, "own_missing": 0, "errors": 0, "latencies": []}
    start_barrier = threading.Barrier(threads)

    def worker(index: int) -> None:
        start_barrier.wait()
        for i in range(per_thread):
            tag = f"sbx-tag-{index}-{i}-{os.getpid()}"
            path = os.path.join(workdir, tag)
            with open(path, "w") as f:
                f.write(tag)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.set_inheritable(fd, True)
                began = time.perf_counter()
                if control:
                    child = subprocess.Popen(PROBE_ARGV, stdout=subprocess.PIPE, close_fds=False, text=True)
                else:
                    child = sandbox.spawn(PROBE_ARGV, preserve_fds=[fd], stdout=subprocess.PIPE, text=True)
                latency = time.perf_counter() - began
                out, _ = child.communicate()
            finally:
                os.close(fd)
                os.unlink(path)
            with lock:
                results["spawns"] += 1
                results["latencies"].append(latency)
                try:
                    seen = json.loads(out.splitlines()[-1])
                except (ValueError, IndexError):
                    results["errors"] += 1
                    continue
                tags = [v for v in seen["first_bytes"].values() if v.startswith("sbx-tag-")]
                results["foreign"] += any(t != tag for t in tags)
                results["own_missing"] += tag not in tags

    began = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - began
    latencies = sorted(results.pop("latencies"))
    os.rmdir(workdir)
    return {
        **results, "mode": "control Popen(close_fds=False)" if control else f"Sandbox.spawn ({profile})",
        "threads": threads, "seconds": round(elapsed, 3),
        "spawns_per_second": round(results["spawns"] / elapsed, 1),
        "spawn_latency_ms_median": round(statistics.median(latencies) * 1000, 2),
        "spawn_latency_ms_p95": round(latencies[int(len(latencies) * 0.95) - 1] * 1000, 2),
        "tier": sandbox.tier.name if sandbox else "none",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--per-thread", type=int, default=25)
    parser.add_argument("--control", action="store_true", help="plain Popen(close_fds=False) instead of sbx")
    parser.add_argument("--profile", default="strict")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.threads, args.per_thread, args.control, args.profile)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>24}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
