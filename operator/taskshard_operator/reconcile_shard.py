"""One reconcile pass of a TaskShard: observe -> validate -> act, with ``status`` as the write-ahead log.

:func:`reconcile_shard` is level-based and idempotent: it reads the shard, its Task and its driver pod fresh,
does at most one protocol step, writes the step to status and returns. It is called by a timer, by shard events
and by pod events (see ``handlers/``), serialised per shard by a lock in the handlers.

Split protocol (each phase is written to ``status`` *before* the step it names is acted on; a crash anywhere
leaves a phase from which the next pass continues, and every action is idempotent):

- Step 1, Running: a valid ``spec.split`` is accepted by writing ``phase: SplitRequested`` and ``status.split.at``
  in one patch (nothing else is touched yet). Crash after: the next pass finds SplitRequested.
- Step 2, SplitRequested: create both children (deterministic names ``<task>-<start>-<at>`` and
  ``<task>-<at>-<end>``, owned by the Task, ``spec.restoreFrom.manifest`` = the parent's drain summary
  ``drained.json``; 409 = created before), annotate the pod ``taskshard.io/drain=true`` (re-annotating is
  harmless; a missing pod is recreated with the annotation), then write ``Draining`` with
  ``status.lineage.children``. Crash between: both are done again. The children start on **standby** at once:
  their pods start Spark and rehearse the restore while the parent drains, and process nothing until the
  parent's runtime has written the drain summary (after its query stopped for good). Their phase stays Pending
  (Ready=False, reason Standby) while the parent owns the range.
- Step 3, Draining: wait for the driver container to exit 0 with a termination message naming the snapshot
  manifest and batch id; write ``Drained`` with ``status.finalCheckpoint``. A pod that crashes while draining is
  restarted in place by ``restartPolicy: OnFailure`` and drains again (the annotation stays); a deleted pod is
  recreated with the annotation. Crash: the terminated container status is still there to read.
- Step 4, Drained: delete the parent's stopped pod, make sure both children exist, and write
  ``ChildrenCreated``: from now on the children own the halves (and show Running once their pods run).
- Step 5, ChildrenCreated: once both children exist and have been seen by their reconciler (``status.phase``
  set), write ``Split``. The parent keeps no pod and no ConfigMap.

No key group is ever processed by two shards: a child's runtime starts its query only once the parent's drain
summary exists, and the parent writes it as the last step of a final drain, after stopping its query; a final
drain is sticky (a restarted parent pod re-reports it and never processes again). Children created by an
operator version that pointed ``restoreFrom.manifest`` at the manifest itself restore at once, as before (their
parent had drained when they were created).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import ValidationError

from spark_runtime.keygroups import KeyGroupRange
from taskshard_operator import builders, naming, planner
from taskshard_operator import status as st
from taskshard_operator.kube import Kube
from taskshard_operator.models.shard import ShardPhase
from taskshard_operator.models.task import TaskSpec
from taskshard_operator.phases import SPLIT_STEPS, TERMINAL, check_transition, parse_phase
from taskshard_operator.views import shard_views

P = ShardPhase

CRASH_AFTER_PHASE_ENV = "TASKSHARD_CRASH_AFTER_PHASE"
"""Fault injection for crash tests only: when set to a phase name, the operator process exits (code 137, as if
SIGKILLed) right after it has persisted that phase and before it acts on it. Never set in production."""

STABLE_SECONDS = 60.0
"""A driver container that ran this long resets the pod replacement back-off."""

Emit = Callable[[dict[str, Any], str, str, str], None]
"""``emit(body, type, reason, message)``: post a Kubernetes Event about ``body`` (``kopf.event`` in production)."""


@dataclass
class Backoff:
    """In-memory back-off for replacing a shard's pod: ``base * 2**(n-1)`` capped at ``cap`` seconds.

    Lost on operator restart on purpose (a restarted operator retries at once); ``status.restarts`` persists.
    """

    base: float = 2.0
    cap: float = 60.0
    _state: dict[str, tuple[int, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ready(self, key: str) -> float:
        """Seconds still to wait before the next replacement (0 = go)."""
        with self._lock:
            _, not_before = self._state.get(key, (0, 0.0))
        return max(0.0, not_before - time.monotonic())

    def record(self, key: str) -> float:
        with self._lock:
            n, _ = self._state.get(key, (0, 0.0))
            delay = min(self.cap, self.base * 2**n)
            self._state[key] = (n + 1, time.monotonic() + delay)
            return delay

    def reset(self, key: str) -> None:
        with self._lock:
            self._state.pop(key, None)


def validate_shard_config(config: dict[str, Any]) -> None:
    """Validate ``shard.json`` with the runtime's own parser (``spark_runtime.config``, imports no pyspark).

    Raises ``ValueError`` (``ConfigError``) listing every bad field as ``<path>: <value> is invalid: ...``.
    """
    try:
        from spark_runtime.config import parse_config  # noqa: PLC0415 - optional: the runtime may be absent
    except ImportError:
        return
    parse_config(config, "the shard config built by the operator")


@dataclass
class ShardContext:
    """Everything one pass observed (read once at the start of the pass)."""

    kube: Kube
    emit: Emit
    backoff: Backoff
    namespace: str
    shard: dict[str, Any]
    task: dict[str, Any] | None
    spec: TaskSpec | None
    pod: st.PodView
    pod_raw: dict[str, Any] | None

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
        return self.shard.get("status") or {}

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
    def template_hash(self) -> str:
        """The template this shard should run: its roll annotation, else the Task's current one."""
        annotations = self.shard["metadata"].get("annotations") or {}
        return annotations.get(naming.ANNOTATION_TEMPLATE_HASH) or builders.template_hash(self.spec)

    # ------------------------------------------------------------ writes
    def write(self, patch: dict[str, Any], *, phase: ShardPhase | None = None) -> None:
        """Patch status (and the phase, checked against the phase machine); skip when nothing changes."""
        current = self.status
        if phase is not None:
            check_transition(self.phase, phase)
            splitting = phase in SPLIT_STEPS and phase != P.SPLIT
            step = self.cond(st.SPLITTING, splitting, phase.value if splitting else "NotSplitting")
            patch = {**patch, "phase": phase.value, "conditions": [*patch.get("conditions", []), step]}
        if "conditions" in patch:
            merged = st.set_conditions(current.get("conditions"), *patch["conditions"])
            if st.conditions_equal(merged, current.get("conditions")):
                patch = {k: v for k, v in patch.items() if k != "conditions"}
            else:
                patch = {**patch, "conditions": merged}
        changed = {k: v for k, v in patch.items() if current.get(k) != v}
        if not changed:
            return
        result = self.kube.patch_custom_status(naming.SHARD_PLURAL, self.namespace, self.name, changed)
        self.shard = result or {**self.shard, "status": {**current, **changed}}
        if phase is not None and phase.value == os.environ.get(CRASH_AFTER_PHASE_ENV) and "phase" in changed:
            print(f"[fault injection] {self.name}: exiting after writing phase {phase.value}", flush=True)
            os._exit(137)
        if phase is not None and phase != parse_phase(current.get("phase")) and current.get("phase") is not None:
            self.emit(
                self.shard,
                "Normal",
                f"Phase{phase.value}",
                f"{self.name}: phase {current.get('phase')} -> {phase.value}",
            )

    def cond(self, type_: str, ok: bool, reason: str, message: str = "") -> dict[str, Any]:
        return st.condition(type_, ok, reason, message, generation=self.generation)


