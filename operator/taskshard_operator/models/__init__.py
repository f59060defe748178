"""Typed models of the Task and TaskShard custom resources (pydantic v2).

One source of truth: ``crd.py`` generates the CRD schemas in ``crds/`` from these models (run
``python hack/gen_crds.py``; a unit test fails on drift). Field names are snake_case in Python and camelCase
in Kubernetes (``to_k8s()`` / ``from_k8s()`` convert).
"""

from .base import API_GROUP, API_VERSION, K8sModel
from .common import Condition, ConditionStatus, ConditionType, KeyGroups, LocalObjectRef
from .shard import (
    CheckpointRef,
    Lineage,
    RestoreFrom,
    ShardPhase,
    SplitRequest,
    SplitStatus,
    TaskShard,
    TaskShardSpec,
    TaskShardStatus,
)
from .task import (
    BuiltinProcessor,
    CheckpointRetention,
    DirectorySink,
    ExecutorsSpec,
    JournalSource,
    KafkaSink,
    KafkaSource,
    PersistentVolumeClaimRef,
    ProcessorSpec,
    ResourceRequirements,
    S3Storage,
    ShardSummary,
    SinkSpec,
    SourceSpec,
    SparkSpec,
    StorageSpec,
    Task,
    TaskPhase,
    TaskSpec,
    TaskStatus,
    VolumeSpec,
)

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "BuiltinProcessor",
    "CheckpointRef",
    "CheckpointRetention",
    "Condition",
    "ConditionStatus",
    "ConditionType",
    "DirectorySink",
    "ExecutorsSpec",
    "JournalSource",
    "K8sModel",
    "KafkaSink",
    "KafkaSource",
    "KeyGroups",
    "Lineage",
    "LocalObjectRef",
    "PersistentVolumeClaimRef",
    "ProcessorSpec",
    "ResourceRequirements",
    "RestoreFrom",
    "S3Storage",
    "ShardPhase",
    "ShardSummary",
    "SinkSpec",
    "SourceSpec",
    "SparkSpec",
    "SplitRequest",
    "SplitStatus",
    "StorageSpec",
    "Task",
    "TaskPhase",
    "TaskShard",
    "TaskShardSpec",
    "TaskShardStatus",
    "TaskSpec",
    "TaskStatus",
    "VolumeSpec",
]
