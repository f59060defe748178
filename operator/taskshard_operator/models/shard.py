"""TaskShard: one per key-group range of a Task. The operator creates it; the user edits only ``spec.split``.

``spec.keyGroups``, ``spec.taskRef`` and ``spec.restoreFrom`` are immutable (CEL transition rules); a split
request names a point strictly inside the range (or none: the midpoint) and a one-group range cannot be split.
The status is the split protocol's write-ahead log: each step is recorded before it is acted on.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from spark_runtime.keygroups import MAX_KEY_GROUPS_LIMIT
from spark_runtime.protocol import MergeAbortOutcome

from .base import API_GROUP, API_VERSION, DNS_SUBDOMAIN_PATTERN, K8sModel, cel, validations
from .common import SHARD_CONDITION_TYPES, Condition, KeyGroups, LiveCommon, LocalObjectRef, enumerate_values

__all__ = [
    "ROOT_RULES",
    "CheckpointRef",
    "ExecutorsStatus",
    "Lineage",
    "MergeAbortOutcome",
    "MergeAbortStatus",
    "MergeRequest",
    "MergeRole",
    "MergeStatus",
    "RestoreFrom",
    "ShardPhase",
    "SplitBy",
    "SplitRequest",
    "SplitStatus",
    "TaskShard",
    "TaskShardSpec",
    "TaskShardStatus",
]

MANIFEST_PATTERN = r"^(/|s3a?://)\S*$"


class ShardPhase(StrEnum):
    """Lifecycle of a TaskShard (``status.phase``). Every transition is written to status before acting on it.

    The machine is drawn once, in :mod:`taskshard_operator.phases`, next to its transition table. The phases:
    Pending, Running, Failed, Suspended and Stopped (a shard's life); SplitRequested, Draining, Drained,
    ChildrenCreated, Split and AbortingSplit (a split of it); MergeRequested, Merging, AbortingMerge and Merged (a
    merge of it). Each value's docstring says what it means.

    Ownership: a shard owns its range (counts in the Task's tiling) in Pending, Running, SplitRequested,
    Draining, Drained, Failed, Suspended, AbortingSplit, MergeRequested, Merging and AbortingMerge; from
    ChildrenCreated on its two children own the halves instead, and from Merged on the merged shard owns both
    parents' ranges. Successors are created when the hand-over is accepted and wait on **standby** (phase
    Pending, condition Ready=False reason Standby): their pods warm up (and a split's children catch up with the
    parent, which keeps processing and emitting) but emit nothing for the range until the parent drained.
    """

    PENDING = "Pending"
    """Created; the driver pod is not running yet (or is restoring from ``spec.restoreFrom``)."""
    RUNNING = "Running"
    """The driver pod processes the records of ``spec.keyGroups`` and commits micro-batches."""
    SPLIT_REQUESTED = "SplitRequested"
    """A valid split request was accepted; the split point is recorded in ``status.split``."""
    DRAINING = "Draining"
    """The children are catching up; the pod keeps processing until it stops by itself at a micro-batch
    boundary once both are ready, and writes its drain summary."""
    DRAINED = "Drained"
    """The pod exited after its final checkpoint; ``status.finalCheckpoint`` holds the snapshot manifest."""
    CHILDREN_CREATED = "ChildrenCreated"
    """The parent's pod is gone; both children (``status.lineage.children``, created at SplitRequested)
    restore from the final checkpoint and own the halves."""
    SPLIT = "Split"
    """Terminal: the children took over; this shard owns no key groups any more."""
    FAILED = "Failed"
    """The pod or the restore failed; see conditions. The shard still owns its range."""
    STOPPED = "Stopped"
    """Terminal: the shard was stopped with its task; its range is owned by no one."""
    SUSPENDED = "Suspended"
    """The Task is suspended: the shard stopped at a batch boundary with a savepoint and keeps no pod; it still
    owns its range and resumes (Pending) from its recovery log when ``spec.suspend`` is false again."""
    ABORTING_SPLIT = "AbortingSplit"
    """The split request was withdrawn before the hand-over: the children are deleted, then the parent's pod
    undoes the split in storage (it fences and clears the children) and the shard resumes (Pending). If the
    parent had handed over already, the split goes on (Drained) instead."""
    MERGE_REQUESTED = "MergeRequested"
    """A valid ``spec.merge`` of this (left) shard with its right neighbour was accepted (``status.merge``); the
    merged child is created next. The shard keeps processing."""
    MERGING = "Merging"
    """Both shards of a merge keep processing while the merged child warms up on standby; each pod stops by itself
    at a batch boundary once the child is ready, and writes its drain summary."""
    MERGED = "Merged"
    """Terminal: the pod drained (``status.finalCheckpoint``) and the merged child took over; this shard owns no
    key groups any more."""
    ABORTING_MERGE = "AbortingMerge"
    """The left shard's ``spec.merge`` was withdrawn: the merged shard's pod fences the merged shard in storage and
    says whether a parent drained already. If neither did, the merge is undone (both shards go on Running, the
    merged shard is deleted); else it completes (back to Merging). The shard keeps processing meanwhile."""

    @property
    def owns_range(self) -> bool:
        """True while the shard owns its key groups (its range counts in the tiling invariant)."""
        return self in _ACTIVE_PHASES

    @property
    def terminal(self) -> bool:
        """Split, Merged or Stopped: nothing follows, the shard keeps no pod (label ``taskshard.io/active=false``)."""
        return self in (ShardPhase.SPLIT, ShardPhase.MERGED, ShardPhase.STOPPED)

    @property
    def merging(self) -> bool:
        """An accepted merge not finished or undone yet: MergeRequested, Merging, AbortingMerge (the hand-over
        finalizer holds a deletion)."""
        return self in (ShardPhase.MERGE_REQUESTED, ShardPhase.MERGING, ShardPhase.ABORTING_MERGE)

    @property
    def handing_over(self) -> bool:
        """A split or a merge of this shard is under way (:attr:`splitting` or :attr:`merging`)."""
        return self.splitting or self.merging

    @property
    def splitting(self) -> bool:
        """An accepted split not finished or undone yet: SplitRequested, Draining, Drained, ChildrenCreated,
        AbortingSplit (condition ``Splitting=True``; the split finalizer holds a deletion)."""
        return self in (
            ShardPhase.SPLIT_REQUESTED,
            ShardPhase.DRAINING,
            ShardPhase.DRAINED,
            ShardPhase.CHILDREN_CREATED,
            ShardPhase.ABORTING_SPLIT,
        )

    @property
    def holds_range_for_children(self) -> bool:
        """A split or merge parent that still owns its range although its children exist (they wait on standby):
        SplitRequested, Draining, Drained, AbortingSplit, MergeRequested, Merging."""
        return (self.splitting and self != ShardPhase.CHILDREN_CREATED) or self.merging

    @property
    def handed_over(self) -> bool:
        """ChildrenCreated or Split: the children own the halves (their passes follow the parent's)."""
        return self in (ShardPhase.CHILDREN_CREATED, ShardPhase.SPLIT)


_ACTIVE_PHASES = frozenset(
    {
        ShardPhase.PENDING,
        ShardPhase.RUNNING,
        ShardPhase.SPLIT_REQUESTED,
        ShardPhase.DRAINING,
        ShardPhase.DRAINED,
        ShardPhase.ABORTING_SPLIT,
        ShardPhase.FAILED,
        ShardPhase.SUSPENDED,
        ShardPhase.MERGE_REQUESTED,
        ShardPhase.MERGING,
        ShardPhase.ABORTING_MERGE,
    }
)


class SplitBy(StrEnum):
    """How the operator chooses the split point when ``spec.split.at`` is not given."""

    MIDPOINT = "midpoint"
    """``start + (end - start) / 2``, rounded down."""
    LOAD = "load"
    """Where the shard's input rows of the last five minutes divide in half (its load map: the Task's
    ``spark.taskshard.keyGroupMetrics: "true"``); ``taskshard_operator.split_points``."""
    STATE = "state"
    """Where the shard's state rows divide in half (its state map, counted at a recent committed batch: the Task's
    ``spark.taskshard.keyGroupMetrics: "true"``, every ``spark.taskshard.stateMapSeconds``)."""


class SplitRequest(K8sModel):
    """The user's split request (set with ``kubectl edit``)."""

    requested: bool = Field(
        default=False,
        description="Set to true to split this shard into [start, at) and [at, end). Needs a range of two or "
        "more key groups.",
    )
    at: int | None = Field(
        default=None,
        ge=1,
        le=MAX_KEY_GROUPS_LIMIT - 1,
        description="Optional split point, strictly inside spec.keyGroups (start < at < end). Default: chosen "
        "as spec.split.by says.",
    )
    by: SplitBy | None = Field(
        default=None,
        description="How to choose the point when spec.split.at is not given: midpoint (the default), load "
        "(where the shard's input rows of the last five minutes divide in half) or state (where its state rows "
        "divide in half, as last counted); load and state need the Task's Spark conf "
        'spark.taskshard.keyGroupMetrics: "true". The chosen point and the expected shares show in status.split '
        "before the hand-over begins.",
    )


class RestoreFrom(K8sModel):
    """Where a child shard seeds its state from: its parent's drain snapshot."""

    parent: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of the parent TaskShard whose final snapshot this shard restores its slice from.",
    )
    manifest: str = Field(
        min_length=2,
        max_length=4096,
        pattern=MANIFEST_PATTERN,
        description=(
            "Path (absolute, or an s3:// or s3a:// URI) of the parent's snapshot manifest.json, or of the parent's "
            "drain summary drained.json, which names the manifest: the operator sets the latter and creates the "
            "child when the split is accepted, so the child warms up and catches up (standby) while the parent "
            "keeps processing, and emits nothing for its range until the parent has stopped for good."
        ),
    )


class MergeRequest(K8sModel):
    """The user's merge request on the left shard of two adjacent shards (set with ``kubectl edit``)."""

    with_: str = Field(
        alias="with",
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of the right neighbour: the TaskShard of the same Task whose spec.keyGroups.start is this "
        "shard's spec.keyGroups.end. Both must be Running and neither splitting or merging; then one merged "
        "shard over both ranges takes over exactly where each stopped.",
    )


class TaskShardSpec(K8sModel):
    """Desired state of one shard of a Task."""

    model_config = {
        "json_schema_extra": validations(
            cel(
                "!has(self.split) || !has(self.split.at) || "
                "(self.keyGroups.start < self.split.at && self.split.at < self.keyGroups.end)",
                "spec.split.at must be strictly inside spec.keyGroups: keyGroups.start < at < keyGroups.end "
                "(omit it to split at the midpoint)",
                field_path=".split.at",
            ),
            cel(
                "!has(self.split) || !has(self.split.requested) || !self.split.requested || "
                "self.keyGroups.end - self.keyGroups.start >= 2",
                "spec.split.requested: a shard whose spec.keyGroups holds one key group (end - start == 1) "
                "cannot be split",
                field_path=".split.requested",
            ),
            cel(
                "!has(self.split) || !has(self.split.at) || !has(self.split.by) || self.split.by == 'midpoint'",
                "spec.split.at and spec.split.by: load exclude each other: give the point, or let the load choose it",
                field_path=".split.by",
            ),
            cel(
                "has(self.restoreFrom) == has(oldSelf.restoreFrom)",
                "spec.restoreFrom is immutable: it is set (or not) when the shard is created",
                field_path=".restoreFrom",
            ),
            cel(
                "has(self.mergeFrom) == has(oldSelf.mergeFrom)",
                "spec.mergeFrom is immutable: it is set (or not) when the shard is created",
                field_path=".mergeFrom",
            ),
            cel(
                "!has(self.mergeFrom) || !has(self.restoreFrom)",
                "spec.restoreFrom and spec.mergeFrom exclude each other: a shard has one parent or two",
                field_path=".mergeFrom",
            ),
            cel(
                "!has(self.merge) || !has(self.split) || !has(self.split.requested) || !self.split.requested",
                "spec.merge and spec.split.requested exclude each other: merge or split the shard, not both",
                field_path=".merge",
            ),
        )
    }

    task_ref: LocalObjectRef = Field(
        description="The Task this shard belongs to. Immutable.",
        json_schema_extra=validations(
            cel("self == oldSelf", "spec.taskRef is immutable: a shard belongs to one Task for its lifetime")
        ),
    )
    key_groups: KeyGroups = Field(
        description="The key-group range [start, end) this shard owns. Immutable: split the shard instead.",
        json_schema_extra=validations(
            cel(
                "self == oldSelf",
                "spec.keyGroups is immutable: a shard's range never changes; set spec.split to split it",
            )
        ),
    )
    split: SplitRequest | None = Field(
        default=None,
        description="Split request, set by the user: {requested: true} splits at the midpoint, "
        "{requested: true, at: N} at key group N.",
    )
    restore_from: RestoreFrom | None = Field(
        default=None,
        description="For a child of a split: the parent snapshot to restore this range's state from. Immutable.",
        json_schema_extra=validations(
            cel("self == oldSelf", "spec.restoreFrom is immutable: it is set when the shard is created")
        ),
    )

    merge: MergeRequest | None = Field(
        default=None,
        description="Merge request, set by the user on the left of two adjacent shards: {with: <right neighbour>} "
        "joins both ranges into one shard. Cannot be withdrawn once accepted (status.merge).",
    )
    merge_from: list[RestoreFrom] | None = Field(
        default=None,
        min_length=2,
        max_length=2,
        description="For a merged shard: its two parents, left (lower key groups) first, and their drain summaries. "
        "Immutable.",
        json_schema_extra=validations(
            cel("self == oldSelf", "spec.mergeFrom is immutable: it is set when the shard is created")
        ),
    )

    @model_validator(mode="after")
    def _split_inside_range(self) -> TaskShardSpec:
        if self.merge_from is not None and self.restore_from is not None:
            raise ValueError("spec.restoreFrom and spec.mergeFrom exclude each other: a shard has one parent or two")
        if self.merge is not None and self.split is not None and self.split.requested:
            raise ValueError(
                f"spec.merge (with {self.merge.with_!r}) and spec.split.requested exclude each other: merge or split "
                "the shard, not both"
            )
        if self.split is None:
            return self
        r = self.key_groups.to_range()
        if self.split.at is not None and not r.start < self.split.at < r.end:
            raise ValueError(
                f"spec.split.at: {self.split.at} must be strictly inside spec.keyGroups {r}: {r.start} < at < {r.end}"
            )
        if self.split.requested and r.size < 2:
            raise ValueError(f"spec.split.requested: spec.keyGroups {r} holds one key group and cannot be split")
        if self.split.at is not None and self.split.by in (SplitBy.LOAD, SplitBy.STATE):
            raise ValueError(
                f"spec.split.by: {self.split.by.value} and spec.split.at: {self.split.at} exclude each other: give "
                f"the point, or let the {self.split.by.value} choose it"
            )
        return self


class CheckpointRef(K8sModel):
    """A committed micro-batch of a shard and, for a drain, its snapshot manifest."""

    batch_id: int = Field(
        ge=-1, description="Id of the last committed micro-batch; -1 when a drain came before the first batch."
    )
    time: datetime | None = Field(default=None, description="When the batch committed (RFC 3339 date-time).")
    manifest: str | None = Field(
        default=None,
        min_length=2,
        max_length=4096,
        pattern=MANIFEST_PATTERN,
        description="Path or s3:// URI of the snapshot manifest.json written at this batch (drain only).",
    )


class SplitStatus(K8sModel):
    """The split the operator accepted (write-ahead: recorded before the drain starts)."""

    at: int = Field(
        ge=1,
        le=MAX_KEY_GROUPS_LIMIT - 1,
        description="The accepted split point: children own [start, at) and [at, end).",
    )
    accepted_time: datetime | None = Field(
        default=None, description="When the operator accepted the request (RFC 3339 date-time)."
    )
    by: SplitBy | None = Field(default=None, description="How the point was chosen (absent: given as spec.split.at).")
    expected_shares: (
        list[Annotated[float, Field(ge=0, le=1, description="A child's expected share (0 to 1).")]] | None
    ) = Field(
        default=None,
        min_length=2,
        max_length=2,
        description="by: load or state: the expected fraction of the shard's input rows (load: in the window "
        "below) or state rows (state) in [start, at) and [at, end).",
    )
    window_rows: int | None = Field(
        default=None, ge=0, description="by: load: the shard's input rows the point was chosen from."
    )
    window_seconds: int | None = Field(
        default=None,
        ge=0,
        description="by: load: how many seconds of input those rows are (0: everything since its pod started).",
    )
    state_rows: int | None = Field(
        default=None, ge=0, description="by: state: the shard's state rows the point was chosen from."
    )
    state_batch: int | None = Field(
        default=None, ge=0, description="by: state: the committed batch those state rows were counted at."
    )


class MergeRole(StrEnum):
    """Which side of a merge a shard is."""

    LEFT = "left"
    """The shard that carries ``spec.merge`` (lower key groups); it creates the merged shard."""
    RIGHT = "right"
    """Its right neighbour; it follows once the merged shard exists."""


class MergeStatus(K8sModel):
    """The merge the operator accepted (write-ahead: recorded before the merged shard is created)."""

    with_: str = Field(
        alias="with", max_length=253, pattern=DNS_SUBDOMAIN_PATTERN, description="The other shard of the merge."
    )
    into: str = Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN, description="The merged shard's name.")
    role: MergeRole = Field(description="left (carries spec.merge) or right (its neighbour).")
    accepted_time: datetime | None = Field(
        default=None, description="When the operator accepted the request (RFC 3339 date-time)."
    )