def reconcile_shard(kube: Kube, namespace: str, name: str, *, emit: Emit, backoff: Backoff) -> None:
    """One pass for the TaskShard ``namespace/name`` (see the module docstring)."""
    shard = kube.get_custom(naming.SHARD_PLURAL, namespace, name)
    if shard is None or shard["metadata"].get("deletionTimestamp"):
        return
    task_name = shard["spec"]["taskRef"]["name"]
    task = kube.get_custom(naming.TASK_PLURAL, namespace, task_name)
    pod_raw = kube.get_pod(namespace, naming.pod_name(name))
    ctx = ShardContext(kube, emit, backoff, namespace, shard, task, None, st.pod_view(pod_raw), pod_raw)

    _sync_active_label(ctx)
    if task is None or task["metadata"].get("deletionTimestamp"):
        return _stop(ctx)
    try:
        ctx.spec = TaskSpec.from_k8s(task.get("spec") or {})
    except ValidationError as e:
        message = f"Task {task_name} has an invalid spec, the shard waits for a fix: {_first_error(e)}"
        ctx.write({"conditions": [ctx.cond(st.DEGRADED, True, "InvalidTaskSpec", message)]})
        return

    phase = ctx.phase
    if phase in (P.PENDING, P.RUNNING, P.FAILED):
        _reconcile_active(ctx)
    elif phase == P.SPLIT_REQUESTED:
        _step_request_drain(ctx)
    elif phase == P.DRAINING:
        _step_await_drain(ctx)
    elif phase == P.DRAINED:
        _step_create_children(ctx)
    elif phase == P.CHILDREN_CREATED:
        _step_finish_split(ctx)
    elif phase == P.SPLIT:
        _keep_split(ctx)
    # Stopped: terminal, nothing to do.


