"""Fault injection for crash tests only, every hook of the runtime in one place: die at a named step of the drain,
or at, after or inside a named batch.

**Never set this in production.** ``TASKSHARD_FAULT_KILL_AT_DRAIN_STEP`` exists so that tests can prove each drain
step of :meth:`spark_runtime.shard.ShardRunner.drain` is safe to crash in (tests/spark/test_drain_crashes.py). It
names one step of :data:`DRAIN_STEPS`; the runtime, on reaching that step, logs one line and exits at once with
code 137 (``os._exit``: no ``finally``, no cleanup, no termination message), as a SIGKILL of the pod (an OOM
kill, a lost node) would. The JVM this process started is SIGKILLed first, since it dies with the pod too: no
Spark job in flight writes anything after the crash point.

Steps, in drain order (the hook is called at each; a restart repeats the drain from the step it reached):

``marker``
    after step 1: the drain marker is written.
``stopped``
    after steps 2-3: the query is stopped at a batch boundary (a restart of a final drain has no query).
``mid-export``
    during step 5: the state export has written some of its files, not all (nor ``_SUCCESS``).
``exported``
    after step 5: the state directory is complete; no manifest yet.
``manifest``
    after step 6: the snapshot's manifest exists.
``summary``
    after step 7: ``drained.json`` exists (final drain); the termination message is not written yet.

An unset or empty variable injects nothing. A value that is not one of the steps raises :class:`FaultConfigError`
at the first check (a typo must not make a crash test pass without crashing).

The batch faults (each names a batch id; unset, empty or not a number: nothing):

``TASKSHARD_FAULT_KILL_AFTER_SINK_BATCH``
    SIGKILL the process right after the sink wrote that batch's output (pending, before Spark commits the
    batch), the worst moment for exactly-once (:func:`kill_after_sink_batch`).
``TASKSHARD_FAULT_FAIL_BATCH``
    that batch raises in ``foreachBatch`` before its output (a poison batch; :func:`fail_batch`).
``TASKSHARD_FAULT_PAUSE_IN_BATCH`` stops the runtime's process with SIGSTOP inside that batch's
``foreachBatch``, right after its fence check and before its output: a zombie paused across its successor's claim
(a frozen VM, a long GC). The test resumes it with SIGCONT (:func:`pause_in_batch`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = [
    "FAIL_BATCH_ENV",
    "KILL_AFTER_SINK_BATCH_ENV",
    "PAUSE_IN_BATCH_ENV",
    "fail_batch",
    "kill_after_sink_batch",
    "pause_in_batch",
    "CRASH_EXIT_CODE",
    "DRAIN_STEPS",
    "KILL_AT_DRAIN_STEP_ENV",
    "FaultConfigError",
    "crash_point",
    "crash_when",
    "export_in_progress",
    "kill_at_drain_step",
]

log = logging.getLogger("taskshard.shard")

KILL_AT_DRAIN_STEP_ENV = "TASKSHARD_FAULT_KILL_AT_DRAIN_STEP"
"""Fault injection for crash tests (never in production): the drain step (:data:`DRAIN_STEPS`) to die at."""
DRAIN_STEPS = ("marker", "stopped", "mid-export", "exported", "manifest", "summary")
"""The crash points of a drain, in order (see the module docstring)."""
CRASH_EXIT_CODE = 137
"""The exit code of the injected crash: what a container killed by SIGKILL reports (128 + 9)."""
WATCH_INTERVAL_SECONDS = 0.005
"""How often :func:`crash_when` asks its probe."""


KILL_AFTER_SINK_BATCH_ENV = "TASKSHARD_FAULT_KILL_AFTER_SINK_BATCH"
"""Fault injection for crash tests (never in production): SIGKILL after the sink wrote this batch's output."""
FAIL_BATCH_ENV = "TASKSHARD_FAULT_FAIL_BATCH"
"""Fault injection for tests (never in production): this batch raises in ``foreachBatch``."""


def _batch_id(env_name: str) -> int | None:
    value = os.environ.get(env_name, "").strip()
    return int(value) if value.lstrip("-").isdigit() else None


def fail_batch() -> int | None:
    """The batch id :data:`FAIL_BATCH_ENV` names, or None."""
    return _batch_id(FAIL_BATCH_ENV)


def kill_after_sink_batch() -> int | None:
    """The batch id :data:`KILL_AFTER_SINK_BATCH_ENV` names, or None."""
    return _batch_id(KILL_AFTER_SINK_BATCH_ENV)