class MergeAbortStatus(K8sModel):
    """On a merged shard: the outcome of the withdrawal of its merge (written before its parents act on it)."""

    outcome: MergeAbortOutcome = Field(description=f"{enumerate_values(MergeAbortOutcome)}.")
    drained: list[Annotated[str, Field(max_length=253, description="A parent that drained.")]] = Field(
        default_factory=list, max_length=2, description="The parents that had drained or begun a final drain."
    )
    time: datetime | None = Field(default=None, description="When the outcome was recorded (RFC 3339 date-time).")


class Lineage(K8sModel):
    """Where this shard comes from and what it split into."""

    parent: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of the shard this one was split from; absent for the Task's initial shards.",
    )
    parents: list[Annotated[str, Field(max_length=253, description="Name of a parent TaskShard.")]] = Field(
        default_factory=list,
        max_length=2,
        description="A merged shard's two parents, left first (a split child's one parent is in parent).",
    )
    children: list[Annotated[str, Field(max_length=253, description="Name of a child TaskShard.")]] = Field(
        default_factory=list,
        max_length=2,
        description="Names of the two shards this one split into, lower range first, or the one shard it merged "
        "into; empty until created.",
    )


class ShardLive(LiveCommon):
    """The running shard as its metrics endpoint last reported it (scraped every few seconds; written at most once
    per scrape interval)."""

    batch_id: int = Field(ge=-1, description="The last committed micro-batch id (-1: none yet).")
    batch_time: datetime | None = Field(default=None, description="When it committed (RFC 3339).")
    state_rows: int | None = Field(default=None, ge=0, description="Rows of state the shard holds.")
    state_map_batch: int | None = Field(
        default=None,
        ge=0,
        description="The committed batch of the shard's last state map (state rows per key group, for a split "
        "by: state); absent: none counted.",
    )
    emitting: bool = Field(default=False, description="Whether it writes to its sink (a split child: once live).")


