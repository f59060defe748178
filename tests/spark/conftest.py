"""Fixtures of the shard-runtime Spark tests: one shared SparkSession, a task factory, a reference model.

The JVM and the first micro-batch dominate a tiny streaming job's time, so every in-process test shares one
session (``shard_spark``) and tests that look at one run from several angles share a module-scoped run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.jvm import DRIVER_JVM_CONF

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

REPO = Path(__file__).resolve().parents[2]

SPARK_CONF = {
    **DRIVER_JVM_CONF,
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.enabled": "false",
    "spark.default.parallelism": "2",
}


@pytest.fixture(scope="session")
def shard_spark():
    """The SparkSession shared by the in-process shard tests (RocksDB state store, changelog checkpointing)."""
    pytest.importorskip("pyspark")
    from spark_runtime.session import spark_session

    return spark_session("local[2]", SPARK_CONF, app_name="taskshard-spark-tests")


# ---------------------------------------------------------------- reference model


class Reference:
    """The plain-Python model of a task's result: per-key count, or per-key sum of a field, over the valid
    events in journal order. Validity follows the record contract (see spark_runtime.records)."""

    def __init__(self, kind: str, field: str | None = None, key_field: str = "key") -> None:
        self.kind, self.field, self.key_field = kind, field, key_field
        self.results: dict[str, Any] = {}

    def key_of(self, event: Any) -> str | None:
        if not isinstance(event, dict):
            return None
        k = event.get(self.key_field)
        if type(k) is str:
            return k
        if type(k) is int:
            return str(k)
        return None

    def add(self, event: Any) -> bool:
        key = self.key_of(event)
        if key is None:
            return False
        if self.kind == "count":
            self.results[key] = self.results.get(key, 0) + 1
            return True
        value = event.get(self.field)
        if type(value) not in (int, float):
            return False
        self.results[key] = self.results.get(key, 0) + value
        return True

    def add_all(self, events: Iterable[Any]) -> None:
        for e in events:
            self.add(e)


# ---------------------------------------------------------------- a task under test


@dataclass
class TaskEnv:
    """Directories of one task (journal, sink, storage) and helpers to configure and drive its shards."""

    root: Path
    task: str = "orders"
    partitions: int = 2
    max_key_groups: int = 16
    processor: dict[str, Any] = field(default_factory=lambda: {"builtin": "count"})
    conf: dict[str, str] = field(default_factory=dict)
    trigger: str = "300 milliseconds"
    sink_format: str = "jsonl"
    partitioned_by_key: bool = False

    @property
    def journal(self) -> Path:
        return self.root / "journal"

    @property
    def sink(self) -> Path:
        return self.root / "out"

    @property
    def storage(self) -> Path:
        return self.root / "state"

    def shard_name(self, start: int, end: int) -> str:
        return f"{self.task}-{start}-{end}"

    def config_dict(self, start: int, end: int, restore: dict[str, str] | None = None, **extra: Any) -> dict:
        return {
            "task": self.task,
            "shard": self.shard_name(start, end),
            "maxKeyGroups": self.max_key_groups,
            "keyGroups": {"start": start, "end": end},
            "processor": self.processor,
            "source": {
                "journal": {
                    "path": str(self.journal),
                    "partitions": self.partitions,
                    "partitionedByKey": self.partitioned_by_key,
                }
            },
            "sink": {"directory": {"path": str(self.sink), "format": self.sink_format}},
            "storage": {"path": str(self.storage)},
            "restoreFrom": restore,
            "spark": {"master": "local[2]", "conf": {**SPARK_CONF, **self.conf}, "triggerInterval": self.trigger},
            "terminationMessagePath": str(self.root / f"termination-{start}-{end}.log"),
            "metricsPort": 0,  # many runtimes share this host; tests that scrape pass their own port
            **extra,
        }

    def config(self, start: int, end: int, restore: dict[str, str] | None = None, **extra: Any):
        from spark_runtime.config import parse_config

        return parse_config(self.config_dict(start, end, restore, **extra))

    def produce(self, events: list[dict[str, Any]]) -> None:
        from spark_runtime.produce import append_events

        append_events(self.journal, self.partitions, events)

    def journal_ends(self) -> dict[str, int]:
        """Per partition file: the end of its last complete line (what a caught-up shard has read)."""
        ends = {}
        for p in range(self.partitions):
            path = self.journal / f"p{p}.jsonl"
            data = path.read_bytes() if path.exists() else b""
            ends[f"p{p}.jsonl"] = data.rfind(b"\n") + 1
        return ends

    def results(self) -> dict[str, Any]:
        from spark_runtime.results import final_results

        return final_results(self.sink, self.storage, self.task)

    def progress(self, shard: str) -> dict[str, Any] | None:
        path = self.storage / self.task / "shards" / shard / "progress.json"
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None


@pytest.fixture
def make_task(tmp_path) -> Callable[..., TaskEnv]:
    """Factory: ``make_task(processor={...}, partitions=2, ...)`` -> a :class:`TaskEnv` under ``tmp_path``."""
    counter = iter(range(1000))

    def make(**kwargs: Any) -> TaskEnv:
        return TaskEnv(root=tmp_path / f"task{next(counter)}", **kwargs)

    return make


def wait_caught_up(env: TaskEnv, runners: list[Any], timeout: float = 120.0) -> None:
    """Poll in-process runners until each has committed a batch whose positions reach the journal's end (of the
    partition files the runner reads: all of them, or its own with ``partitionedByKey``)."""
    target = env.journal_ends()
    deadline = time.monotonic() + timeout
    pending = list(runners)
    while pending and time.monotonic() < deadline:
        for r in list(pending):
            r.poll()
            prog = env.progress(r.config.shard)
            if prog and prog["positions"] == {name: target[name] for name in r.source.positions_names()}:
                pending.remove(r)
        time.sleep(0.2)
    assert not pending, f"shards {[r.config.shard for r in pending]} did not catch up to {target} in {timeout}s"


def wait_progress(env: TaskEnv, shard: str, predicate: Callable[[dict], bool], timeout: float = 120.0) -> dict:
    """Wait until ``progress.json`` of ``shard`` satisfies ``predicate`` (for shards in subprocesses)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        prog = env.progress(shard)
        if prog is not None and predicate(prog):
            return prog
        time.sleep(0.25)
    raise AssertionError(f"progress of {shard} never satisfied the condition: {env.progress(shard)}")