def _sync_active_label(ctx: ShardContext) -> None:
    """``taskshard.io/active``: "false" once the shard's phase is terminal (Split, Stopped), else "true" (patched
    only when it differs)."""
    want = "false" if ctx.phase in TERMINAL else "true"
    if (ctx.shard["metadata"].get("labels") or {}).get(naming.LABEL_ACTIVE) != want:
        ctx.kube.patch_custom(
            naming.SHARD_PLURAL, ctx.namespace, ctx.name, {"metadata": {"labels": {naming.LABEL_ACTIVE: want}}}
        )


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    return f"spec.{loc}: {err.get('msg')}" if loc else str(err.get("msg"))


# ---------------------------------------------------------------- Pending / Running / Failed


def _ensure_config(ctx: ShardContext) -> bool:
    """Create or patch the ConfigMap (and the driver Service with executors). False when the config is invalid.

    An existing ConfigMap is patched only once the shard was told to run the Task's current template (the roll
    reached it), so a not-yet-rolled shard whose container restarts in place keeps its old config.
    """
    config = builders.build_shard_config(
        task=ctx.task_name,
        namespace=ctx.namespace,
        shard=ctx.name,
        key_groups=ctx.key_groups,
        spec=ctx.spec,
        restore_from=ctx.restore_from,
        task_created=((ctx.task or {}).get("metadata") or {}).get("creationTimestamp"),
        task_uid=((ctx.task or {}).get("metadata") or {}).get("uid"),
    )
    try:
        validate_shard_config(config)
    except ValueError as e:
        message = f"the shard runtime config built from Task {ctx.task_name} is invalid: {e}"
        ctx.write({"conditions": [ctx.cond(st.DEGRADED, True, "InvalidShardConfig", message)]})
        return False
    cm = builders.build_configmap(
        task=ctx.task_name, shard=ctx.name, key_groups=ctx.key_groups, config=config, spec=ctx.spec
    )
    kopf.adopt(cm, owner=ctx.shard)
    if ctx.template_hash == builders.template_hash(ctx.spec):
        ctx.kube.apply_configmap(ctx.namespace, cm)
    elif ctx.kube.get_configmap(ctx.namespace, cm["metadata"]["name"]) is None:
        ctx.kube.apply_configmap(ctx.namespace, cm)
    if builders.executor_instances(ctx.spec) > 0:
        svc = builders.build_executor_service(task=ctx.task_name, shard=ctx.name, key_groups=ctx.key_groups)
        kopf.adopt(svc, owner=ctx.shard)
        ctx.kube.ensure_service(ctx.namespace, svc)
    return True


def _standby_parent(ctx: ShardContext) -> str | None:
    """For a split child still in Pending: its parent's name while the parent owns the range (the split is
    between SplitRequested and Drained), else None. A child that was Running once never asks again (a split
    only moves forward)."""
    if not ctx.restore_from or ctx.phase != P.PENDING:
        return None
    parent = ctx.kube.get_custom(naming.SHARD_PLURAL, ctx.namespace, ctx.restore_from["parent"])
    if parent is None:
        return None
    if parse_phase((parent.get("status") or {}).get("phase")) in planner.PARENT_OWNS_RANGE:
        return ctx.restore_from["parent"]
    return None


