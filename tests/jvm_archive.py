"""The test bed's class-data-sharing archive of a shard driver's classes (HotSpot AppCDS, dynamic archive).

A Spark driver JVM loads, verifies and links some 15,000 classes before its first batch; on the 2-core test
machines that is a third of a shard's start-up CPU. HotSpot can map those classes, already parsed and verified,
from an archive written at the exit of an earlier JVM (``-XX:ArchiveClassesAtExit``, then
``-XX:SharedArchiveFile``). :func:`ensure_archive` writes one archive per machine, from a real shard run (the
runtime's ``python -m spark_runtime run`` on a small journal with a Python processor, stopped by SIGTERM), into
the test cache; :data:`tests.jvm.DRIVER_JVM_OPTIONS` points every test driver at it.

Contract:
- The archive's name hashes what its classes come from (the JVM binary and the pyspark jars), so a new JDK or
  Spark writes a new archive and never reads a stale one. HotSpot checks the rest itself: a JVM whose class path
  does not start with the archive's (the integration tier adds the Kafka and S3 jars), or a missing archive,
  runs exactly as without it (its warning is silenced by ``-Xlog:cds=off``); a tier with more jars asks for
  an archive of its own class path. The archive changes no result.
- Writing is idempotent and safe across processes: an exclusive lock, a temporary name, then a rename.
- A failure to write it is reported (a warning on the terminal) and the tests run without it, slower.
- The product, the real-node tier and the benchmarks never use it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WRITE_TIMEOUT_S = 300.0


def _java_binary() -> Path:
    home = os.environ.get("JAVA_HOME")
    found = shutil.which("java")
    java = Path(home) / "bin" / "java" if home else Path(found or "java")
    return java.resolve() if java.exists() else java


def _pyspark_jars() -> Path | None:
    try:
        import pyspark
    except ImportError:
        return None
    return Path(pyspark.__file__).parent / "jars"


def archive_path(extra_classpath: str = "") -> Path:
    """Where this machine's archive for drivers with ``extra_classpath`` in front of pyspark's jars (the
    runtime's ``TASKSHARD_EXTRA_JARS``, ``os.pathsep``-separated jar files) lives (``$TASKSHARD_CDS_CACHE``,
    default ``~/.cache/taskshard/cds``)."""
    java = _java_binary()
    jars = _pyspark_jars()
    digest = hashlib.sha1()
    digest.update(str(java).encode())
    if java.exists():
        digest.update(str(java.stat().st_mtime_ns).encode())
    if jars is not None and jars.is_dir():
        for jar in sorted(jars.iterdir()):
            digest.update(f"{jar.name}:{jar.stat().st_size}".encode())
    digest.update(extra_classpath.encode())
    cache = Path(os.environ.get("TASKSHARD_CDS_CACHE") or Path.home() / ".cache" / "taskshard" / "cds")
    return cache / f"shard-driver-{digest.hexdigest()[:16]}.jsa"


def ensure_archive(base_options: str, extra_classpath: str = "") -> Path | None:
    """Write the archive unless it exists; its path, or ``None`` (with a warning) when it could not be written.

    ``base_options`` are the drivers' other JVM options (the archive is written by a JVM run with them)."""
    path = archive_path(extra_classpath)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return path
        started = time.monotonic()
        try:
            _write(path, base_options, extra_classpath)
        except Exception as exc:  # noqa: BLE001 - the tests still run without it
            warnings.warn(f"the drivers' class archive was not written ({exc}); tests run without it", stacklevel=2)
            return None
        print(f"[tests] wrote {path} in {time.monotonic() - started:.0f} s", file=sys.stderr)
        return path


def _write(path: Path, base_options: str, extra_classpath: str) -> None:
    from spark_runtime.produce import append_events

    with tempfile.TemporaryDirectory(prefix="taskshard-cds-") as tmp:
        root = Path(tmp)
        partial = path.with_name(path.name + f".{os.getpid()}.partial")
        events = [{"key": f"k{i % 37}", "amount": i % 11} for i in range(300)] + [{"bad": True}]
        append_events(root / "journal", 2, events)
        config = {
            "task": "archive",
            "shard": "archive-0-16",
            "maxKeyGroups": 16,
            "keyGroups": {"start": 0, "end": 16},
            "processor": {"python": "spark_runtime.processor:SumProcessor", "parameters": {"field": "amount"}},
            "source": {"journal": {"path": str(root / "journal"), "partitions": 2}},
            "sink": {"directory": {"path": str(root / "out"), "format": "jsonl"}},
            "storage": {"path": str(root / "state")},
            "spark": {
                "master": "local[2]",
                "conf": {
                    "spark.driver.extraJavaOptions": f"{base_options} -XX:ArchiveClassesAtExit={partial}",
                    "spark.sql.shuffle.partitions": "2",
                    "spark.default.parallelism": "2",
                },
                "triggerInterval": "300 milliseconds",
            },
            "terminationMessagePath": str(root / "termination.log"),
            "metricsPort": 0,
        }
        (root / "shard.json").write_text(json.dumps(config))
        log_path = root / "shard.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "spark_runtime", "run", "--config", str(root / "shard.json")],
                cwd=REPO,
                env={**os.environ, "PYSPARK_PYTHON": sys.executable, "TASKSHARD_EXTRA_JARS": extra_classpath},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                commits = root / "state" / "archive" / "shards" / "archive-0-16" / "checkpoint" / "commits"
                deadline = time.monotonic() + WRITE_TIMEOUT_S
                for batch in ("0", "1"):  # a second batch, after more input: the classes of a batch that reads
                    while not (commits / batch).exists():
                        if proc.poll() is not None:
                            raise RuntimeError(f"the archive's shard exited with {proc.returncode}: {_tail(log_path)}")
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"the archive's shard committed no batch {batch} in time")
                        time.sleep(0.5)
                    append_events(root / "journal", 2, events)
                proc.send_signal(signal.SIGTERM)  # a stop at a batch boundary; the JVM exits and writes the archive
                code = proc.wait(timeout=WRITE_TIMEOUT_S)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        _wait_gone(proc.pid)
        if code != 0 or not partial.exists():
            partial.unlink(missing_ok=True)
            raise RuntimeError(f"the archive's shard exited with {code} and wrote no archive: {_tail(log_path)}")
        partial.rename(path)


def _wait_gone(group: int) -> None:
    """The JVM (same process group) writes the archive as it exits: wait until the group is gone."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(group, signal.SIGKILL)


def _tail(log_path: Path) -> str:
    return log_path.read_text(errors="replace")[-1500:]
