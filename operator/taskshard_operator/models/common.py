"""Models shared by Task and TaskShard: key-group ranges, object references, conditions."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field, model_validator

from spark_runtime.keygroups import MAX_KEY_GROUPS_LIMIT, KeyGroupRange

from .base import DNS_SUBDOMAIN_PATTERN, K8sModel, cel, validations

__all__ = ["Condition", "ConditionStatus", "ConditionType", "KeyGroups", "LocalObjectRef"]


class KeyGroups(K8sModel):
    """A half-open key-group range ``[start, end)`` with ``0 <= start < end <= 32768``."""

    model_config = {
        "json_schema_extra": validations(
            cel(
                "self.start < self.end",
                "keyGroups.start must be less than keyGroups.end: the range is [start, end) and holds at "
                f"least one key group (0 <= start < end <= {MAX_KEY_GROUPS_LIMIT})",
                field_path=".start",
            )
        )
    }

    start: int = Field(
        ge=0,
        le=MAX_KEY_GROUPS_LIMIT - 1,
        description=f"First key group of the range, inclusive (0..{MAX_KEY_GROUPS_LIMIT - 1}).",
    )
    end: int = Field(
        ge=1,
        le=MAX_KEY_GROUPS_LIMIT,
        description=f"Key group after the last one of the range, exclusive (1..{MAX_KEY_GROUPS_LIMIT}, > start).",
    )

    @model_validator(mode="after")
    def _start_before_end(self) -> KeyGroups:
        self.to_range()  # raises InvalidRangeError (a ValueError) naming keyGroups
        return self

    def to_range(self) -> KeyGroupRange:
        return KeyGroupRange(self.start, self.end)

    @classmethod
    def of(cls, r: KeyGroupRange) -> KeyGroups:
        return cls(start=r.start, end=r.end)


class LocalObjectRef(K8sModel):
    """A reference to an object by name in the same namespace."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of the referenced object in the same namespace (an RFC 1123 subdomain).",
    )


class ConditionStatus(StrEnum):
    """Status of a condition, as in Kubernetes."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(StrEnum):
    """The condition types the operator writes.

    - ``Ready``: Task: every active shard is Ready. TaskShard: its driver pod runs and commits micro-batches.
    - ``Tiled``: Task only: the active shards tile ``[0, maxKeyGroups)`` with no gap and no overlap.
      ``False`` means the operator found a broken invariant and stopped acting on the task.
    - ``Splitting``: TaskShard: True while a split is in progress (reason = current step); Task: True while
      any of its shards splits.
    - ``SplitRejected``: TaskShard only: True when the current ``spec.split`` request was refused (the message
      says why); nothing else changed.
    - ``MergeRejected``: TaskShard only: True when the current ``spec.merge`` request was refused (the message
      says why: not adjacent, not both Running, one of them mid-split or merging); nothing else changed.
    - ``Progressing``: True while the object moves towards its desired state (pods starting, a split or a roll
      under way); False once settled.
    - ``Degraded``: True when something needs attention (an invalid spec, a failing pod, a drain without a
      manifest); the message names the field or the pod and what to do.
    - ``Scaled``: Task only: True while the active shards are as many as ``spec.shards`` (or it is unset); False
      while the operator splits or merges towards it (reasons SplittingShard, WaitingForSplit, MergingShards,
      WaitingForMerge, ScalingStuck: every candidate's request was refused).
    - ``ExecutorsReady``: TaskShard only, for a Task with executors (``spec.spark.executors.instances > 0``): True
      while at least that many of the shard's executor pods run; False names each executor pod that does not run
      and why (reasons ExecutorsPending, ExecutorsStarting, DriverNotRunning).
    """

    READY = "Ready"
    TILED = "Tiled"
    SPLITTING = "Splitting"
    SPLIT_REJECTED = "SplitRejected"
    MERGE_REJECTED = "MergeRejected"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    SCALED = "Scaled"
    EXECUTORS_READY = "ExecutorsReady"


C = ConditionType
SHARD_CONDITION_TYPES = (
    C.READY,
    C.PROGRESSING,
    C.DEGRADED,
    C.SPLITTING,
    C.SPLIT_REJECTED,
    C.MERGE_REJECTED,
    C.EXECUTORS_READY,
)
"""The condition types the operator writes on a TaskShard (and the CRD advertises: generated from this)."""
TASK_CONDITION_TYPES = (C.READY, C.PROGRESSING, C.DEGRADED, C.TILED, C.SPLITTING, C.SCALED)
"""The condition types the operator writes on a Task (and the CRD advertises: generated from this)."""


def enumerate_values(values: object) -> str:
    """``"A, B or C"`` of enum members or strings, for descriptions generated from the enums."""
    names = [str(getattr(v, "value", v)) for v in values]  # type: ignore[attr-defined]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


class Condition(K8sModel):
    """A Kubernetes-style condition (the shape of metav1.Condition)."""

    type: str = Field(
        min_length=1,
        max_length=316,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        description=f"Condition type: {enumerate_values(ConditionType)}.",
    )
    status: ConditionStatus = Field(description="Whether the condition holds: True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="metadata.generation of the object the condition was computed from.",
    )
    last_transition_time: datetime = Field(description="When the condition last changed status (RFC 3339 date-time).")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="Machine-readable CamelCase reason for the last transition.",
    )
    message: str = Field(
        default="",
        max_length=32768,
        description="Human-readable details of the last transition; may be empty.",
    )


class LagUnit(StrEnum):
    RECORDS = "records"
    BYTES = "bytes"


class LiveCommon(K8sModel):
    """What a running shard reports on its metrics endpoint, as the operator last saw it (``status.live``)."""

    rate: float = Field(ge=0, description="Input rows committed per second over the last minute.")
    lag: int | None = Field(
        default=None, ge=0, description="Input not yet processed, in lagUnit (Kafka: records; journal: bytes)."
    )
    lag_unit: LagUnit | None = Field(default=None, description="The unit of lag: records or bytes.")
    lag_seconds: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Seconds to work off the lag at the pace the source was consumed over the last minute (999999: no "
            "progress). On a Task: the largest of its active shards'. The autoscaler's signal."
        ),
    )
    dead_letters: int = Field(default=0, ge=0, description="Dead letters counted so far.")
    watermark: datetime | None = Field(
        default=None,
        description="The event-time watermark the next batch runs with (only with spec.eventTime).",
    )
    late_records: int | None = Field(
        default=None,
        ge=0,
        description="Records later than the watermark allows, in the dead letters with reason late (only with "
        "spec.eventTime).",
    )
    observed_at: datetime | None = Field(default=None, description="When the operator read it (RFC 3339).")