class ExecutorsStatus(K8sModel):
    """The shard's Spark executor pods (created by its driver) as the operator last saw them; only for a Task with
    executors. Why executors do not run is in the ExecutorsReady condition."""

    requested: int = Field(ge=0, description="Executors the Task asks for (spec.spark.executors.instances).")
    running: int = Field(ge=0, description="Executor pods in phase Running (pods being deleted do not count).")
    pending: int = Field(
        ge=0, description="Executor pods created and not running yet (phase Pending; pods being deleted do not count)."
    )


class TaskShardStatus(K8sModel):
    """Observed state of a shard, written by the operator only (status subresource)."""

    phase: ShardPhase | None = Field(
        default=None,
        description=f"Lifecycle phase: {enumerate_values(ShardPhase)}.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description=f"Conditions of the shard ({enumerate_values(SHARD_CONDITION_TYPES)}), one per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation the operator last acted on."
    )
    last_checkpoint: CheckpointRef | None = Field(
        default=None, description="The last micro-batch the shard committed (reported by the pod)."
    )
    final_checkpoint: CheckpointRef | None = Field(
        default=None,
        description="The drain checkpoint and snapshot manifest the children restore from (set in Drained).",
    )
    split: SplitStatus | None = Field(
        default=None, description="The split the operator accepted (set in SplitRequested)."
    )
    merge: MergeStatus | None = Field(
        default=None, description="The merge the operator accepted (set in MergeRequested or Merging)."
    )
    merge_abort: MergeAbortStatus | None = Field(
        default=None, description="A merged shard whose merge was withdrawn: what its abort found."
    )
    restarts: int = Field(default=0, ge=0, description="How often the driver pod was restarted.")
    pod: str | None = Field(default=None, max_length=253, description="Name of the current driver pod of this shard.")
    lineage: Lineage | None = Field(default=None, description="Parent and children of this shard.")
    live: ShardLive | None = Field(default=None, description="Rate, lag and last batch of the running shard.")
    executors: ExecutorsStatus | None = Field(
        default=None,
        description="Executor pods of the shard's driver: requested, running, pending. Absent for a Task without "
        "executors and in phases without a driver that runs them (Drained, ChildrenCreated, Split, Merged, "
        "AbortingSplit, Suspended, Stopped).",
    )