def _create_pod(ctx: ShardContext, *, drain: bool, restarts_base: int) -> None:
    pod = builders.build_pod(
        task=ctx.task_name,
        shard=ctx.name,
        key_groups=ctx.key_groups,
        spec=ctx.spec,
        template_hash=ctx.template_hash,
        drain=drain,
        restarts_base=restarts_base,
    )
    kopf.adopt(pod, owner=ctx.shard)
    if ctx.kube.create_pod(ctx.namespace, pod) is not None:
        ctx.emit(ctx.shard, "Normal", "PodCreated", f"created driver pod {pod['metadata']['name']}")


def _reconcile_active(ctx: ShardContext) -> None:
    pod, phase = ctx.pod, ctx.phase
    lineage = {"parent": ctx.restore_from["parent"]} if ctx.restore_from else None
    base_patch: dict[str, Any] = {"pod": naming.pod_name(ctx.name)}
    if lineage and ctx.status.get("lineage") is None:
        base_patch["lineage"] = lineage

    # Step A: the split request, once per generation (decided before any pod action, so a refusal changes nothing).
    if ctx.generation != ctx.status.get("observedGeneration"):
        decision = planner.plan_split(
            shard=ctx.name, key_groups=ctx.key_groups, phase=phase, split=ctx.shard["spec"].get("split")
        )
        if isinstance(decision, planner.SplitAccepted):
            low, high = planner.child_names(ctx.task_name, decision.children)
            message = f"split accepted at key group {decision.at}: {ctx.name} -> {low} + {high}"
            ctx.write(
                {
                    "observedGeneration": ctx.generation,
                    "split": {"at": decision.at, "acceptedTime": st.now()},
                    "conditions": [
                        ctx.cond(st.PROGRESSING, True, "SplitRequested", message),
                        ctx.cond(st.SPLIT_REJECTED, False, "Accepted", message),
                    ],
                },
                phase=P.SPLIT_REQUESTED,
            )
            ctx.emit(ctx.shard, "Normal", "SplitAccepted", message)
            return
        if isinstance(decision, planner.SplitRefused):
            ctx.write(
                {
                    "observedGeneration": ctx.generation,
                    "conditions": [ctx.cond(st.SPLIT_REJECTED, True, "InvalidSplitRequest", decision.message)],
                }
            )
            ctx.emit(ctx.shard, "Warning", "SplitRejected", decision.message)
            return
        ctx.write({"observedGeneration": ctx.generation})

    # Step B: config (an invalid one stops here with a Degraded condition, no crash loop).
    if not _ensure_config(ctx):
        return

    # Step C: the pod. Missing -> create (a replacement waits for the back-off); finished -> replace. Never for a
    # range another shard owns (a stray or overlapping TaskShard): those key groups would be processed twice.
    if not pod.exists and _refuse_overlap(ctx):
        return
    if not pod.exists:
        replacement = ctx.status.get("pod") is not None
        restarts = int(ctx.status.get("restarts") or 0) + (1 if replacement else 0)
        if replacement:
            wait = ctx.backoff.ready(ctx.uid)
            if wait > 0:
                ctx.write(
                    {"conditions": [ctx.cond(st.PROGRESSING, True, "BackOff", f"replacing the pod in {wait:.0f}s")]},
                    phase=P.FAILED if phase == P.FAILED else P.PENDING,
                )
                return
            ctx.backoff.record(ctx.uid)
        _create_pod(ctx, drain=False, restarts_base=restarts)
        ctx.write(
            {
                **base_patch,
                "restarts": restarts,
                "conditions": [
                    ctx.cond(st.READY, False, "PodStarting", "driver pod created"),
                    ctx.cond(st.PROGRESSING, True, "PodStarting", "driver pod created, waiting for it to run"),
                ],
            },
            phase=P.FAILED if phase == P.FAILED else P.PENDING,
        )
        return
    if pod.deleting:
        ctx.write(
            {"conditions": [ctx.cond(st.READY, False, "PodTerminating", f"pod {pod.name} is terminating")]},
            phase=P.FAILED if phase == P.FAILED else P.PENDING,
        )
        return

    checkpoint_patch = {}
    term = pod.terminated or pod.last_terminated
    if term is not None and term.checkpoint(with_manifest=False):
        checkpoint_patch["lastCheckpoint"] = term.checkpoint(with_manifest=False)

    # A pod that ended (Failed, or exited 0 without being asked to drain) is replaced: last-state restart.
    if pod.phase in ("Failed", "Succeeded"):
        why = "failed" if pod.phase == "Failed" else "exited without a split drain request"
        failure = term.failure if term is not None else None
        if failure is not None:
            why += f", last exit code {term.exit_code}: {failure.text}"
        elif term is not None and term.drained:
            why += f" after a final drain at batch {term.batch_id} (the drain-request annotation was set)"
        elif term is not None and (term.message or {}).get("event") == "stopped":
            why += f" after a SIGTERM stop at batch {term.batch_id} (the new pod resumes from the recovery log)"
        reason = failure.condition_reason("PodEnded") if failure is not None else "PodEnded"
        announce = failure is None or not _degraded_shows(ctx, reason, failure.text)
        ctx.write(
            {
                **base_patch,
                **checkpoint_patch,
                "restarts": pod.restarts,
                "conditions": [
                    ctx.cond(st.READY, False, reason, f"pod {pod.name} {why}; replacing it"),
                    ctx.cond(st.DEGRADED, True, reason, f"pod {pod.name} {why}; replacing it (last-state restart)"),
                ],
            },
            phase=P.FAILED,
        )
        if announce:
            ctx.emit(ctx.shard, "Warning", reason, f"pod {pod.name} {why}; replacing it")
        ctx.kube.delete_pod(ctx.namespace, pod.name, uid=(ctx.pod_raw or {}).get("metadata", {}).get("uid"), grace=0)
        return

    # Roll: the pod runs another template than the shard should run -> last-state restart (delete, recreate).
    if pod.template_hash != ctx.template_hash:
        message = (
            f"template changed ({pod.template_hash} -> {ctx.template_hash}); restarting {pod.name} from its checkpoint"
        )
        ctx.write(
            {**base_patch, "conditions": [ctx.cond(st.PROGRESSING, True, "RollingRestart", message)]},
            phase=P.PENDING,
        )
        ctx.emit(ctx.shard, "Normal", "RollingRestart", message)
        ctx.backoff.reset(ctx.uid)
        ctx.kube.delete_pod(ctx.namespace, pod.name)
        return

    # A child whose parent still drains: its pod is warm but processes nothing yet (standby).
    standby_parent = _standby_parent(ctx) if pod.running else None
    if standby_parent:
        message = (
            f"standby: driver pod {pod.name} is started and warm; it restores its slice and starts processing "
            f"once parent {standby_parent} has finished draining"
        )
        ctx.write(
            {
                **base_patch,
                "restarts": pod.restarts,
                "conditions": [
                    ctx.cond(st.READY, False, "Standby", message),
                    ctx.cond(st.PROGRESSING, True, "Standby", message),
                    ctx.cond(st.DEGRADED, False, "Healthy", ""),
                ],
            },
            phase=P.PENDING,
        )
        return

    # Mirror the pod into status.
    if pod.running:
        if pod.running_for() >= STABLE_SECONDS:
            ctx.backoff.reset(ctx.uid)
        ctx.write(
            {
                **base_patch,
                **checkpoint_patch,
                "restarts": pod.restarts,
                "conditions": [
                    ctx.cond(st.READY, True, "PodRunning", f"driver pod {pod.name} runs {ctx.key_groups}"),
                    ctx.cond(st.PROGRESSING, False, "Stable", ""),
                    ctx.cond(st.DEGRADED, False, "Healthy", ""),
                ],
            },
            phase=P.RUNNING,
        )
    elif pod.failed:
        state = pod.waiting_reason or pod.phase or "Failed"
        failure = term.failure if term is not None else None
        if failure is not None:
            reason = failure.condition_reason(state)
            message = (
                f"driver pod {pod.name} is {state} (restarts {pod.restarts}), last exit code {term.exit_code}: "
                f"{failure.text}"
            )
            event = reason if reason != state else "PodFailed"
            announce = not _degraded_shows(ctx, reason, failure.text)
        else:
            reason = state
            message = (
                f"driver pod {pod.name} is {state} (restarts {pod.restarts}); the kubelet restarts it with back-off"
            )
            if term is not None:
                message += f", last exit code {term.exit_code}"
            event, announce = "PodFailed", phase != P.FAILED
        ctx.write(
            {
                **base_patch,
                **checkpoint_patch,
                "restarts": pod.restarts,
                "conditions": [
                    ctx.cond(st.READY, False, reason, message),
                    ctx.cond(st.DEGRADED, True, reason, message),
                ],
            },
            phase=P.FAILED,
        )
        if announce:
            ctx.emit(ctx.shard, "Warning", event, message)
    else:
        keep_phase = P.FAILED if phase == P.FAILED else (P.PENDING if phase == P.PENDING else P.RUNNING)
        secret = _credentials_secret(ctx.spec)
        if secret is not None and pod.missing_secret(secret):
            message = (
                f"driver pod {pod.name} cannot start: Secret {secret!r} (spec.storage.s3.credentialsSecret) does not "
                f"exist in namespace {ctx.namespace} or lacks key {' or '.join(builders.S3_CREDENTIAL_KEYS)}; "
                f"the pod starts once it does (kubelet: {st.truncate(pod.waiting_message or '')})"
            )
            announce = not _degraded_shows(ctx, "SecretMissing", message)
            ctx.write(
                {
                    **base_patch,
                    "conditions": [
                        ctx.cond(st.READY, False, "SecretMissing", message),
                        ctx.cond(st.DEGRADED, True, "SecretMissing", message),
                    ],
                },
                phase=keep_phase,
            )
            if announce:
                ctx.emit(ctx.shard, "Warning", "SecretMissing", message)
            return
        message = f"driver pod {pod.name} is {pod.phase}"
        if pod.waiting_reason:
            detail = f": {st.truncate(pod.waiting_message)}" if pod.waiting_message else ""
            message += f" ({pod.waiting_reason}{detail})"
        ctx.write(
            {**base_patch, "conditions": [ctx.cond(st.READY, False, "PodStarting", message)]},
            phase=keep_phase,
        )


