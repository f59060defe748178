"""Unit tests of the Task/TaskShard pydantic models: round trips, enums, and the shared bad-manifest table."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import yaml
from pydantic import ValidationError

from spark_runtime.keygroups import KeyGroupRange
from taskshard_operator.models import (
    Condition,
    ConditionStatus,
    ConditionType,
    KeyGroups,
    ShardPhase,
    SplitRequest,
    Task,
    TaskPhase,
    TaskShard,
    TaskShardSpec,
    TaskShardStatus,
    TaskSpec,
)

from .manifest_cases import (
    BAD_CASES,
    GOOD_CASES,
    base_shard,
    base_task,
    example_files,
    journal_source,
    kafka_source,
    merge_patch,
)

pytestmark = pytest.mark.unit

CONTRACT_SHARD_PHASES = [
    "Pending",
    "Running",
    "SplitRequested",
    "Draining",
    "Drained",
    "ChildrenCreated",
    "Split",
    "Failed",
    "Stopped",
    "Suspended",
    "AbortingSplit",
    "MergeRequested",
    "Merging",
    "Merged",
    "AbortingMerge",
]


def _subset(small, big) -> bool:
    """Every key/value of ``small`` appears in ``big`` (defaults may add more)."""
    if isinstance(small, dict):
        return isinstance(big, dict) and all(k in big and _subset(v, big[k]) for k, v in small.items())
    if isinstance(small, list):
        return isinstance(big, list) and len(small) == len(big) and all(map(_subset, small, big))
    return small == big


@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.name)
def test_examples_round_trip(path):
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    task = Task.from_k8s(raw)
    dumped = task.to_k8s()
    assert _subset(raw, dumped), "the model dropped or changed a field of the example"
    assert Task.from_k8s(dumped) == task
    assert Task.from_k8s(dumped).to_k8s() == dumped


def test_there_are_three_examples_of_each_processor_kind():
    specs = [Task.from_k8s(yaml.safe_load(p.read_text(encoding="utf-8"))).spec for p in example_files()]
    assert {s.processor.builtin for s in specs if s.processor.builtin} == {"count", "sum"}
    assert any(s.processor.python for s in specs)


def test_task_defaults():
    raw = base_task()
    for key in ("initialShards", "keyField", "checkpointRetention"):
        raw["spec"].pop(key)
    raw["spec"]["spark"].pop("triggerInterval")
    spec = Task.from_k8s(raw).spec
    assert (spec.initial_shards, spec.key_field, spec.checkpoint_retention) == (1, "key", "Retain")
    assert spec.spark.trigger_interval == "1 second"
    assert spec.storage.volume.mount_path == "/data"


def test_quantities_accept_ints_and_strings():
    raw = merge_patch(base_task(), {"spec": {"spark": {"resources": {"requests": {"cpu": 2, "memory": "1.5Gi"}}}}})
    requests = Task.from_k8s(raw).spec.spark.resources.requests
    assert requests == {"cpu": 2, "memory": "1.5Gi"}


def test_shard_round_trip_with_status():
    now = datetime(2026, 11, 22, 3, 4, 5, tzinfo=UTC)
    shard = TaskShard(
        metadata={"name": "orders-count-0-64"},
        spec=TaskShardSpec(
            task_ref={"name": "orders-count"},
            key_groups=KeyGroups.of(KeyGroupRange(0, 64)),
            split=SplitRequest(requested=True, at=10),
            restore_from={"parent": "orders-count-0-128", "manifest": "/data/state/m.json"},
        ),
        status=TaskShardStatus(
            phase=ShardPhase.DRAINED,
            conditions=[
                Condition(
                    type=ConditionType.SPLITTING,
                    status=ConditionStatus.TRUE,
                    reason="Drained",
                    last_transition_time=now,
                    observed_generation=2,
                )
            ],
            observed_generation=2,
            last_checkpoint={"batch_id": 7, "time": now},
            final_checkpoint={"batch_id": 7, "time": now, "manifest": "s3://b/p/manifest.json"},
            split={"at": 10, "accepted_time": now},
            lineage={"parent": "orders-count-0-128", "children": ["a", "b"]},
        ),
    )
    doc = shard.to_k8s()
    assert doc["spec"]["keyGroups"] == {"start": 0, "end": 64}
    assert doc["status"]["conditions"][0]["lastTransitionTime"] == "2026-11-22T03:04:05Z"
    assert doc["status"]["finalCheckpoint"]["batchId"] == 7
    assert doc["apiVersion"] == "taskshard.io/v1alpha1" and doc["kind"] == "TaskShard"
    assert TaskShard.from_k8s(doc) == shard


def test_shard_phases_match_the_contract_and_ownership():
    assert [p.value for p in ShardPhase] == CONTRACT_SHARD_PHASES
    owners = {p.value for p in ShardPhase if p.owns_range}
    assert owners == {
        "Pending",
        "Running",
        "SplitRequested",
        "Draining",
        "Drained",
        "Failed",
        "Suspended",
        "AbortingSplit",
        "MergeRequested",
        "Merging",
        "AbortingMerge",
    }
    for phase in ShardPhase:
        assert phase.value in ShardPhase.__doc__


def test_task_phase_and_condition_types():
    assert [p.value for p in TaskPhase] == [
        "Pending",
        "Running",
        "Splitting",
        "Merging",
        "Degraded",
        "Failed",
        "Stopping",
        "Suspended",
    ]
    assert [c.value for c in ConditionType] == [
        "Ready",
        "Tiled",
        "Splitting",
        "SplitRejected",
        "MergeRejected",
        "Progressing",
        "Degraded",
        "Scaled",
        "ExecutorsReady",
    ]


def test_key_groups_convert_to_ranges():
    kg = KeyGroups(start=3, end=9)
    assert kg.to_range() == KeyGroupRange(3, 9)
    assert KeyGroups.of(kg.to_range()) == kg


def test_models_are_frozen_and_forbid_unknown_fields():
    spec = TaskSpec.model_validate(base_task()["spec"])
    with pytest.raises(ValidationError):
        spec.max_key_groups = 4
    with pytest.raises(ValidationError, match="extra"):
        TaskSpec.model_validate({**base_task()["spec"], "maxKeygroups": 4})


def test_valid_split_requests():
    shard = TaskShard.from_k8s(merge_patch(base_shard(), {"spec": {"split": {"requested": True}}}))
    assert shard.spec.split.at is None
    shard = TaskShard.from_k8s(merge_patch(base_shard(), {"spec": {"split": {"requested": True, "at": 1}}}))
    assert shard.spec.split.at == 1


def test_the_bad_case_table_is_large_and_unique():
    assert len(BAD_CASES) >= 15
    assert len({c.id for c in BAD_CASES}) == len(BAD_CASES)


@pytest.mark.parametrize("case", BAD_CASES, ids=lambda c: c.id)
def test_models_reject_bad_manifests_naming_the_field(case):
    model = Task if case.kind == "Task" else TaskShard
    with pytest.raises(ValidationError) as info:
        model.from_k8s(case.manifest())
    assert case.field in _paths_and_messages(info.value), str(info.value)
    if case.message:
        assert case.message in _paths_and_messages(info.value), str(info.value)


@pytest.mark.parametrize("case", GOOD_CASES, ids=lambda c: c.id)
def test_models_accept_good_manifests(case):
    task = Task.from_k8s(case.manifest())
    assert Task.from_k8s(task.to_k8s()) == task


@pytest.mark.parametrize(
    ("patch", "partitions"),
    [
        ({}, None),
        (journal_source(partitionedByKey=True), 4),
        (journal_source(partitionedByKey=False), None),
        ({"maxKeyGroups": 256, **kafka_source(partitionedByKey=True, partitions=8)}, 8),
        (kafka_source(), None),
    ],
    ids=["journal", "journal-by-key", "journal-by-key-false", "kafka-by-key", "kafka"],
)
def test_nested_partitions_only_with_partitioned_by_key(patch, partitions):
    source = Task.from_k8s(merge_patch(base_task(), {"spec": patch})).spec.source
    assert source.nested_partitions == partitions


def test_partitioned_by_key_false_is_left_out_of_the_dump():
    """The default keeps the dump (template hash, shard config) of a Task that does not use the mode unchanged."""
    plain = Task.from_k8s(base_task())
    explicit = Task.from_k8s(merge_patch(base_task(), {"spec": journal_source(partitionedByKey=False)}))
    assert explicit == plain and explicit.to_k8s() == plain.to_k8s()
    assert "partitionedByKey" not in plain.to_k8s()["spec"]["source"]["journal"]
    nested = Task.from_k8s(merge_patch(base_task(), {"spec": journal_source(partitionedByKey=True)}))
    assert nested.to_k8s()["spec"]["source"]["journal"] == {
        "path": "/data/journal/orders",
        "partitions": 4,
        "partitionedByKey": True,
    }


def _paths_and_messages(error: ValidationError) -> str:
    """Every error's dotted location (by alias) and message, one per line."""
    lines = []
    for e in error.errors():
        loc = ".".join(str(p) for p in e["loc"] if not (isinstance(p, str) and p in ("int", "str")))
        lines.append(f"{loc}: {e['msg']}")
    return "\n".join(lines)


@pytest.mark.parametrize(
    ("status", "field"),
    [
        ({"split": {"at": 64}}, "status.split.at"),
        ({"lineage": {"parent": "someone-else"}}, "status.lineage.parent"),
    ],
)
def test_whole_shard_rules_relate_status_to_spec(status, field):
    restore = {"parent": "orders-count-0-128", "manifest": "/data/m.json"}
    raw = merge_patch(base_shard(), {"spec": {"restoreFrom": restore}, "status": status})
    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        TaskShard.from_k8s(raw)
    ok = merge_patch(base_shard(), {"spec": {"restoreFrom": restore}, "status": {"split": {"at": 63}}})
    assert TaskShard.from_k8s(ok).status.split.at == 63
