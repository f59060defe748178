"""The typed state of one shard runtime, grouped by concern; the runner's collaborators share it.

- :class:`ShardIO`: what the shard reads and writes, fixed for the runtime's life: its config, storage and
  paths, its writer fence, source, sink, dead letters and live metrics. Built by :func:`open_shard`.
- :class:`RunState`: what the runtime learns while it runs: the plan as settled at start, a child's restore, the
  start positions, the SparkSession and the query, the standby timings. The runner and its preparation steps write
  it; a collaborator reads it, and the few fields one of them writes say so.

A collaborator (:class:`~spark_runtime.progress.Progress`, :class:`~spark_runtime.drain.Drain`, the hand-overs,
the snapshot writer, the state mapper) takes these two and the few callbacks it truly needs, never the runner.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_runtime.checkpoint import last_committed_batch
from spark_runtime.config import ConfigError, ShardConfig
from spark_runtime.fencing import WriterFence
from spark_runtime.identity import claim_task_storage
from spark_runtime.late import LateLetters
from spark_runtime.layout import ShardPaths, SinkPaths
from spark_runtime.live import state_map_seconds
from spark_runtime.metrics import ShardMetrics
from spark_runtime.pipeline import Plan, make_plan
from spark_runtime.sink import DeadLetterCounter, DirectorySinkWriter, KafkaSinkWriter
from spark_runtime.snapshot.restore import RestorePlan
from spark_runtime.sources import Source, SourceContext, make_source
from spark_runtime.storage import Loc, S3Settings, check_storage, location, s3_settings_from, storage_root

__all__ = ["RunState", "ShardIO", "open_shard"]

log = logging.getLogger("taskshard.shard")


@dataclass(frozen=True)
class ShardIO:
    """What one shard runtime reads and writes; fixed for its life."""

    config: ShardConfig
    s3: S3Settings
    storage: Loc
    """The Task's storage root (a directory or an S3 prefix)."""
    paths: ShardPaths
    fence: WriterFence
    """This runtime's writer epoch (:mod:`spark_runtime.fencing`): claimed at start, checked before every write."""
    source: Source
    sink: DirectorySinkWriter | KafkaSinkWriter
    sink_paths: SinkPaths | None
    """A directory sink's layout (None: a Kafka sink)."""
    dead_letter_dir: Path | None
    dead_letters: DeadLetterCounter | None
    late_letters: LateLetters | None
    """Late records' dead letters (only with event time, :mod:`spark_runtime.late`)."""
    metrics: ShardMetrics
    """The live metrics (:mod:`spark_runtime.metrics`)."""
    state_map_seconds: float
    """How often the state map is counted (:mod:`spark_runtime.state_map`; 0: never)."""

    def check_environment(self) -> None:
        """Preflight of every start: storage is writable and holds this Task's state, not another's
        (:mod:`spark_runtime.identity`). Raises :class:`spark_runtime.problems.EnvironmentProblem`."""
        check_storage(self.storage)
        cfg = self.config
        claim_task_storage(self.paths.task_dir, task=cfg.task, namespace=cfg.namespace, uid=cfg.task_uid)

    def start_session(self) -> Any:
        """A SparkSession for this shard: ``spark.master`` (executors on Kubernetes: the in-cluster API server, the
        pod's credentials and address) and :meth:`spark_conf`."""
        from spark_runtime.kubernetes import driver_conf
        from spark_runtime.session import spark_session

        master, pod_conf = driver_conf(self.config.spark.master, os.environ)
        return spark_session(master, {**pod_conf, **self.spark_conf()})

    def mark_ready(self) -> None:
        """Create ``readyFile`` (the pod's readiness: the shard emits), once."""
        path = self.config.ready_file
        if path and not Path(path).exists():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).touch()
            log.info("shard %s emits: ready", self.config.shard)

    def spark_conf(self) -> dict[str, str]:
        """The SparkSession's conf: s3a settings for ``storage.s3`` (credentials from the environment), then the
        user's ``spark.conf`` (which wins)."""
        conf: dict[str, str] = {}
        if self.config.storage.s3 is not None:
            conf.update(self.s3.hadoop_conf())
        conf.update(self.config.spark.conf)
        return conf

    def sink_description(self) -> str:
        """Where the results go, for ``lineage.json``."""
        if self.sink_paths is not None:
            return str(self.sink_paths.root)
        kafka = self.config.sink.kafka
        return f"kafka://{kafka.bootstrap_servers}/{kafka.topic}" if kafka is not None else ""