def children_ready(env: TaskEnv, parent: str, start: int, end: int, mode: str = "restore") -> None:
    """Write the ready notes two (restore-mode) children of ``parent`` would write for ``[start, end)``: the
    signal that makes a running parent drain for good (``spark_runtime.handover``)."""
    from spark_runtime.layout import ShardPaths
    from spark_runtime.protocol import HandoverMode, HandoverNote

    paths = ShardPaths.of(env.storage, env.task, parent)
    paths.handover_dir.mkdir()
    mid = (start + end) // 2
    for a, b in ((start, mid), (mid, end)):
        child = env.shard_name(a, b)
        paths.handover_ready(child).write_json(HandoverNote(child, a, b, HandoverMode(mode)).to_json())


class ShardProcess:
    """A shard in its own process group (like a pod: killing the group kills the JVM too)."""

    def __init__(self, env: TaskEnv, config_path: Path, name: str, extra_env: dict[str, str] | None = None) -> None:
        self.log_path = env.root / f"{name}.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in wait()
        from spark_runtime.faults import KILL_AFTER_SINK_BATCH_ENV as FAULT_ENV

        proc_env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
        proc_env.update({"PYSPARK_PYTHON": sys.executable, **(extra_env or {})})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "spark_runtime", "run", "--config", str(config_path)],
            cwd=REPO,
            env=proc_env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            self.log.close()
        # The JVM child (same process group) must be gone before a restart touches the checkpoint.
        self.kill_group()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        return code

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]
