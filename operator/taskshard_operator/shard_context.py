"""One TaskShard pass's observation and the decision being built from it (:class:`ShardContext`), and the pod
and status helpers both the pass (:mod:`taskshard_operator.reconcile_shard`) and the split protocol
(:mod:`taskshard_operator.split_protocol`) use. Pure: nothing here calls the API; actions are recorded on the
decision and carried out by :func:`taskshard_operator.act.carry_out`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import kopf

from spark_runtime.keygroups import KeyGroupRange
from taskshard_operator import builders, naming
from taskshard_operator import status as st
from taskshard_operator.act import Create, Decision, Delete, Event
from taskshard_operator.cache import Observed
from taskshard_operator.live import utc_now as live_utc_now
from taskshard_operator.models.shard import ShardPhase
from taskshard_operator.models.task import TaskSpec
from taskshard_operator.phases import check_transition, parse_phase

__all__ = ["P", "SHARD_LOG_FORMAT", "ShardContext", "create_pod", "ended_live", "remove_own_pod"]

P = ShardPhase

SHARD_LOG_FORMAT = os.environ.get("TASKSHARD_LOG_FORMAT", "plain")
"""The shard runtimes' log format: the operator's own ``--log-format`` (``__main__`` sets the variable)."""


@dataclass
class ShardContext:
    """One pass's observation of a shard, and the decision being built from it (no I/O)."""

    observed: Observed
    namespace: str
    shard: dict[str, Any]
    task: dict[str, Any] | None
    spec: TaskSpec | None
    task_hash: str | None
    pod: st.PodView
    backoff_wait: float
    """Seconds a replacement pod of the template this shard should run still waits (set once the Task is parsed)."""
    decision: Decision

    @property
    def name(self) -> str:
        return self.shard["metadata"]["name"]

    @property
    def uid(self) -> str:
        return self.shard["metadata"].get("uid", self.name)

    @property
    def generation(self) -> int:
        return int(self.shard["metadata"].get("generation") or 1)

    @property
    def status(self) -> dict[str, Any]:
        """The observed status with the fields this pass has decided to write."""
        return {**(self.shard.get("status") or {}), **self.decision.status}

    @property
    def phase(self) -> ShardPhase:
        return parse_phase(self.status.get("phase"))

    @property
    def task_name(self) -> str:
        return self.shard["spec"]["taskRef"]["name"]

    @property
    def key_groups(self) -> KeyGroupRange:
        kg = self.shard["spec"]["keyGroups"]
        return KeyGroupRange(kg["start"], kg["end"])

    @property
    def restore_from(self) -> dict[str, str] | None:
        return self.shard["spec"].get("restoreFrom")

    @property
    def merge_from(self) -> list[dict[str, str]] | None:
        """A merged shard's two parents (``spec.mergeFrom``), left first."""
        return self.shard["spec"].get("mergeFrom")

    @property
    def family(self) -> str | None:
        """The merge family in its name (label ``taskshard.io/family``; :func:`taskshard_operator.naming.merge_family`):
        its split children carry it on."""
        return (self.shard["metadata"].get("labels") or {}).get(naming.LABEL_FAMILY)

    @property
    def template_hash(self) -> str:
        """The template this shard should run: its roll annotation, else the Task's current one."""
        annotations = self.shard["metadata"].get("annotations") or {}
        return annotations.get(naming.ANNOTATION_TEMPLATE_HASH) or self.task_hash

    # ------------------------------------------------------------ the decision
    def write(self, patch: dict[str, Any], *, phase: ShardPhase | None = None) -> None:
        """Add ``patch`` to the status write (the phase checked against the phase machine); only fields that
        change are kept. A phase change adds the Splitting condition and a Normal event."""
        observed = self.shard.get("status") or {}
        before = self.phase
        if phase is not None:
            check_transition(before, phase)
            step = self.cond(st.SPLITTING, phase.splitting, phase.value if phase.splitting else "NotSplitting")
            patch = {**patch, "phase": phase.value, "conditions": [*patch.get("conditions", []), step]}
        if "conditions" in patch:
            merged = st.set_conditions(self.status.get("conditions"), *patch["conditions"])
            patch = {**patch, "conditions": merged}
        for key, value in patch.items():
            same = st.conditions_equal(value, observed.get(key)) if key == "conditions" else observed.get(key) == value
            if same:
                self.decision.status.pop(key, None)
            else:
                self.decision.status[key] = value
        if phase is not None and phase != before and "phase" in self.decision.status:
            self.decision.new_phase = phase.value
            if observed.get("phase") is not None:
                self.event("Normal", f"Phase{phase.value}", f"{self.name}: phase {before.value} -> {phase.value}")

    def cond(self, type_: str, ok: bool, reason: str, message: str = "") -> dict[str, Any]:
        return st.condition(type_, ok, reason, message, generation=self.generation)

    def event(self, type_: str, reason: str, message: str) -> None:
        self.decision.events.append(Event(type_, reason, message))

    def do(self, action: Any) -> None:
        self.decision.actions.append(action)


def create_pod(
    ctx: ShardContext, *, restarts_base: int, abort_split: tuple[str, ...] = (), abort_merge: bool = False
) -> None:
    """Create the shard's driver pod (and, with executors, its Spark key's Secret, which every pod of it mounts,
    and its Service): to process, or only to undo a split (``abort_split``: its children) or a merge
    (``abort_merge``) in storage."""
    if builders.executor_instances(ctx.spec) > 0:
        key = builders.build_spark_auth_secret(task=ctx.task_name, shard=ctx.name, key_groups=ctx.key_groups)
        kopf.adopt(key, owner=ctx.shard)
        ctx.do(Create("secrets", key))  # kept when it exists: the shard's key for the life of the TaskShard
    if builders.executor_instances(ctx.spec) > 0 and not (abort_split or abort_merge):
        svc = builders.build_executor_service(task=ctx.task_name, shard=ctx.name, key_groups=ctx.key_groups)
        kopf.adopt(svc, owner=ctx.shard)
        ctx.do(Create("services", svc))
    pod = builders.build_pod(
        task=ctx.task_name,
        shard=ctx.name,
        key_groups=ctx.key_groups,
        spec=ctx.spec,
        template_hash=ctx.template_hash,
        restarts_base=restarts_base,
        log_format=SHARD_LOG_FORMAT,
        abort_split=abort_split,
        abort_merge=abort_merge,
    )
    kopf.adopt(pod, owner=ctx.shard)
    name = pod["metadata"]["name"]
    what = "pod to undo the split" if abort_split else ("pod to undo the merge" if abort_merge else "pod")
    ctx.do(Create("pods", pod, announce=Event("Normal", "PodCreated", f"created driver {what} {name}")))


def ended_live(ctx: ShardContext, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """``status.live`` of a shard whose driver ended with a summary: its last batch as reported at exit (the last
    scrape may be a few batches older), no rate, no lag."""
    live = {
        k: v
        for k, v in (ctx.status.get("live") or {}).items()
        if k not in ("lag", "lagUnit", "lagSeconds", "batchTime")
    }
    live.update(batchId=checkpoint["batchId"], rate=0.0, emitting=False, observedAt=live_utc_now())
    if checkpoint.get("time"):
        live["batchTime"] = checkpoint["time"]
    return {"live": live}


def remove_own_pod(ctx: ShardContext) -> None:
    if ctx.pod.exists and not ctx.pod.deleting:
        ctx.do(Delete("pods", ctx.pod.name, grace=0))
