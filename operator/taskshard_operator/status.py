"""Status vocabulary: conditions, what a pod tells about its shard, and the runtime's termination message.

Pure functions only; the handlers patch the results into ``status`` and post the events.

Conditions (one per type, Kubernetes ``metav1.Condition`` shape; ``lastTransitionTime`` changes only when the
status flips):

- ``Ready``: shard: its driver pod runs; task: every active shard is Running.
- ``Progressing``: a change is being carried out (pod starting, split step, roll); the reason names it.
- ``Degraded``: something is wrong and being retried or needs a human (failed pod, invalid spec, broken tiling).
- ``SplitRejected`` (shard): the current ``spec.split`` was refused; the message names the field and value.
- ``Splitting``: shard: True from SplitRequested to ChildrenCreated (reason = the step); task: True while any of
  its shards splits. ``kubectl wait --for=condition=Splitting=false`` waits for a split to finish.
- ``Tiled`` (task): the active shards tile ``[0, maxKeyGroups)``.
- ``Scaled`` (task): the active shards are as many as ``spec.shards`` (True when it is unset); the reason says
  what the operator does about a difference (``taskshard_operator.scaling``).
- ``ExecutorsReady`` (shard, only for a Task with executors): as many executor pods run as the Task asks for;
  False names each executor pod that does not run and why (``taskshard_operator.executors``).

The types each kind gets are ``SHARD_CONDITION_TYPES`` / ``TASK_CONDITION_TYPES``; the CRDs' descriptions are
generated from them, and a test checks that the reconcilers write exactly those.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from typing import Any

from spark_runtime.protocol import (
    FAILURE_EVENTS,
    DrainSummary,
    FailureSummary,
    MergeAbortSummary,
    SplitAbortSummary,
    SummaryEvent,
)
from taskshard_operator import naming
from taskshard_operator.models import ConditionType

READY = ConditionType.READY.value
PROGRESSING = ConditionType.PROGRESSING.value
DEGRADED = ConditionType.DEGRADED.value
SPLIT_REJECTED = ConditionType.SPLIT_REJECTED.value
MERGE_REJECTED = ConditionType.MERGE_REJECTED.value
TILED = ConditionType.TILED.value
SPLITTING = ConditionType.SPLITTING.value
SCALED = ConditionType.SCALED.value
EXECUTORS_READY = ConditionType.EXECUTORS_READY.value

NO_PROGRESS = "NoProgress"
"""Ready=False and Degraded=True on a running shard whose batch in flight has run ``spec.noProgressSeconds`` without
committing (and Degraded on its Task, naming it)."""
METRICS_UNREACHABLE = "MetricsUnreachable"
"""Ready=False and Degraded=True on a running shard whose metrics endpoint has not answered the operator's scrapes
for ``reconcile_shard.METRICS_UNREACHABLE_SECONDS`` (and Degraded on its Task, naming it)."""
MERGE_STALLED = "MergeStalled"
"""Degraded=True on a merge's shards accepted longer ago than ``spec.handover.mergeStallSeconds`` (and on the Task)."""
SPLIT_STALLED = "SplitStalled"
"""Degraded=True on a split parent accepted longer ago than ``spec.handover.splitStallSeconds`` that has not drained
(and on the Task), naming what it waits for."""


RFC3339 = "%Y-%m-%dT%H:%M:%SZ"
"""The operator's one time format (status, conditions, live values, events' messages): UTC, whole seconds."""


def rfc3339(at: float | dt.datetime | None = None) -> str:
    """``at`` (epoch seconds or an aware datetime; None: now) in :data:`RFC3339`, the operator's one time format."""
    if at is None:
        at = dt.datetime.now(dt.UTC)
    elif not isinstance(at, dt.datetime):
        at = dt.datetime.fromtimestamp(at, dt.UTC)
    return at.astimezone(dt.UTC).strftime(RFC3339)


def now() -> str:
    return rfc3339()


