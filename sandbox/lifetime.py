"""Lifetime of the library's sandboxes: deadlines, dropped handles, closed loops, one spawner.

- **Deadlines.** A sandbox's timeout (the constructor's, the profile's, or a call's) is a
  deadline kept by one long-lived daemon thread, not by whoever waits: when it passes, the
  whole sandbox is killed and its status becomes 124 (``timed_out``), whether or not
  anything is waiting on it.
- **Closed event loops.** An async sandbox whose loop is closed while it runs is killed by
  the same thread, which looks at the loops it watches a few times a second.
- **One spawner thread.** bwrap's ``--die-with-parent`` follows the *thread* that forked it
  (``PR_SET_PDEATHSIG``). Synchronous spawns therefore fork from one long-lived internal
  thread, so a sandbox started from a short-lived thread is not killed when that thread
  ends; it lives until its handle is dropped, it is killed, or the process exits.

Everything here holds weak references: it never keeps a dropped handle alive.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import weakref
from collections.abc import Callable

LOOP_POLL_SECONDS = 0.2


class _Watchdog:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._cancelled: set[int] = set()
        self._loops: list[tuple[weakref.ref, weakref.ref]] = []  # (loop, process)
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sbx-watchdog", daemon=True)
            self._thread.start()

    def at(self, deadline: float, callback: Callable[[], None]) -> int:
        with self._cond:
            token = next(self._ids)
            heapq.heappush(self._heap, (deadline, token, callback))
            self._ensure_thread()
            self._cond.notify()
            return token

    def cancel(self, token: int) -> None:
        with self._cond:
            self._cancelled.add(token)

    def watch_loop(self, loop: object, process: object) -> None:
        with self._cond:
            self._loops.append((weakref.ref(loop), weakref.ref(process)))
            self._ensure_thread()
            self._cond.notify()

    def _run(self) -> None:
        # This thread must never die: every later deadline in the process depends on it.
        while True:
            try:
                self._once()
            except Exception:
                time.sleep(0.01)

    def _once(self) -> None:
        if True:
            due: list[Callable[[], None]] = []
            with self._cond:
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    _, token, callback = heapq.heappop(self._heap)
                    if token in self._cancelled:
                        self._cancelled.discard(token)
                    else:
                        due.append(callback)
                closed = self._closed_loop_processes()
                wait = min(self._heap[0][0] - now, 3600) if self._heap else None  # bounded: no overflow
                if self._loops:
                    wait = LOOP_POLL_SECONDS if wait is None else min(wait, LOOP_POLL_SECONDS)
                if not due and not closed:
                    self._cond.wait(wait)
                    return
            for callback in due:
                _quietly(callback)
            for process in closed:
                _quietly(process.kill_sandbox)

    def _closed_loop_processes(self) -> list:
        closed, keep = [], []
        for loop_ref, process_ref in self._loops:
            loop, process = loop_ref(), process_ref()
            try:
                if process is None or process.running() is False:
                    continue
                if loop is None or loop.is_closed():
                    closed.append(process)
                else:
                    keep.append((loop_ref, process_ref))
            except Exception:
                continue  # a handle being torn down: its __del__ kills the sandbox
        self._loops = keep
        return closed


def _quietly(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:
        pass  # a sandbox that already ended


_watchdog = _Watchdog()


def kill_at_deadline(process: object, seconds: float) -> int:
    """Kill ``process``'s sandbox ``seconds`` from now (``process.expire()``), unless cancelled."""
    ref = weakref.ref(process)

    def fire() -> None:
        target = ref()
        if target is not None:
            target.expire()

    return _watchdog.at(time.monotonic() + seconds, fire)


def call_later(seconds: float, callback: Callable[[], None]) -> int:
    """Run ``callback`` on the watchdog thread ``seconds`` from now, unless cancelled."""
    return _watchdog.at(time.monotonic() + seconds, callback)


def cancel(token: int | None) -> None:
    if token is not None:
        _watchdog.cancel(token)


def kill_when_loop_closes(loop: object, process: object) -> None:
    _watchdog.watch_loop(loop, process)


_spawner = None
_spawner_lock = threading.Lock()


def on_spawner_thread(function: Callable, *args, **kwargs):
    """Run ``function`` on the one long-lived spawner thread and return its result (or
    raise its exception): a bwrap forked there outlives the thread that asked for it."""
    global _spawner
    if _spawner is None:
        with _spawner_lock:
            if _spawner is None:
                from concurrent.futures import ThreadPoolExecutor

                _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sbx-spawner")
    return _spawner.submit(function, *args, **kwargs).result()