def _credentials_secret(spec: TaskSpec) -> str | None:
    """``spec.storage.s3.credentialsSecret``, or None."""
    s3 = spec.storage.s3
    return s3.credentials_secret if s3 is not None else None


def _refuse_overlap(ctx: ShardContext) -> bool:
    """True (and status says why) when another shard of the Task owns key groups of this shard's range, so no pod
    may start for it (:func:`taskshard_operator.planner.range_conflicts`). One LIST, made only before creating a
    pod, not on every pass."""
    views = shard_views(ctx.kube, ctx.namespace, ctx.task_name)
    me = next((v for v in views if v.name == ctx.name), None)
    conflicts = planner.range_conflicts(me, views) if me is not None else []
    if not conflicts:
        return False
    owned = ", ".join(f"{c.name} {c.key_groups}" for c in conflicts)
    message = (
        f"not starting: key groups of {ctx.key_groups} are owned by {owned}; two shards would process them twice. "
        f"Delete the TaskShard that should not exist (kubectl delete taskshard NAME)"
    )
    if not _degraded_shows(ctx, "RangeOverlap", owned):
        ctx.emit(ctx.shard, "Warning", "RangeOverlap", message)
    ctx.write(
        {
            "conditions": [
                ctx.cond(st.READY, False, "RangeOverlap", message),
                ctx.cond(st.DEGRADED, True, "RangeOverlap", message),
            ]
        },
        phase=P.FAILED if ctx.phase == P.FAILED else P.PENDING,
    )
    return True


