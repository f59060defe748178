"""What a shard's Spark executor pods show (pure): the cache's record of one pod and the shard's summary of them.

A Task with ``spec.spark.executors.instances > 0`` runs each shard's driver in client mode; the driver creates its
executor pods itself through Spark's Kubernetes scheduler backend (``builders.build_executor_conf``): named
``<shard>-exec-<n>``, labelled ``taskshard.io/shard`` and ``taskshard.io/component=executor``, owned by the
driver pod. The operator never creates, patches or deletes them; it watches them through the Kopf index
``executor_pods`` (``handlers/indexes.py``), which keeps one :class:`ExecutorView` per pod under
``(namespace, shard)``. A shard pass turns the views into ``status.executors`` and the ``ExecutorsReady``
condition (:func:`summarize`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from taskshard_operator import status as st

__all__ = [
    "DRIVER_NOT_RUNNING",
    "EXECUTORS_PENDING",
    "EXECUTORS_RUNNING",
    "EXECUTORS_STARTING",
    "ExecutorView",
    "ExecutorsSummary",
    "executor_view",
    "summarize",
]

EXECUTORS_RUNNING = "ExecutorsRunning"
"""ExecutorsReady=True: at least as many executor pods run as the Task asks for."""
EXECUTORS_PENDING = "ExecutorsPending"
"""ExecutorsReady=False: an executor pod does not run and the pod says why (unschedulable, image pull, config
error, a failed container); the message names each such pod. Also a Warning event, once per distinct message."""
EXECUTORS_STARTING = "ExecutorsStarting"
"""ExecutorsReady=False: executor pods are not created yet, or created and starting without a problem shown."""
DRIVER_NOT_RUNNING = "DriverNotRunning"
"""ExecutorsReady=False: the shard's driver pod does not run, so it has not created its executors (yet)."""

STARTING_REASONS = frozenset({"ContainerCreating", "PodInitializing"})
"""Container waiting reasons of a pod that is simply starting: no problem to report."""
POD_TEXT_LIMIT = 300
"""At most this many characters of one pod's message go into the condition message."""
_ENDED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class ExecutorView:
    """One executor pod as the shard pass needs it (the index record, a few hundred bytes)."""

    name: str
    phase: str | None = None
    """``status.phase`` (None: created, no status yet)."""
    ready: bool = False
    """The pod's ``Ready`` condition is True."""
    deleting: bool = False
    """``metadata.deletionTimestamp`` is set: the pod is going (it counts neither as running nor as pending)."""
    reason: str | None = None
    """For a pod that does not run: why, e.g. ``Unschedulable`` or ``ImagePullBackOff``; None when nothing says."""
    message: str | None = None
    """The text that goes with ``reason``, e.g. ``0/1 nodes are available: 1 Insufficient memory.``"""

    @property
    def running(self) -> bool:
        return self.phase == "Running" and not self.deleting

    @property
    def pending(self) -> bool:
        """Created, not running, not ended and not being deleted."""
        return not self.deleting and self.phase not in ("Running", *_ENDED)

    @property
    def explained(self) -> bool:
        """It does not run and the pod shows a problem (not merely ``ContainerCreating``)."""
        return self.reason is not None and self.reason not in STARTING_REASONS

    def describe(self) -> str:
        """``ex-0-8-exec-3 Pending (Unschedulable: 0/1 nodes are available: 1 Insufficient memory.)``."""
        text = f"{self.name} {self.phase or 'Pending'}"
        if self.reason:
            detail = f": {st.truncate(self.message, POD_TEXT_LIMIT)}" if self.message else ""
            text += f" ({self.reason}{detail})"
        return text


def _waiting_or_failed(statuses: list[dict[str, Any]] | None) -> tuple[str, str | None] | None:
    """The first container that waits with a reason, or that terminated with a failure: (reason, message)."""
    for cs in statuses or []:
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        if waiting.get("reason"):
            return waiting["reason"], waiting.get("message") or None
        term = state.get("terminated") or {}
        code = term.get("exitCode")
        if term and code not in (0, None):
            return term.get("reason") or "Error", term.get("message") or f"exit code {code}"
    return None