def parse_time(value: Any) -> dt.datetime | None:
    """An RFC 3339 time of a status field as an aware datetime; None when missing or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def condition(
    type_: str, status: bool, reason: str, message: str = "", *, generation: int | None = None, time: str | None = None
) -> dict[str, Any]:
    cond: dict[str, Any] = {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": time or now(),
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def set_conditions(existing: list[dict[str, Any]] | None, *updates: dict[str, Any]) -> list[dict[str, Any]]:
    """Merge ``updates`` into ``existing`` by type; keep ``lastTransitionTime`` when the status did not flip."""
    by_type = {c["type"]: dict(c) for c in existing or []}
    for new in updates:
        old = by_type.get(new["type"])
        merged = dict(new)
        if old is not None and old.get("status") == new["status"]:
            merged["lastTransitionTime"] = old.get("lastTransitionTime", new["lastTransitionTime"])
        by_type[new["type"]] = merged
    return [by_type[t] for t in sorted(by_type)]


def get_condition(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def conditions_equal(a: list[dict[str, Any]] | None, b: list[dict[str, Any]] | None) -> bool:
    """Equal ignoring ``lastTransitionTime`` and the order of conditions and of their keys (so an unchanged status
    is not re-written: the API returns a condition's keys in another order than the operator builds them)."""

    def strip(cs):
        kept = ({k: v for k, v in c.items() if k != "lastTransitionTime"} for c in cs or [])
        return sorted(kept, key=lambda c: (str(c.get("type")), json.dumps(c, sort_keys=True, default=str)))

    return strip(a) == strip(b)


# ---------------------------------------------------------------- the runtime's termination message

ERROR_TEXT_LIMIT = 1000
"""At most this many characters of a runtime error go into a condition message (and an event)."""
_CONDITION_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


def truncate(text: str, limit: int = ERROR_TEXT_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


@dataclass(frozen=True)
class RuntimeFailure:
    """What a failed shard runtime reported: ``{"event": "failed", "error": ..., "reason"?: ..., "field"?: ...}``.

    ``reason`` (CamelCase, e.g. ``SourceTopicMissing``) and ``field`` (e.g. ``source.kafka.topic``) are optional;
    older runtimes write only ``event``, ``shard`` and ``error``.
    """

    error: str
    reason: str | None = None
    field: str | None = None

    def condition_reason(self, fallback: str) -> str:
        """The runtime's reason when it is a valid condition reason, else ``fallback``."""
        if self.reason and len(self.reason) <= 1024 and _CONDITION_REASON.match(self.reason):
            return self.reason
        return fallback

    @property
    def text(self) -> str:
        """The error (prefixed with the field when the error does not name it), truncated for a condition."""
        error = self.error.strip()
        if self.field and self.field not in error:
            error = f"{self.field}: {error}"
        return truncate(error)


@dataclass(frozen=True)
class Termination:
    """A terminated driver container: its exit code and the runtime's JSON summary (if it wrote one)."""

    exit_code: int
    reason: str
    message: dict[str, Any] | None
    finished_at: str | None

    @property
    def summary(self) -> DrainSummary | None:
        """The runtime's drain or stop summary (``spark_runtime.protocol.DrainSummary``, the contract both sides
        share), None for a failure report or a message that is not one (a truncated or foreign message)."""
        m = self.message or {}
        if m.get("event") not in (SummaryEvent.DRAINED, SummaryEvent.STOPPED):
            return None
        batch = m.get("batchId")
        if not isinstance(batch, int) or isinstance(batch, bool):
            return None
        try:
            return DrainSummary.from_json(m)
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def batch_id(self) -> int | None:
        summary = self.summary
        return summary.batch_id if summary is not None else None

    @property
    def manifest(self) -> str | None:
        summary = self.summary
        manifest = summary.manifest if summary is not None else None
        return manifest if isinstance(manifest, str) and manifest else None

    @property
    def aborted(self) -> SplitAbortSummary | None:
        """Exited 0 after undoing its shard's split (``run --abort-split``), else None."""
        if self.exit_code != 0 or (self.message or {}).get("event") != SummaryEvent.ABORTED:
            return None
        try:
            return SplitAbortSummary.from_json(self.message or {})
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def merge_abort(self) -> MergeAbortSummary | None:
        """Exited 0 after fencing its merged shard (``run --abort-merge``), else None."""
        if self.exit_code != 0 or (self.message or {}).get("event") != SummaryEvent.MERGE_ABORT:
            return None
        try:
            return MergeAbortSummary.from_json(self.message or {})
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def reported(self) -> FailureSummary | None:
        """The runtime's failure or fencing report (:class:`~spark_runtime.protocol.FailureSummary`: event
        ``failed`` or ``fenced`` with a non-empty ``error``), else None."""
        m = self.message or {}
        if m.get("event") not in FAILURE_EVENTS:
            return None
        try:
            return FailureSummary.from_json(m)
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def refused(self) -> FailureSummary | None:
        """The runtime refused to run its template before processing anything (exit 0, event ``refused``)."""
        report = self.reported
        if report is None or report.event != SummaryEvent.REFUSED or self.exit_code != 0:
            return None
        return report

    @property
    def fenced(self) -> FailureSummary | None:
        """The runtime stopped because a later writer epoch of its shard exists (exit 0, event ``fenced``)."""
        report = self.reported
        return report if report is not None and report.event == SummaryEvent.FENCED else None

    @property
    def failure(self) -> RuntimeFailure | None:
        """The runtime's failure report (event ``failed``, or ``fenced``, with a non-empty ``error``), else None."""
        report = self.reported
        if report is None:
            return None
        return RuntimeFailure(error=report.error, reason=report.reason, field=report.field)

    @property
    def drained(self) -> bool:
        """Exited 0 after a final drain with a snapshot manifest the children can restore from. A ``stopped``
        summary (a SIGTERM alone: a resumable stop with a savepoint) is not a drain."""
        summary = self.summary
        return (
            self.exit_code == 0
            and summary is not None
            and summary.event == SummaryEvent.DRAINED
            and (self.manifest is not None)
        )

    def checkpoint(self, *, with_manifest: bool) -> dict[str, Any] | None:
        """A ``CheckpointRef`` dict (``status.lastCheckpoint`` / ``finalCheckpoint``), None without a batch id.

        A drain before the first committed batch reports batch id -1, recorded as it is.
        """
        if self.batch_id is None:
            return None
        summary = self.summary
        assert summary is not None
        ref: dict[str, Any] = {"batchId": summary.batch_id}
        time = summary.time or self.finished_at
        if time:
            ref["time"] = time
        if with_manifest and self.manifest:
            ref["manifest"] = self.manifest
        return ref


def parse_termination_message(text: str | None) -> dict[str, Any] | None:
    """The JSON object the runtime writes to its termination-message file, or None (empty or not JSON)."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


# ---------------------------------------------------------------- what the driver pod shows


CANNOT_START = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
"""The kubelet's waiting reasons of a container that cannot start as its pod says (its image, its config): the pod
waits for a fix (a new template, or a missing object created) and never runs by itself."""


@dataclass(frozen=True)
class PodView:
    """The driver pod of a shard as the reconciler needs it. ``exists=False`` when there is no pod."""

    exists: bool
    name: str | None = None
    uid: str | None = None
    phase: str | None = None
    ended_reason: str | None = None
    """The pod's own ``status.reason`` (the kubelet's ``Evicted``: the node ran short, or ``/tmp`` passed its size
    limit), else None."""
    ended_message: str | None = None
    """The pod's own ``status.message`` (e.g. ``Usage of EmptyDir volume "tmp" exceeds the limit "16Gi".``)."""
    deleting: bool = False
    running: bool = False
    running_since: str | None = None
    ready: bool = False
    """The driver container passes its readiness probe: the shard emits (``naming.EMITTING_FILE``)."""
    """``state.running.startedAt`` of the driver container (RFC 3339), when it runs."""
    waiting_reason: str | None = None
    waiting_message: str | None = None
    """``state.waiting.message`` (e.g. the kubelet's ``secret "x" not found`` of a CreateContainerConfigError)."""
    restart_count: int = 0
    restarts_base: int = 0
    template_hash: str | None = None
    aborts_split: bool = False
    """Started to abort its shard's split (``naming.ANNOTATION_ABORT_SPLIT``), not to process."""
    aborts_merge: bool = False
    """Started to abort the merge into its (merged) shard (``naming.ANNOTATION_ABORT_MERGE``), not to process."""
    pod_ip: str | None = None
    """``status.podIP``: where the driver's metrics endpoint answers (``taskshard_operator.live``)."""
    terminated: Termination | None = None
    """The current terminated state (container stopped), else None."""
    last_terminated: Termination | None = None
    """The previous run's terminated state (after an in-place restart), else None."""

    @property
    def restarts(self) -> int:
        return self.restarts_base + self.restart_count

    @property
    def failed(self) -> bool:
        """The pod gave up (phase Failed) or its container crash-loops."""
        return self.phase == "Failed" or self.waiting_reason in ("CrashLoopBackOff", "Error")

    @property
    def stuck(self) -> bool:
        """The driver cannot run as this pod is: it gave up or crash-loops (:attr:`failed`), or its container cannot
        start (:data:`CANNOT_START`: its image, its config). Not while it is being deleted."""
        return not self.deleting and (self.failed or self.waiting_reason in CANNOT_START)

    def running_for(self, now: dt.datetime | None = None) -> float:
        """Seconds the driver container has been running (0 when not running or unknown)."""
        if not self.running or not self.running_since:
            return 0.0
        try:
            started = dt.datetime.fromisoformat(self.running_since.replace("Z", "+00:00"))
        except ValueError:
            return 0.0
        return max(0.0, ((now or dt.datetime.now(dt.UTC)) - started).total_seconds())

    def missing_secret(self, secret: str) -> bool:
        """The container cannot start because ``secret`` (or one of its keys) is missing.

        Matches the kubelet's ``CreateContainerConfigError`` messages ``secret "<name>" not found`` and
        ``couldn't find key <key> in Secret <namespace>/<name>`` (and localkube's ``secret '<name>'``).
        """
        if self.waiting_reason != "CreateContainerConfigError" or not self.waiting_message:
            return False
        pattern = rf"""secrets?\s+["']?(?:[a-z0-9.-]+/)?{re.escape(secret)}(?![a-z0-9.-])"""
        return re.search(pattern, self.waiting_message, re.IGNORECASE) is not None

    @property
    def finished_ok(self) -> bool:
        return self.phase == "Succeeded" or (self.terminated is not None and self.terminated.exit_code == 0)


def _termination(state: dict[str, Any] | None) -> Termination | None:
    term = (state or {}).get("terminated")
    if not term:
        return None
    return Termination(
        exit_code=int(term.get("exitCode", term.get("exit_code", 0)) or 0),
        reason=term.get("reason") or "",
        message=parse_termination_message(term.get("message")),
        finished_at=term.get("finishedAt") or term.get("finished_at"),
    )


def pod_view(pod: dict[str, Any] | None) -> PodView:
    """Read a pod dict (as returned by the API, camelCase) into a :class:`PodView`."""
    if not pod:
        return PodView(exists=False)
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    status = pod.get("status") or {}
    cs = (
        next(
            (c for c in status.get("containerStatuses") or [] if c.get("name") == naming.CONTAINER_DRIVER),
            None,
        )
        or {}
    )
    state = cs.get("state") or {}
    try:
        base = int(annotations.get(naming.ANNOTATION_RESTARTS_BASE, "0"))
    except ValueError:
        base = 0
    return PodView(
        exists=True,
        name=meta.get("name"),
        uid=meta.get("uid"),
        phase=status.get("phase"),
        ended_reason=status.get("reason") or None,
        ended_message=(status.get("message") or "").strip() or None,
        deleting=bool(meta.get("deletionTimestamp")),
        running="running" in state,
        running_since=(state.get("running") or {}).get("startedAt"),
        ready=bool(cs.get("ready")),
        waiting_reason=(state.get("waiting") or {}).get("reason"),
        waiting_message=(state.get("waiting") or {}).get("message"),
        restart_count=int(cs.get("restartCount") or 0),
        restarts_base=base,
        template_hash=annotations.get(naming.ANNOTATION_TEMPLATE_HASH),
        aborts_split=bool(annotations.get(naming.ANNOTATION_ABORT_SPLIT)),
        aborts_merge=bool(annotations.get(naming.ANNOTATION_ABORT_MERGE)),
        pod_ip=status.get("podIP") or None,
        terminated=_termination(state),
        last_terminated=_termination(cs.get("lastState")),
    )
