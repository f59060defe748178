"""A coalescing work queue: every trigger asks for a pass over a key; worker threads run one pass per key at a time.

The Kopf handlers only :meth:`WorkQueue.add` keys (a Task's or a TaskShard's), so a handler call returns in
microseconds and the passes run on ``workers`` threads, outside Kopf's event loop. Contracts:

- A key is queued at most once. A key added while its pass runs is marked dirty, and the pass runs once more
  after it ends (nothing is lost, and two passes over one object never overlap).
- ``add(key, delay)`` runs the pass no sooner than ``delay`` seconds from now; a later delayed add of a key that
  is already due earlier changes nothing (a debounce: at most one pass per window).
- The pass returns how many seconds until it wants to run again (a back-off expiring), or None.
- A pass that raises is retried with a per-key back-off, ``retry_base * 2**n`` capped at ``retry_cap``; a pass
  that returns resets it. :class:`Conflict`-like errors are not special: they retry fast (the first step).
- :attr:`observer` (``(key, seconds, error)``), when set, sees every finished pass (benchmarks time passes with it).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable

log = logging.getLogger("taskshard_operator")

Pass = Callable[[Hashable], "float | None"]


class WorkQueue:
    def __init__(
        self, run: Pass, *, workers: int = 8, retry_base: float = 0.2, retry_cap: float = 30.0, name: str = "pass"
    ) -> None:
        self._run = run
        self._workers = workers
        self._retry_base = retry_base
        self._retry_cap = retry_cap
        self._name = name
        self._cond = threading.Condition()
        self._ready: deque[Hashable] = deque()
        self._queued: set[Hashable] = set()
        self._running: set[Hashable] = set()
        self._dirty: set[Hashable] = set()
        self._due: dict[Hashable, float] = {}
        self._delayed: list[tuple[float, int, Hashable]] = []
        self._seq = itertools.count()
        self._failures: dict[Hashable, int] = {}
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self.observer: Callable[[Hashable, float, BaseException | None], None] | None = None

    # ------------------------------------------------------------ producers
    def add(self, key: Hashable, delay: float = 0.0) -> None:
        with self._cond:
            if delay > 0:
                due = time.monotonic() + delay
                if key in self._queued or self._due.get(key, float("inf")) <= due:
                    return
                self._due[key] = due
                heapq.heappush(self._delayed, (due, next(self._seq), key))
            else:
                self._enqueue(key)
            self._cond.notify()

    def _enqueue(self, key: Hashable) -> None:
        if key in self._running:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._ready.append(key)

    # ------------------------------------------------------------ workers
    def start(self) -> None:
        with self._cond:
            if self._threads:
                return
            self._stopping = False
            self._threads = [
                threading.Thread(target=self._work, name=f"{self._name}-{i}", daemon=True) for i in range(self._workers)
            ]
        for t in self._threads:
            t.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            threads, self._threads = self._threads, []
        for t in threads:
            t.join(timeout)

    def _next(self) -> Hashable | None:
        """The next key to run (blocks); None when stopping."""
        with self._cond:
            while not self._stopping:
                now = time.monotonic()
                while self._delayed and self._delayed[0][0] <= now:
                    due, _, key = heapq.heappop(self._delayed)
                    if self._due.get(key) == due:
                        del self._due[key]
                        self._enqueue(key)
                if self._ready:
                    key = self._ready.popleft()
                    self._queued.discard(key)
                    self._due.pop(key, None)
                    self._running.add(key)
                    return key
                self._cond.wait(timeout=(self._delayed[0][0] - now) if self._delayed else None)
            return None

    def _work(self) -> None:
        while (key := self._next()) is not None:
            started = time.monotonic()
            error: BaseException | None = None
            again: float | None = None
            try:
                again = self._run(key)
            except Exception as e:  # noqa: BLE001 - a failed pass is retried, never lost
                error = e
            self._finish(key, again, error)
            if self.observer is not None:
                self.observer(key, time.monotonic() - started, error)

    def _finish(self, key: Hashable, again: float | None, error: BaseException | None) -> None:
        with self._cond:
            self._running.discard(key)
            if error is not None:
                n = self._failures.get(key, 0)
                self._failures[key] = n + 1
                again = min(self._retry_cap, self._retry_base * 2**n)
                log.warning("%s %s failed (retry %d in %.1fs): %r", self._name, key, n + 1, again, error)
            else:
                self._failures.pop(key, None)
            if key in self._dirty:
                self._dirty.discard(key)
                if error is None:
                    self._enqueue(key)
            if again is not None and key not in self._queued:
                due = time.monotonic() + again
                if self._due.get(key, float("inf")) > due:
                    self._due[key] = due
                    heapq.heappush(self._delayed, (due, next(self._seq), key))
            self._cond.notify()

    # ------------------------------------------------------------ introspection
    def pending(self) -> int:
        """Keys queued, running or waiting for a delay (tests wait for 0)."""
        with self._cond:
            return len(self._queued) + len(self._running) + len(self._due)