def _degraded_shows(ctx: ShardContext, reason: str, text: str) -> bool:
    """Status already shows this problem: Degraded is True with ``reason`` and its message contains ``text``.

    Decides whether a Warning event is posted: once per distinct error, not on every resync or crash-loop restart.
    """
    degraded = st.get_condition(ctx.status.get("conditions"), st.DEGRADED)
    return (
        degraded is not None
        and degraded.get("status") == "True"
        and degraded.get("reason") == reason
        and text in (degraded.get("message") or "")
    )


# ---------------------------------------------------------------- split steps


def _step_request_drain(ctx: ShardContext) -> None:
    """Step 2: SplitRequested -> (create the standby children, annotate the pod) -> Draining."""
    children = _ensure_children(ctx)
    if children is None:
        return  # a name collision (reported); the parent keeps processing until it is resolved
    names = [c["metadata"]["name"] for c in children]
    pod = ctx.pod
    if not pod.exists:
        _create_pod(ctx, drain=True, restarts_base=int(ctx.status.get("restarts") or 0))
    elif not pod.drain_requested:
        ctx.kube.patch_pod(ctx.namespace, pod.name, {"metadata": {"annotations": {naming.ANNOTATION_DRAIN: "true"}}})
    message = (
        f"asked driver pod {naming.pod_name(ctx.name)} to drain (stop at a batch boundary, export a snapshot); "
        f"children {names[0]} and {names[1]} wait on standby"
    )
    ctx.write(
        {
            "lineage": {**(ctx.status.get("lineage") or {}), "children": names},
            "conditions": [
                ctx.cond(st.PROGRESSING, True, "Draining", message),
                ctx.cond(st.READY, False, "Draining", message),
            ],
        },
        phase=P.DRAINING,
    )
    ctx.emit(ctx.shard, "Normal", "Draining", message)


