"""Bad and good Task/TaskShard manifests shared by the unit tier (pydantic models) and the cluster tier (apiserver).

Each bad case is a JSON merge patch (RFC 7386: ``None`` deletes a key) applied to a valid base manifest, plus the
field path that both the models' ValidationError and the apiserver's rejection message must name (and, for a
message built from the values, the exact text both must show). Each good case is a patch both must accept.
Using one table for both tiers proves the models and the CRD schema/CEL agree on what is (in)valid.
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
    """An example Task by its path under ``examples/``."""
    return yaml.safe_load((EXAMPLES_DIR / name).read_text(encoding="utf-8"))


def example_files() -> list[Path]:
    """The example Tasks: ``examples/*.yaml`` and the example processor package's ``examples/processors/*.yaml``."""
    return sorted(EXAMPLES_DIR.glob("*.yaml")) + sorted(EXAMPLES_DIR.glob("processors/*.yaml"))


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
    message: str | None = None  # the exact text both tiers must show, where the message carries the values

    def manifest(self, name: str | None = None) -> dict[str, Any]:
        base = base_task() if self.kind == "Task" else base_shard()
        obj = merge_patch(base, {"spec": self.spec_patch})
        if name:
            obj["metadata"]["name"] = name
        return obj


@dataclass(frozen=True)
class GoodCase:
    id: str
    spec_patch: dict[str, Any]  # applied to base_task()

    def manifest(self, name: str | None = None) -> dict[str, Any]:
        obj = merge_patch(base_task(), {"spec": self.spec_patch})
        if name:
            obj["metadata"]["name"] = name
        return obj


KAFKA = {"bootstrapServers": "kafka:9092", "topic": "orders"}


def kafka_source(**fields: Any) -> dict[str, Any]:
    """A spec patch replacing the base task's journal by a Kafka source with ``fields``."""
    return {"source": {"journal": None, "kafka": {**KAFKA, **fields}}}


WINDOW_EVENT_TIME = {"field": "ts", "maxOutOfOrdernessSeconds": 10}
"""An event time for the windowed builtins' cases."""


def journal_source(**fields: Any) -> dict[str, Any]:
    """A spec patch setting ``fields`` on the base task's journal (path /data/journal/orders, 4 partitions)."""
    return {"source": {"journal": fields}}


GOOD_CASES: list[GoodCase] = [
    GoodCase("journal-by-key-4-partitions-128-groups", journal_source(partitions=4, partitionedByKey=True)),
    GoodCase(
        "kafka-by-key-8-partitions-256-groups",
        {"maxKeyGroups": 256, **kafka_source(partitionedByKey=True, partitions=8)},
    ),
    GoodCase(
        "kafka-by-key-partitions-equal-groups", {"maxKeyGroups": 8, **kafka_source(partitionedByKey=True, partitions=8)}
    ),
    # without partitionedByKey the partition count need not divide maxKeyGroups (unchanged behaviour)
    GoodCase("journal-3-partitions-not-by-key", journal_source(partitions=3)),
    GoodCase("tmp-size-limit-1Gi", {"spark": {"tmpSizeLimit": "1Gi"}}),
    GoodCase("journal-by-key-false-3-partitions", journal_source(partitions=3, partitionedByKey=False)),
    GoodCase("kafka-by-key-false-without-partitions", kafka_source(partitionedByKey=False)),
    GoodCase("shards-up-to-maxKeyGroups", {"shards": 128}),
    GoodCase(
        "kafka-secured-options-and-secret",
        kafka_source(
            options={"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"}, credentialsSecret="k"
        ),
    ),
    GoodCase(
        "builtin-tumbling-count",
        {"processor": {"window": {"type": "tumbling", "sizeSeconds": 60}}, "eventTime": WINDOW_EVENT_TIME},
    ),
    GoodCase(
        "builtin-session-max-updates",
        {
            "processor": {"builtin": "max", "field": "amount", "window": {"type": "session", "gapSeconds": 1800}},
            "eventTime": WINDOW_EVENT_TIME,
        },
    ),
    GoodCase(
        "pod-template-placement-secrets-volumes",
        {
            "spark": {
                "podTemplate": {
                    "metadata": {"labels": {"team": "payments"}, "annotations": {"example.com/owner": "ops"}},
                    "spec": {
                        "nodeSelector": {"pool": "streaming"},
                        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
                        "affinity": {"nodeAffinity": {}},
                        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone"}],
                        "imagePullSecrets": [{"name": "registry"}],
                        "priorityClassName": "streaming",
                        "volumes": [{"name": "processors", "configMap": {"name": "my-processors"}}],
                    },
                },
                "volumeMounts": [{"name": "processors", "mountPath": "/opt/processors", "readOnly": True}],
            }
        },
    ),
    GoodCase("history-keeps-none", {"history": {"retiredShards": 0}}),
    GoodCase(
        "spark-conf-per-bucket-timeout", {"spark": {"conf": {"spark.hadoop.fs.s3a.bucket.b.connection.timeout": "5s"}}}
    ),
]


BAD_CASES: list[BadCase] = [
    # Task: bounds
    BadCase("maxKeyGroups-zero", "Task", {"maxKeyGroups": 0}, "spec.maxKeyGroups"),
    BadCase("maxKeyGroups-too-big", "Task", {"maxKeyGroups": 32769}, "spec.maxKeyGroups"),
    BadCase("initialShards-over-maxKeyGroups", "Task", {"initialShards": 129}, "spec.initialShards"),
    BadCase("initialShards-zero", "Task", {"initialShards": 0}, "spec.initialShards"),
    BadCase(
        "shards-over-maxKeyGroups",
        "Task",
        {"shards": 129},
        "spec.shards",
        "spec.shards: 129 must be at most spec.maxKeyGroups (128): each shard owns one key group or more, so a Task "
        "has at most maxKeyGroups shards",
    ),
    BadCase("shards-zero", "Task", {"shards": 0}, "spec.shards"),
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
    BadCase("processor-min-without-field", "Task", {"processor": {"builtin": "min"}}, "spec.processor.field"),
    # Task: builtin windows
    BadCase(
        "window-without-event-time",
        "Task",
        {"processor": {"window": {"type": "tumbling", "sizeSeconds": 60}}},
        "spec.processor.window",
    ),
    BadCase("event-time-with-builtin-and-no-window", "Task", {"eventTime": WINDOW_EVENT_TIME}, "spec.eventTime"),
    BadCase(
        "window-with-python",
        "Task",
        {
            "processor": {"builtin": None, "python": "a.b:C", "window": {"type": "session", "gapSeconds": 5}},
            "eventTime": WINDOW_EVENT_TIME,
        },
        "spec.processor.window",
    ),
    BadCase(
        "window-slide-over-size",
        "Task",
        {
            "processor": {"window": {"type": "sliding", "sizeSeconds": 60, "slideSeconds": 90}},
            "eventTime": WINDOW_EVENT_TIME,
        },
        "spec.processor.window.slideSeconds",
    ),
    BadCase(
        "window-tumbling-with-gap",
        "Task",
        {
            "processor": {"window": {"type": "tumbling", "sizeSeconds": 60, "gapSeconds": 5}},
            "eventTime": WINDOW_EVENT_TIME,
        },
        "spec.processor.window",
    ),
    BadCase(
        "window-with-allowed-lateness",
        "Task",
        {
            "processor": {"window": {"type": "tumbling", "sizeSeconds": 60}},
            "eventTime": {**WINDOW_EVENT_TIME, "allowedLatenessSeconds": 5},
        },
        "spec.eventTime.allowedLatenessSeconds",
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
    # Task: source partitioned by the key (key groups nested in partitions)
    BadCase(
        "kafka-by-key-groups-not-a-multiple",
        "Task",
        kafka_source(partitionedByKey=True, partitions=3),
        "spec.maxKeyGroups",
        "spec.maxKeyGroups (128) must be a multiple of spec.source.kafka.partitions (3) when partitionedByKey is "
        "true: e.g. 126 or 129, or set partitions to a divisor of 128",
    ),
    BadCase(
        "journal-by-key-groups-not-a-multiple",
        "Task",
        {"maxKeyGroups": 100, **journal_source(partitions=8, partitionedByKey=True)},
        "spec.maxKeyGroups",
        "spec.maxKeyGroups (100) must be a multiple of spec.source.journal.partitions (8) when partitionedByKey is "
        "true: e.g. 96 or 104, or set partitions to a divisor of 100",
    ),
    BadCase(
        "kafka-by-key-fewer-groups-than-partitions",
        "Task",
        {"maxKeyGroups": 4, "initialShards": 1, **kafka_source(partitionedByKey=True, partitions=6)},
        "spec.maxKeyGroups",
        "spec.maxKeyGroups (4) must be a multiple of spec.source.kafka.partitions (6) when partitionedByKey is "
        "true: e.g. 6, or set partitions to a divisor of 4",
    ),
    BadCase(
        "kafka-by-key-next-multiple-past-the-limit",
        "Task",
        {"maxKeyGroups": 32767, **kafka_source(partitionedByKey=True, partitions=1000)},
        "spec.maxKeyGroups",
        "spec.maxKeyGroups (32767) must be a multiple of spec.source.kafka.partitions (1000) when partitionedByKey "
        "is true: e.g. 32000, or set partitions to a divisor of 32767",
    ),
    BadCase(
        "kafka-by-key-without-partitions",
        "Task",
        kafka_source(partitionedByKey=True),
        "spec.source.kafka.partitions",
    ),
    BadCase(
        "kafka-partitions-without-by-key",
        "Task",
        kafka_source(partitions=8),
        "spec.source.kafka.partitions",
    ),
    BadCase(
        "kafka-partitions-too-many",
        "Task",
        {"maxKeyGroups": 20002, **kafka_source(partitionedByKey=True, partitions=10001)},
        "spec.source.kafka.partitions",
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
        "spark-conf-authenticate-reserved",
        "Task",
        {"spark": {"conf": {"spark.authenticate.secret": "guessable"}}},
        'spec.spark.conf["spark.authenticate.secret"]',
    ),
    BadCase(
        "spark-conf-ui-on",
        "Task",
        {"spark": {"conf": {"spark.ui.enabled": "true"}}},
        'spec.spark.conf["spark.ui.enabled"]',
        "spec.spark.ui: true",
    ),
    # spec.spark.podTemplate / volumeMounts: what the operator owns is refused by name, with the value
    BadCase(
        "pod-template-containers-owned",
        "Task",
        {"spark": {"podTemplate": {"spec": {"containers": [{"name": "sidecar"}]}}}},
        "spec.spark.podTemplate.spec.containers is set by the operator",
    ),
    BadCase(
        "pod-template-security-context-owned",
        "Task",
        {"spark": {"podTemplate": {"spec": {"securityContext": {"runAsUser": 0}}}}},
        "spec.spark.podTemplate.spec.securityContext is set by the operator",
    ),
    BadCase(
        "pod-template-operator-label",
        "Task",
        {"spark": {"podTemplate": {"metadata": {"labels": {"taskshard.io/shard": "x"}}}}},
        "spec.spark.podTemplate.metadata.labels",
        'spec.spark.podTemplate.metadata.labels["taskshard.io/shard"]: keys under taskshard.io/ are the operator\'s',
    ),
    BadCase(
        "pod-template-operator-volume-name",
        "Task",
        {"spark": {"podTemplate": {"spec": {"volumes": [{"name": "config", "emptyDir": {}}]}}}},
        "spec.spark.podTemplate.spec.volumes",
        'spec.spark.podTemplate.spec.volumes: the name "config" is the operator\'s',
    ),
    BadCase(
        "volume-mount-of-no-volume",
        "Task",
        {"spark": {"volumeMounts": [{"name": "extra", "mountPath": "/opt/extra"}]}},
        "spec.spark.volumeMounts",
        "every mount names a volume of spec.spark.podTemplate.spec.volumes",
    ),
    BadCase(
        "volume-mount-on-the-config-dir",
        "Task",
        {
            "spark": {
                "podTemplate": {"spec": {"volumes": [{"name": "extra", "emptyDir": {}}]}},
                "volumeMounts": [{"name": "extra", "mountPath": "/etc/taskshard"}],
            }
        },
        "spec.spark.volumeMounts",
        'spec.spark.volumeMounts: the path "/etc/taskshard" is the operator\'s',
    ),
    BadCase(
        "volume-mount-on-the-storage-path",
        "Task",
        {
            "spark": {
                "podTemplate": {"spec": {"volumes": [{"name": "extra", "emptyDir": {}}]}},
                "volumeMounts": [{"name": "extra", "mountPath": "/data"}],
            }
        },
        "spec.spark.volumeMounts",
        "the storage volume's mount path (spec.storage.volume.mountPath) is the operator's",
    ),
    BadCase(
        "driver-memory-below-1Gi",
        "Task",
        {"spark": {"resources": {"limits": {"memory": "512Mi"}}}},
        "spec.spark.resources",
        "a shard pod's memory (its limit, else its request) must be at least 1024Mi",
    ),
    BadCase(
        "executor-memory-below-1Gi",
        "Task",
        {"spark": {"executors": {"instances": 1, "resources": {"requests": {"memory": "768Mi"}}}}},
        "spec.spark.executors.resources",
    ),
    BadCase(
        "tmp-size-limit-below-1Gi",
        "Task",
        {"spark": {"tmpSizeLimit": "512Mi"}},
        "spec.spark.tmpSizeLimit",
        "must be at least 1024Mi: a quarter of it is the run cache",
    ),
    BadCase("history-negative", "Task", {"history": {"retiredShards": -1}}, "spec.history.retiredShards"),
    BadCase("no-progress-too-short", "Task", {"noProgressSeconds": 5}, "spec.noProgressSeconds"),
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
    BadCase(
        "kafka-options-reserved-key",
        "Task",
        kafka_source(options={"group.id": "mine"}),
        "spec.source.kafka.options",
        "spec.source.kafka.options.group.id: this Kafka client property is set by the runtime",
    ),
    BadCase(
        "kafka-options-password",
        "Task",
        kafka_source(options={"ssl.key.password": "x"}),
        "spec.source.kafka.options",
    ),
    BadCase(
        "spark-conf-per-bucket-endpoint",
        "Task",
        {"spark": {"conf": {"spark.hadoop.fs.s3a.bucket.other.endpoint": "http://elsewhere"}}},
        "spec.spark.conf",
        'spec.spark.conf["spark.hadoop.fs.s3a.bucket.other.endpoint"]',
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