def _why_not_running(status: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """Why a pod does not run, from the most telling source: a ``PodScheduled`` condition that is not True (the
    scheduler's reason, e.g. ``Unschedulable``), else an init container's then a container's waiting reason or
    failed termination, else the pod's own ``status.reason`` (e.g. ``Evicted``)."""
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") != "True" and cond.get("reason"):
            return cond["reason"], cond.get("message") or None
    found = _waiting_or_failed(status.get("initContainerStatuses")) or _waiting_or_failed(
        status.get("containerStatuses")
    )
    if found is not None:
        return found
    return status.get("reason") or None, status.get("message") or None


def executor_view(pod: Mapping[str, Any]) -> ExecutorView:
    """Read an executor pod dict (as the API returns it, camelCase) into an :class:`ExecutorView`.

    ``ready`` is the pod's ``Ready`` condition (without conditions: every container reports ready). ``reason`` and
    ``message`` are filled only for a pod that does not run (phase other than Running), see
    :func:`_why_not_running`.
    """
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    phase = status.get("phase") or None
    conditions = status.get("conditions") or []
    ready_cond = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready_cond is not None:
        ready = ready_cond.get("status") == "True"
    else:
        containers = status.get("containerStatuses") or []
        ready = bool(containers) and all(c.get("ready") for c in containers)
    reason, message = (None, None) if phase == "Running" else _why_not_running(status)
    return ExecutorView(
        name=meta.get("name") or "",
        phase=phase,
        ready=ready,
        deleting=bool(meta.get("deletionTimestamp")),
        reason=reason,
        message=message,
    )


@dataclass(frozen=True)
class ExecutorsSummary:
    """``status.executors`` and the ``ExecutorsReady`` condition of one shard."""

    requested: int
    running: int
    pending: int
    ready: bool
    reason: str
    message: str

    @property
    def status(self) -> dict[str, int]:
        """``status.executors`` (camelCase, as the CRD has it)."""
        return {"requested": self.requested, "running": self.running, "pending": self.pending}


def summarize(requested: int, views: Iterable[ExecutorView], *, driver_running: bool = True) -> ExecutorsSummary:
    """The shard's executors: ``requested`` (the Task's ``spec.spark.executors.instances``), the pods that run
    (phase Running) and those that wait (Pending), pods being deleted not counted; ready when at least
    ``requested`` run. Otherwise the message names each pod that does not run and why, e.g.
    ``1 of 2 executors not running: ex-0-8-exec-3 Pending (Unschedulable: 0/1 nodes are available: 1 Insufficient
    memory.)``; the reason is :data:`EXECUTORS_PENDING` when one of them shows a problem, else
    :data:`EXECUTORS_STARTING` (not created yet, or starting); :data:`DRIVER_NOT_RUNNING` when the driver pod does
    not run (``driver_running=False``)."""
    live = sorted((v for v in views if not v.deleting), key=lambda v: v.name)
    running = [v for v in live if v.running]
    pending = [v for v in live if v.pending]
    counts = {"requested": requested, "running": len(running), "pending": len(pending)}
    if not driver_running:
        message = f"the driver pod does not run; it starts its {requested} executor(s) once it does"
        return ExecutorsSummary(**counts, ready=False, reason=DRIVER_NOT_RUNNING, message=message)
    if len(running) >= requested:
        message = f"{len(running)} of {requested} executors running"
        return ExecutorsSummary(**counts, ready=True, reason=EXECUTORS_RUNNING, message=message)
    missing = requested - len(running)
    waiting = [v for v in live if not v.running]
    parts = [v.describe() for v in waiting]
    if missing > len(waiting):
        parts.append(f"{missing - len(waiting)} not created yet")
    reason = EXECUTORS_PENDING if any(v.explained for v in waiting) else EXECUTORS_STARTING
    message = st.truncate(f"{missing} of {requested} executors not running: " + "; ".join(parts))
    return ExecutorsSummary(**counts, ready=False, reason=reason, message=message)