def _step_await_drain(ctx: ShardContext) -> None:
    """Step 3: Draining -> Drained once the container exited 0 with a manifest."""
    pod = ctx.pod
    if not pod.exists:
        _create_pod(ctx, drain=True, restarts_base=int(ctx.status.get("restarts") or 0) + 1)
        return
    if pod.deleting:
        return
    if not pod.drain_requested:
        ctx.kube.patch_pod(ctx.namespace, pod.name, {"metadata": {"annotations": {naming.ANNOTATION_DRAIN: "true"}}})
        return
    term = pod.terminated
    if term is None:
        if pod.failed:
            message = (
                f"driver pod {pod.name} failed while draining ({pod.waiting_reason}); it is restarted and drains again"
            )
            ctx.write({"conditions": [ctx.cond(st.DEGRADED, True, "DrainRetry", message)]})
        return
    if term.drained:
        final = term.checkpoint(with_manifest=True) or {"manifest": term.manifest}
        if "batchId" not in final:
            final["batchId"] = 0
        message = f"drained at batch {final['batchId']}; snapshot manifest {term.manifest}"
        ctx.write(
            {
                "finalCheckpoint": final,
                "lastCheckpoint": final,
                "restarts": pod.restarts,
                "conditions": [
                    ctx.cond(st.PROGRESSING, True, "Drained", message),
                    ctx.cond(st.DEGRADED, False, "Healthy", ""),
                ],
            },
            phase=P.DRAINED,
        )
        ctx.emit(ctx.shard, "Normal", "Drained", message)
        return
    if term.exit_code == 0 or pod.phase in ("Failed", "Succeeded"):
        # Ended without a snapshot manifest: nothing to restore from; run the drain again from the recovery log.
        message = (
            f"driver pod {pod.name} ended (exit code {term.exit_code}) without a snapshot manifest in its "
            f"termination message {term.message!r}; recreating it to drain again"
        )
        ctx.write({"conditions": [ctx.cond(st.DEGRADED, True, "DrainWithoutManifest", message)]})
        ctx.emit(ctx.shard, "Warning", "DrainWithoutManifest", message)
        ctx.kube.delete_pod(ctx.namespace, pod.name, grace=0)


def _children(ctx: ShardContext) -> list[tuple[str, dict[str, Any]]]:
    at = int(ctx.status["split"]["at"])
    low, high = ctx.key_groups.split(at)
    manifest = builders.drain_summary_uri(ctx.task_name, ctx.spec, ctx.name)
    out = []
    for r in (low, high):
        body = builders.build_shard(
            ctx.task_name,
            r,
            template_hash=builders.template_hash(ctx.spec),
            restore_from={"parent": ctx.name, "manifest": manifest},
        )
        kopf.adopt(body, owner=ctx.task)
        out.append((body["metadata"]["name"], body))
    return out


