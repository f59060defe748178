"""Bad Task/TaskShard manifests shared by the unit tier (pydantic models) and the cluster tier (apiserver).

Each case is a JSON merge patch (RFC 7386: ``None`` deletes a key) applied to a valid base manifest, plus the
field path that both the models' ValidationError and the apiserver's rejection message must name. Using one
table for both tiers proves the models and the CRD schema/CEL agree on what is invalid.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_DIR = ROOT / "examples"
CRDS_DIR = ROOT / "crds"


def load_example(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES_DIR / name).read_text(encoding="utf-8"))


def example_files() -> list[Path]:
    return sorted(EXAMPLES_DIR.glob("*.yaml"))


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; returns a new object."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def base_task(name: str = "orders-count") -> dict[str, Any]:
    task = load_example("task-count-journal.yaml")
    task["metadata"] = {"name": name}
    return task


def base_shard(name: str = "orders-count-0-64", start: int = 0, end: int = 64) -> dict[str, Any]:
    return {
        "apiVersion": "taskshard.io/v1alpha1",
        "kind": "TaskShard",
        "metadata": {
            "name": name,
            "labels": {"taskshard.io/task": "orders-count", "taskshard.io/key-groups": f"{start}-{end}"},
        },
        "spec": {"taskRef": {"name": "orders-count"}, "keyGroups": {"start": start, "end": end}},
    }


@dataclass(frozen=True)
class BadCase:
    id: str
    kind: str  # "Task" or "TaskShard"
    spec_patch: dict[str, Any]
    field: str  # the field path both tiers must name, e.g. "spec.processor.field"

    def manifest(self, name: str | None = None) -> dict[str, Any]:
        base = base_task() if self.kind == "Task" else base_shard()
        obj = merge_patch(base, {"spec": self.spec_patch})
        if name:
            obj["metadata"]["name"] = name
        return obj


BAD_CASES: list[BadCase] = [
    # Task: bounds
    BadCase("maxKeyGroups-zero", "Task", {"maxKeyGroups": 0}, "spec.maxKeyGroups"),
    BadCase("maxKeyGroups-too-big", "Task", {"maxKeyGroups": 32769}, "spec.maxKeyGroups"),
    BadCase("initialShards-over-maxKeyGroups", "Task", {"initialShards": 129}, "spec.initialShards"),
    BadCase("initialShards-zero", "Task", {"initialShards": 0}, "spec.initialShards"),
    # Task: processor
    BadCase("processor-builtin-and-python", "Task", {"processor": {"python": "a.b:C"}}, "spec.processor"),
    BadCase("processor-neither", "Task", {"processor": {"builtin": None}}, "spec.processor"),
    BadCase("processor-sum-without-field", "Task", {"processor": {"builtin": "sum"}}, "spec.processor.field"),
    BadCase("processor-field-with-count", "Task", {"processor": {"field": "amount"}}, "spec.processor.field"),
    BadCase("processor-unknown-builtin", "Task", {"processor": {"builtin": "avg"}}, "spec.processor.builtin"),
    BadCase(
        "processor-bad-python-path",
        "Task",
        {"processor": {"builtin": None, "python": "not an import path"}},
        "spec.processor.python",
    ),
    # Task: source, sink, storage
    BadCase(
        "source-journal-and-kafka",
        "Task",
        {"source": {"kafka": {"bootstrapServers": "k:9092", "topic": "t"}}},
        "spec.source",
    ),
    BadCase("source-neither", "Task", {"source": {"journal": None}}, "spec.source"),
    BadCase("journal-relative-path", "Task", {"source": {"journal": {"path": "data/j"}}}, "spec.source.journal.path"),
    BadCase(
        "journal-zero-partitions", "Task", {"source": {"journal": {"partitions": 0}}}, "spec.source.journal.partitions"
    ),
    BadCase(
        "kafka-bad-servers",
        "Task",
        {"source": {"journal": None, "kafka": {"bootstrapServers": "no port", "topic": "t"}}},
        "spec.source.kafka.bootstrapServers",
    ),
    BadCase(
        "sink-directory-and-kafka",
        "Task",
        {"sink": {"kafka": {"bootstrapServers": "k:9092", "topic": "t"}}},
        "spec.sink",
    ),
    BadCase("sink-bad-format", "Task", {"sink": {"directory": {"format": "csv"}}}, "spec.sink.directory.format"),
    BadCase("sink-missing", "Task", {"sink": None}, "spec.sink"),
    BadCase("storage-path-and-s3", "Task", {"storage": {"s3": {"bucket": "state"}}}, "spec.storage"),
    BadCase("storage-neither", "Task", {"storage": {"path": None}}, "spec.storage"),
    BadCase(
        "storage-bad-bucket", "Task", {"storage": {"path": None, "s3": {"bucket": "No_Such"}}}, "spec.storage.s3.bucket"
    ),
    BadCase(
        "volume-hostPath-and-pvc",
        "Task",
        {"storage": {"volume": {"persistentVolumeClaim": {"claimName": "data"}}}},
        "spec.storage.volume",
    ),
    # Task: spark
    BadCase("spark-image-missing", "Task", {"spark": {"image": None}}, "spec.spark.image"),
    BadCase("spark-conf-key-without-prefix", "Task", {"spark": {"conf": {"sql.shuffle": "4"}}}, "spec.spark.conf"),
    # reserved keys (spark_runtime.reserved_conf): both tiers must name the key itself
    BadCase(
        "spark-conf-master-reserved",
        "Task",
        {"spark": {"conf": {"spark.master": "local[8]"}}},
        'spec.spark.conf["spark.master"]',
    ),
    BadCase(
        "spark-conf-s3a-endpoint-reserved",
        "Task",
        {"spark": {"conf": {"spark.hadoop.fs.s3a.endpoint": "http://elsewhere:9000"}}},
        'spec.spark.conf["spark.hadoop.fs.s3a.endpoint"]',
    ),
    BadCase(
        "spark-conf-kubernetes-namespace-reserved",
        "Task",
        {"spark": {"conf": {"spark.kubernetes.namespace": "other"}}},
        'spec.spark.conf["spark.kubernetes.namespace"]',
    ),
    BadCase(
        "spark-bad-quantity",
        "Task",
        {"spark": {"resources": {"requests": {"cpu": "lots"}}}},
        "spec.spark.resources.requests",
    ),
    BadCase("spark-bad-trigger", "Task", {"spark": {"triggerInterval": "fast"}}, "spec.spark.triggerInterval"),
    BadCase(
        "spark-negative-executors",
        "Task",
        {"spark": {"executors": {"instances": -1}}},
        "spec.spark.executors.instances",
    ),
    BadCase("retention-unknown", "Task", {"checkpointRetention": "Keep"}, "spec.checkpointRetention"),
    # TaskShard
    BadCase("keyGroups-empty", "TaskShard", {"keyGroups": {"start": 64, "end": 64}}, "spec.keyGroups"),
    BadCase("keyGroups-reversed", "TaskShard", {"keyGroups": {"start": 64, "end": 0}}, "spec.keyGroups"),
    BadCase("keyGroups-end-too-big", "TaskShard", {"keyGroups": {"end": 32769}}, "spec.keyGroups.end"),
    BadCase("keyGroups-negative-start", "TaskShard", {"keyGroups": {"start": -1}}, "spec.keyGroups.start"),
    BadCase("keyGroups-missing", "TaskShard", {"keyGroups": None}, "spec.keyGroups"),
    BadCase("split-at-outside", "TaskShard", {"split": {"requested": True, "at": 100}}, "spec.split.at"),
    BadCase("split-at-start", "TaskShard", {"split": {"requested": True, "at": 0}}, "spec.split.at"),
    BadCase("split-at-end", "TaskShard", {"split": {"requested": True, "at": 64}}, "spec.split.at"),
    BadCase(
        "split-one-group",
        "TaskShard",
        {"keyGroups": {"start": 5, "end": 6}, "split": {"requested": True}},
        "spec.split.requested",
    ),
    BadCase("taskRef-missing", "TaskShard", {"taskRef": None}, "spec.taskRef"),
    BadCase("taskRef-bad-name", "TaskShard", {"taskRef": {"name": "Bad_Name"}}, "spec.taskRef.name"),
    BadCase(
        "restoreFrom-relative-manifest",
        "TaskShard",
        {"restoreFrom": {"parent": "orders-count-0-128", "manifest": "snapshots/manifest.json"}},
        "spec.restoreFrom.manifest",
    ),
]
