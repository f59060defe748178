"""A local, memory-mapped copy of the runs a Python worker reads, shared by the workers of one machine.

The truth about a key group's state is in Spark's state store (:mod:`spark_runtime.engine.state_layout`); reading a
run from there is a round trip to the JVM that copies its bytes. Runs never change once written and their ids are
unique (a sequence number and a random part), so a copy on local disk never goes stale: :class:`RunCache` keeps one
file per run id, written once (to a temporary name, then renamed) and memory-mapped by every Python worker that
needs it, so the operating system's page cache holds one copy for all of them.

A missing or unreadable file is fetched again from the state store; a failed write is only logged (the run is used
from memory). The cache never decides what the state is: the state store's list of runs does. Files of runs a
compaction replaced are removed by the worker that replaced them; a run written by a batch that Spark retried is
an orphan that :meth:`RunCache.trim` removes when the directory outgrows its budget.

Bounded on disk: a worker trims the directory back to its budget (:func:`budget_bytes`: ``$TASKSHARD_RUN_CACHE_BYTES``,
which the operator derives from the pod's ``/tmp`` size limit, else :data:`BUDGET_BYTES`; least recently written
files first)
each time it has written an eighth of the budget since its last trim, and a driver's directory
(:func:`process_cache_dir`) goes with its process, including one an earlier run of the same container left behind
when it was killed (the pod's ``/tmp`` outlives a container restart).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path

from spark_runtime.engine.runs import Run
from spark_runtime.protocol import RUN_CACHE_BYTES_ENV

__all__ = ["BUDGET_BYTES", "RunCache", "budget_bytes", "process_cache_dir"]

log = logging.getLogger("taskshard.engine")

BUDGET_BYTES = 4 << 30
"""Bytes of run copies a cache directory holds before a worker trims it (a copy trimmed is fetched again), when
``$TASKSHARD_RUN_CACHE_BYTES`` is not set."""


def budget_bytes(environ: Mapping[str, str] = os.environ) -> int:
    """The cache's budget: ``$TASKSHARD_RUN_CACHE_BYTES`` (a positive integer) or :data:`BUDGET_BYTES`; a value
    that is not a positive integer is refused by name (the operator writes it, so this is a broken pod spec)."""
    raw = environ.get(RUN_CACHE_BYTES_ENV)
    if raw is None:
        return BUDGET_BYTES
    if not raw.isdigit() or int(raw) <= 0:
        raise ValueError(f"${RUN_CACHE_BYTES_ENV}: {raw!r}: must be a positive integer (bytes)")
    return int(raw)


DIR_PREFIX = "taskshard-runs-"

OPEN_RUNS = 4096
"""Runs kept open (memory-mapped) per worker; the least recently used beyond this are closed."""


class RunCache:
    """Runs by id under ``directory`` (created on first use), see the module docstring."""

    def __init__(self, directory: str, *, budget_bytes: int = 0) -> None:
        self.directory = Path(directory)
        self.budget_bytes = budget_bytes
        self._written = 0
        """Bytes this worker stored since its last trim."""
        self._open: OrderedDict[str, Run] = OrderedDict()
        self._lock = threading.Lock()
        self._usable: bool | None = None
        self.fetched = 0
        """Runs read from the state store (not found on disk) by this worker; for tests and benchmarks."""

    def _ready(self) -> bool:
        if self._usable is None:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._usable = os.access(self.directory, os.W_OK)
            except OSError as exc:
                log.warning(
                    "run cache %s unusable, runs are read from the state store each time: %s", self.directory, exc
                )
                self._usable = False
        return self._usable

    def _path(self, run_id: str) -> Path:
        return self.directory / f"{run_id}.arrow"

    def get(self, run_id: str, fetch: Callable[[], bytes]) -> Run:
        """The run ``run_id``: open already, else memory-mapped from its file, else ``fetch()``-ed (its bytes from the
        state store) and kept on disk."""
        with self._lock:
            run = self._open.get(run_id)
            if run is not None:
                self._open.move_to_end(run_id)
                return run
        run = self._map(run_id)
        if run is None:
            data = fetch()
            self.fetched += 1
            self._store(run_id, data)
            run = self._map(run_id) or Run.from_buffer(data)
        self._remember(run_id, run)
        return run

    def put(self, run_id: str, run: Run, data: bytes) -> None:
        """Keep a run this worker just wrote (``data``: its bytes)."""
        self._store(run_id, data)
        self._remember(run_id, run)

    def forget(self, run_ids: list[str]) -> None:
        """Close and remove the runs a compaction replaced (a retried batch that needs them fetches them again)."""
        with self._lock:
            for run_id in run_ids:
                self._open.pop(run_id, None)
        if not self._ready():
            return
        for run_id in run_ids:
            try:
                self._path(run_id).unlink(missing_ok=True)
            except OSError:
                pass

    def trim(self) -> None:
        """Remove the least recently modified files while the directory holds more than the budget (0: no budget)."""
        self._written = 0
        if not self.budget_bytes or not self._ready():
            return
        files = []
        for entry in os.scandir(self.directory):
            if entry.name.endswith(".arrow"):
                st = entry.stat()
                files.append((st.st_mtime, st.st_size, entry.path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.budget_bytes:
                break
            try:
                os.unlink(path)
            except OSError:
                continue
            total -= size

    def _map(self, run_id: str) -> Run | None:
        if not self._ready():
            return None
        path = self._path(run_id)
        try:
            import pyarrow as pa

            return Run.from_buffer(pa.memory_map(str(path), "r"))
        except FileNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001 - a damaged copy is fetched again
            log.warning("run cache: %s unreadable, fetched again: %s", path, exc)
            return None

    def _store(self, run_id: str, data: bytes) -> None:
        if not self._ready():
            return
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self._path(run_id))
        except OSError as exc:
            log.warning("run cache: %s not kept: %s", run_id, exc)
            return
        self._written += len(data)
        if self.budget_bytes and self._written * 8 >= self.budget_bytes:
            self.trim()

    def _remember(self, run_id: str, run: Run) -> None:
        with self._lock:
            self._open[run_id] = run
            self._open.move_to_end(run_id)
            while len(self._open) > OPEN_RUNS:
                self._open.popitem(last=False)


_CACHES: dict[str, RunCache] = {}


def run_cache(directory: str) -> RunCache:
    """The worker's cache for ``directory`` (one per directory per process), trimmed to :func:`budget_bytes`."""
    cache = _CACHES.get(directory)
    if cache is None:
        cache = _CACHES[directory] = RunCache(directory, budget_bytes=budget_bytes())
    return cache


_PROCESS_CACHE_DIR: list[str] = []


def process_cache_dir(parent: str | None = None) -> str:
    """The run-cache directory of this (driver) process, ``<tmp>/taskshard-runs-<pid>-<random>``, created on first
    use and removed at its exit; its Python workers share it (run ids are unique, so shards of one process may
    share it too). Creating it removes the directories of processes that are gone, and one of this very pid: a
    process killed without its exit hooks (SIGKILL, an OOM kill) in a container that restarted in place left it."""
    if not _PROCESS_CACHE_DIR:
        root = Path(parent or tempfile.gettempdir())
        for old in root.glob(f"{DIR_PREFIX}*"):
            pid = old.name[len(DIR_PREFIX) :].partition("-")[0]
            if pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))):
                shutil.rmtree(old, ignore_errors=True)
                log.info("run cache: removed %s, left by a process that is gone", old)
        path = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-", dir=root)
        atexit.register(shutil.rmtree, path, True)
        _PROCESS_CACHE_DIR.append(path)
    return _PROCESS_CACHE_DIR[0]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
