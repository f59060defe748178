"""Shared plumbing of the test infrastructure: caches, progress lines, free ports, managed processes.

Contract:
- Progress and diagnostics go to stderr as ``[testinfra <component> HH:MM:SS] message`` lines.
- :class:`ManagedProcess` starts a server in its own session (process group) with its output appended to a log
  file, and stops exactly that process group (SIGTERM, then SIGKILL after a timeout). Nothing else is signalled.
- :func:`run_with_progress` runs a long build step, summarises its output through a filter and prints a heartbeat
  while the step is silent, so a cold build never looks hung.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = [
    "ManagedProcess",
    "StartError",
    "bin_cache_dir",
    "free_port",
    "jar_cache_dir",
    "log",
    "run_with_progress",
    "wait_until",
]


class StartError(RuntimeError):
    """A server did not become healthy; the message carries the tail of its log."""


def log(component: str, message: str) -> None:
    print(f"[testinfra {component} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def jar_cache_dir() -> Path:
    """``$TASKSHARD_JAR_CACHE``, default ``~/.cache/taskshard/jars``."""
    return Path(os.environ.get("TASKSHARD_JAR_CACHE") or Path.home() / ".cache" / "taskshard" / "jars")


def bin_cache_dir() -> Path:
    """``$TASKSHARD_BIN_CACHE``, default ``~/.cache/taskshard/bin`` (shared with hack/build-binaries.sh)."""
    return Path(os.environ.get("TASKSHARD_BIN_CACHE") or Path.home() / ".cache" / "taskshard" / "bin")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def run_with_progress(
    cmd: Sequence[str],
    *,
    component: str,
    cwd: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    summarize: Callable[[str], str | None] = lambda line: None,
    heartbeat: float = 30.0,
    what: str = "",
    status: Callable[[], str] | None = None,
) -> tuple[int, list[str]]:
    """Run ``cmd``; print ``summarize(line)`` for each output line that yields text, and a heartbeat line
    (with ``status()`` appended, if given) every ``heartbeat`` seconds of silence. Returns the exit code and the
    last 60 output lines."""
    started = time.monotonic()
    proc = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env=dict(env) if env is not None else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    tail: deque[str] = deque(maxlen=60)
    last_print = [time.monotonic()]
    done = threading.Event()

    def beat() -> None:
        while not done.wait(5):
            if time.monotonic() - last_print[0] >= heartbeat:
                extra = ""
                if status is not None:
                    try:
                        extra = f"; {status()}"
                    except Exception:  # noqa: BLE001 - a status line is best effort
                        extra = ""
                log(component, f"still {what or 'working'} ({time.monotonic() - started:.0f}s{extra})")
                last_print[0] = time.monotonic()

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            text = summarize(line)
            if text:
                log(component, text)
                last_print[0] = time.monotonic()
        rc = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        done.set()
    return rc, list(tail)


def wait_until(
    probe: Callable[[], object], *, timeout: float, what: str, process: ManagedProcess | None = None
) -> object:
    """Poll ``probe`` until it returns a truthy value; raise :class:`StartError` (with the process's log tail)
    on timeout or when ``process`` exits first."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = probe()
        except Exception as e:  # noqa: BLE001 - keep polling, report the last error
            last = e
        else:
            if last:
                return last
        if process is not None and not process.alive():
            raise StartError(
                f"{process.name} exited with code {process.returncode} while waiting for {what}; "
                f"log {process.log_path}:\n{process.log_tail()}"
            )
        if time.monotonic() > deadline:
            tail = f"; log {process.log_path}:\n{process.log_tail()}" if process else ""
            raise StartError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r}){tail}")
        time.sleep(0.3)


class ManagedProcess:
    """One server process in its own process group, output appended to ``log_path``."""

    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def start(self, cmd: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        if self.alive():
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float = 30.0, *, sig: int = signal.SIGTERM) -> int | None:
        """Send ``sig`` to the process group, wait up to ``timeout`` s, then SIGKILL. Idempotent."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            self._signal(proc, sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal(proc, signal.SIGKILL)
                proc.wait(10)
        return proc.returncode

    def kill(self) -> int | None:
        """SIGKILL the process group at once (a crash, for restart tests)."""
        return self.stop(timeout=10, sig=signal.SIGKILL)

    @staticmethod
    def _signal(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # the group this object created with start_new_session, nothing else
        except ProcessLookupError:
            pass

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