ROOT_RULES = [
    cel(
        "!has(self.status) || !has(self.status.split) || "
        "(self.spec.keyGroups.start < self.status.split.at && self.status.split.at < self.spec.keyGroups.end)",
        "status.split.at must be strictly inside spec.keyGroups: keyGroups.start < at < keyGroups.end",
        field_path=".status.split.at",
    ),
    cel(
        "!has(self.status) || !has(self.status.lineage) || !has(self.status.lineage.parent) || "
        "!has(self.spec.restoreFrom) || self.status.lineage.parent == self.spec.restoreFrom.parent",
        "status.lineage.parent must equal spec.restoreFrom.parent (the shard this one restores from)",
        field_path=".status.lineage.parent",
    ),
]
"""CEL rules on the whole TaskShard object (they relate spec and status)."""


class TaskShard(K8sModel):
    """A whole TaskShard object (apiVersion, kind, metadata, spec, status); checks the ROOT_RULES too."""

    api_version: Literal["taskshard.io/v1alpha1"] = Field(
        default=f"{API_GROUP}/{API_VERSION}", description="taskshard.io/v1alpha1"
    )
    kind: Literal["TaskShard"] = Field(default="TaskShard", description="TaskShard")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: TaskShardSpec = Field(description="Desired state of the shard.")
    status: TaskShardStatus | None = Field(default=None, description="Observed state of the shard.")

    @model_validator(mode="after")
    def _status_agrees_with_spec(self) -> TaskShard:
        r, status = self.spec.key_groups.to_range(), self.status
        if status and status.split and not r.start < status.split.at < r.end:
            raise ValueError(f"status.split.at: {status.split.at} must be strictly inside spec.keyGroups {r}")
        parent = status.lineage.parent if status and status.lineage else None
        if parent and self.spec.restore_from and parent != self.spec.restore_from.parent:
            raise ValueError(
                f"status.lineage.parent: {parent!r} must equal spec.restoreFrom.parent "
                f"({self.spec.restore_from.parent!r})"
            )
        return self