def _ensure_children(ctx: ShardContext) -> list[dict[str, Any]] | None:
    """Create both children if absent; return them, or None after reporting a name collision."""
    found = []
    for name, body in _children(ctx):
        existing = ctx.kube.get_custom(naming.SHARD_PLURAL, ctx.namespace, name)
        if existing is None:
            created = ctx.kube.create_custom(naming.SHARD_PLURAL, ctx.namespace, body)
            if created is not None:
                ctx.emit(
                    ctx.shard,
                    "Normal",
                    "ChildCreated",
                    f"created child {name}; it restores from {ctx.name} once drained",
                )
            existing = created or ctx.kube.get_custom(naming.SHARD_PLURAL, ctx.namespace, name)
        if existing is not None and (existing["spec"].get("restoreFrom") or {}).get("parent") != ctx.name:
            message = f"cannot create child {name}: a TaskShard of that name exists and is not a child of {ctx.name}"
            ctx.write({"conditions": [ctx.cond(st.DEGRADED, True, "ChildNameTaken", message)]})
            ctx.emit(ctx.shard, "Warning", "ChildNameTaken", message)
            return None
        found.append(existing)
    return found


def _remove_own_pod(ctx: ShardContext) -> None:
    if ctx.pod.exists and not ctx.pod.deleting:
        ctx.kube.delete_pod(ctx.namespace, ctx.pod.name, grace=0)


def _step_create_children(ctx: ShardContext) -> None:
    """Step 4: Drained -> (delete the stopped pod, create both children) -> ChildrenCreated."""
    if ctx.pod.exists and ctx.pod.terminated is None and ctx.pod.phase not in ("Succeeded", "Failed"):
        return  # defensive: never create children while the parent's container could still run
    _remove_own_pod(ctx)
    children = _ensure_children(ctx)
    if children is None:
        return
    names = [c["metadata"]["name"] for c in children]
    lineage = {**(ctx.status.get("lineage") or {}), "children": names}
    message = f"children {names[0]} and {names[1]} restore from {ctx.status['finalCheckpoint']['manifest']}"
    ctx.write(
        {"lineage": lineage, "pod": None, "conditions": [ctx.cond(st.PROGRESSING, True, "ChildrenCreated", message)]},
        phase=P.CHILDREN_CREATED,
    )


def _step_finish_split(ctx: ShardContext) -> None:
    """Step 5: ChildrenCreated -> Split once both children were seen by their reconciler."""
    _remove_own_pod(ctx)
    children = _ensure_children(ctx)
    if children is None:
        return
    if not all((c.get("status") or {}).get("phase") for c in children):
        return
    ctx.kube.delete_configmap(ctx.namespace, naming.configmap_name(ctx.name))
    names = [c["metadata"]["name"] for c in children]
    message = f"split into {names[0]} and {names[1]}; this shard keeps no pod and owns no key groups"
    ctx.write(
        {
            "conditions": [
                ctx.cond(st.PROGRESSING, False, "Split", message),
                ctx.cond(st.READY, False, "Split", message),
                ctx.cond(st.DEGRADED, False, "Healthy", ""),
            ]
        },
        phase=P.SPLIT,
    )
    ctx.emit(ctx.shard, "Normal", "Split", message)


def _keep_split(ctx: ShardContext) -> None:
    """Split (terminal): no pod; a new split request (a new generation) is refused."""
    _remove_own_pod(ctx)
    if ctx.generation != ctx.status.get("observedGeneration"):
        decision = planner.plan_split(
            shard=ctx.name, key_groups=ctx.key_groups, phase=P.SPLIT, split=ctx.shard["spec"].get("split")
        )
        patch: dict[str, Any] = {"observedGeneration": ctx.generation}
        if isinstance(decision, planner.SplitRefused):
            patch["conditions"] = [ctx.cond(st.SPLIT_REJECTED, True, "InvalidSplitRequest", decision.message)]
            ctx.emit(ctx.shard, "Warning", "SplitRejected", decision.message)
        ctx.write(patch)


def _stop(ctx: ShardContext) -> None:
    """The Task is gone or being deleted: stop the pod and mark the shard Stopped (terminal)."""
    if ctx.phase in (P.STOPPED, P.SPLIT):
        _remove_own_pod(ctx) if ctx.phase == P.SPLIT else None
        return
    if ctx.pod.exists and not ctx.pod.deleting:
        ctx.kube.delete_pod(ctx.namespace, ctx.pod.name)  # graceful: SIGTERM stops at a batch boundary
    if ctx.phase in (P.PENDING, P.RUNNING, P.FAILED):
        ctx.write(
            {"conditions": [ctx.cond(st.READY, False, "Stopped", f"Task {ctx.task_name} is being deleted")]},
            phase=P.STOPPED,
        )