@dataclass
class RunState:
    """What one shard runtime learns while it runs; written by the runner and the preparation steps it calls
    (:mod:`spark_runtime.preparation`), and by a collaborator where a field says so."""

    plan: Plan
    """The processing plan; settled at start (state layout, schema, a child's watermark floor)."""
    spark: Any = None
    """The SparkSession, started on first use."""
    query: Any = None
    """The streaming query (None before the first start)."""
    restore: RestorePlan | None = None
    """A split or merged child's verified restore (its parents' slices, start positions, seed, skip rule)."""
    start_positions: dict[str, Any] | None = None
    """Where the query starts (a child: its parents'; Kafka's earliest/latest: pinned by
    :meth:`spark_runtime.progress.Progress.pin_start_positions`, which writes it)."""
    standby_seconds: float | None = None
    """Seconds a child spent on standby waiting for its parents (None: no standby); written by the hand-over."""
    rehearsal_seconds: float | None = None
    """Seconds the standby rehearsal of the restore took (None: none ran)."""
    source_context: SourceContext | None = None
    """What the source's stream was built with (set when the query starts)."""


def open_shard(config: ShardConfig) -> tuple[ShardIO, RunState]:
    """The shard's I/O and its initial run state (the plan with the state layout its checkpoint holds). Raises
    :class:`~spark_runtime.config.ConfigError` for a journal source with nowhere to write dead letters."""
    s3 = s3_settings_from(config.storage.s3)
    storage = storage_root(config.storage, s3)
    paths = ShardPaths.of(storage, config.task, config.shard)
    sink_paths = SinkPaths.of(config.sink.directory.path, config.shard) if config.sink.directory is not None else None
    dead_letter_dir = _dead_letter_dir(config, sink_paths)
    plan = make_plan(config)
    if plan.kind == "python":  # the layout its checkpoint holds (recorded before a first batch)
        from spark_runtime.engine import checkpoint_layout

        chosen = checkpoint_layout(paths.state_layout, last_committed_batch(paths.checkpoint), plan.state_buckets)
        plan = dataclasses.replace(plan, layout=chosen.layout, state_buckets=chosen.buckets)
    late = None
    if config.event_time is not None:  # next to the other dead letters, else in the shard's directory
        late = LateLetters(location(str(dead_letter_dir)) if dead_letter_dir is not None else paths.late_letters)
    kg = config.key_groups
    io = ShardIO(
        config=config,
        s3=s3,
        storage=storage,
        paths=paths,
        fence=WriterFence(paths),
        source=make_source(config.source, config.partitions_to_read),
        sink=_make_sink(config, plan, sink_paths),
        sink_paths=sink_paths,
        dead_letter_dir=dead_letter_dir,
        dead_letters=DeadLetterCounter(dead_letter_dir) if dead_letter_dir is not None else None,
        late_letters=late,
        metrics=ShardMetrics(config.task, config.shard, key_groups=(kg.start, kg.end)),
        state_map_seconds=state_map_seconds(config.spark.conf),
    )
    return io, RunState(plan=plan)


def _dead_letter_dir(config: ShardConfig, sink_paths: SinkPaths | None) -> Path | None:
    """Where the source's dead letters go: the directory sink's, else the Task's local storage."""
    if sink_paths is not None:
        return sink_paths.dead_letter_dir
    if config.storage.path is not None:
        return Path(config.storage.path).absolute() / config.task / "dead-letters" / f"shard={config.shard}"
    if config.source.journal is not None:
        raise ConfigError(
            [
                "source.journal: the journal writes dead letters to local files; with sink.kafka it needs "
                "storage.path (got storage.s3), or use sink.directory"
            ]
        )
    return None


def _make_sink(config: ShardConfig, plan: Plan, sink_paths: SinkPaths | None) -> DirectorySinkWriter | KafkaSinkWriter:
    """The sink writer of ``config.sink`` (a Python processor's and a window's Kafka records are numbered per key
    and batch)."""
    if config.sink.directory is not None:
        assert sink_paths is not None
        return DirectorySinkWriter(sink_paths, config.sink.directory.format, config.shard)
    assert config.sink.kafka is not None
    kafka = config.sink.kafka
    several = plan.kind == "python" or plan.window is not None
    return KafkaSinkWriter(kafka.bootstrap_servers, kafka.topic, config.shard, kafka.options, several_per_key=several)