class FaultConfigError(ValueError):
    """``TASKSHARD_FAULT_KILL_AT_DRAIN_STEP`` names no drain step."""


def kill_at_drain_step(env: Mapping[str, str] | None = None) -> str | None:
    """The step named by :data:`KILL_AT_DRAIN_STEP_ENV` (None: unset or empty); raises :class:`FaultConfigError`
    for any other value, naming the variable, the value and the allowed steps."""
    value = (os.environ if env is None else env).get(KILL_AT_DRAIN_STEP_ENV, "").strip()
    if not value:
        return None
    if value not in DRAIN_STEPS:
        raise FaultConfigError(
            f"{KILL_AT_DRAIN_STEP_ENV}={value!r} is not a drain step; allowed: {', '.join(DRAIN_STEPS)} "
            "(a fault hook for crash tests only: unset it)"
        )
    return value


def _armed(step: str) -> bool:
    if step not in DRAIN_STEPS:  # a caller's typo, not the environment's
        raise ValueError(f"unknown drain step {step!r}; the crash points are {', '.join(DRAIN_STEPS)}")
    return kill_at_drain_step() == step


def export_in_progress(state_dir: Any) -> bool:
    """Whether a Spark export into ``state_dir`` (a :class:`~spark_runtime.storage.Loc`) has written a part file
    (in ``_temporary`` or already in place) but not finished (no ``_SUCCESS``): the probe of ``mid-export``."""
    from pyarrow import fs

    infos = state_dir.fs.get_file_info(fs.FileSelector(state_dir.path, allow_not_found=True, recursive=True))
    names = [info.path.rsplit("/", 1)[-1] for info in infos if info.type == fs.FileType.File]
    return "_SUCCESS" not in names and any(name.endswith(".parquet") for name in names)


def _die(step: str, detail: str = "") -> None:
    log.warning(
        "fault injection: killed at drain step %r%s (%s); exit %d",
        step,
        f" ({detail})" if detail else "",
        KILL_AT_DRAIN_STEP_ENV,
        CRASH_EXIT_CODE,
    )
    for handler in logging.getLogger().handlers + log.handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    # The JVM dies with the pod: kill it first, so that nothing of a Spark job in flight lands after this point.
    pyspark = sys.modules.get("pyspark")
    gateway = getattr(getattr(pyspark, "SparkContext", None), "_gateway", None)
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        with contextlib.suppress(OSError):
            os.kill(proc.pid, signal.SIGKILL)
    os._exit(CRASH_EXIT_CODE)


def crash_point(step: str, detail: str = "") -> None:
    """Die (exit 137) when :data:`KILL_AT_DRAIN_STEP_ENV` names ``step``; otherwise nothing."""
    if _armed(step):
        _die(step, detail)


@contextlib.contextmanager
def crash_when(step: str, probe: Callable[[], bool], detail: str = "") -> Iterator[None]:
    """Within the block, when :data:`KILL_AT_DRAIN_STEP_ENV` names ``step``: die (exit 137) as soon as ``probe()``
    is true (asked every :data:`WATCH_INTERVAL_SECONDS` in a thread; for a crash in the middle of work the runtime
    does not do itself, e.g. Spark writing a snapshot). The caller decides what a block that ends without the
    probe firing means (usually: :func:`crash_point` right after it). Otherwise runs the block unchanged."""
    if not _armed(step):
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                hit = probe()
            except Exception:  # a listing racing the writer: ask again
                hit = False
            if hit and not done.is_set():
                _die(step, detail)
            done.wait(WATCH_INTERVAL_SECONDS)

    watcher = threading.Thread(target=watch, name=f"taskshard-fault-{step}", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


PAUSE_IN_BATCH_ENV = "TASKSHARD_FAULT_PAUSE_IN_BATCH"
"""Fault injection for fencing tests (never in production): the batch id in whose ``foreachBatch`` the process
stops itself (SIGSTOP) after the fence check, before any output."""


def pause_in_batch(batch_id: int, env: Mapping[str, str] | None = None) -> None:
    """Stop this process (SIGSTOP) when :data:`PAUSE_IN_BATCH_ENV` names ``batch_id``; it goes on when resumed."""
    value = (os.environ if env is None else env).get(PAUSE_IN_BATCH_ENV, "").strip()
    if value.isdigit() and int(value) == batch_id:
        log.warning("fault injection: pausing (SIGSTOP) in batch %s, after its fence check", batch_id)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGSTOP)
