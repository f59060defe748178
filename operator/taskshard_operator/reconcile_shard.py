"""One pass of a TaskShard: observe -> decide -> act -> write, with ``status`` as the write-ahead log.

:func:`reconcile_shard` is level-based and idempotent. It **observes** the shard, its Task, its driver pod and
ConfigMap (and, when the step needs them, its parent, children and siblings) from the watch-fed cache
(:mod:`taskshard_operator.cache`, no GET); :func:`decide_shard` **decides** in pure code one protocol step, as a
:class:`~taskshard_operator.act.Decision` (actions, one status patch, events, when to look again); and
:func:`~taskshard_operator.act.carry_out` **acts**, then **writes** status once, conditional on the version the
decision was made from. Passes are serialised per shard by the work queue (``workqueue.py``).

The split protocol (each phase is written to ``status`` *before* the step it names is acted on; a crash anywhere
leaves a phase from which the next pass continues, and every action is idempotent)::

    Running ──valid spec.split──> SplitRequested ──children created──> Draining
      (write status.split.at,        (children warm up and catch up       │ the runtime stopped by itself:
       nothing else)                  while the parent keeps processing)  ▼ exit 0 with a drain summary
                                                                       Drained (status.finalCheckpoint)
    Split <──both children seen── ChildrenCreated <──parent pod deleted, children exist──┘
    (terminal; no pod, no ConfigMap)   (the children own the halves from here)

- Step 1, Running: a valid ``spec.split`` is accepted by writing ``phase: SplitRequested`` and ``status.split.at``
  in one patch (nothing else is touched yet). Crash after: the next pass finds SplitRequested.
- Step 2, SplitRequested: create both children (deterministic names ``<task>-<start>-<at>`` and
  ``<task>-<at>-<end>``, owned by the Task, ``spec.restoreFrom.manifest`` = the parent's drain summary
  ``drained.json``; 409 = created before; a missing parent pod is recreated), then write ``Draining`` with
  ``status.lineage.children``. Crash between: both are done again. The operator never annotates the parent's
  pod: the children warm up and catch up while the parent keeps processing and emitting, and parent and
  children hand over through storage only (``spark_runtime.handover``). The parent's runtime stops by itself at
  a batch boundary once both children wrote their ready notes, and writes its drain summary. The children's
  phase stays Pending (Ready=False, reason Standby) while the parent owns the range.
- Step 3, Draining: wait for the driver container to exit 0 with a termination message naming the drain
  summary's snapshot manifest and batch id; write ``Drained`` with ``status.finalCheckpoint``. A pod that crashes
  during the hand-over is restarted in place by ``restartPolicy: OnFailure``, restores from its recovery log and
  continues the hand-over; a deleted pod is recreated (without any annotation) and does the same. Crash: the
  terminated container status is still there to read.
- Step 4, Drained: delete the parent's stopped pod, make sure both children exist, and write
  ``ChildrenCreated``: from now on the children own the halves (and show Running once their pods run).
- Step 5, ChildrenCreated: once both children exist and have been seen by their reconciler (``status.phase``
  set), write ``Split``. The parent keeps no pod and no ConfigMap.

Aborting (the request withdrawn: ``spec.split.requested: false`` or ``spec.split`` removed, in SplitRequested or
Draining before the parent's pod exited drained)::

    SplitRequested | Draining ──withdrawn──> AbortingSplit ──children and parent pod gone, then the parent's pod
                                                │            run with --abort-split reports "aborted"──> Pending
                                                └──the parent's pod reports "drained" (it handed over first)──> Drained

- AbortingSplit: delete both children (TaskShards; their pods and ConfigMaps follow by owner reference) and
  stop the parent's pod (SIGTERM: a stop at a batch boundary, resumable). Once all of them are gone, create the
  parent's pod with ``--abort-split <children>``: it claims the parent's next writer epoch, and unless the drain
  summary exists it fences each child (claims the child's next epoch) and clears the child's directory and the
  parent's ``handover/``, then exits 0 with an ``aborted`` summary; the operator deletes that pod and writes
  Pending (``status.split`` and ``lineage.children`` removed), and the next pass starts the shard's pod as
  before. Crash anywhere: every action is repeated harmlessly (the abort is idempotent in storage).
- A new ``spec.split`` point during a split is refused (SplitRejected, reason SplitInProgress); a withdrawal
  from Drained on is too late (reason SplitAbortTooLate): the split completes.
- While any split phase lasts, the shard carries the finalizer ``taskshard.io/split``: ``kubectl delete`` of it
  waits until the split finished (or was undone), so its children never wait for a parent that is gone.

No key group's output is ever emitted by two shards: a child builds state while its parent runs but emits
nothing for input at or before the parent's final positions, which the parent's drain summary names; the parent
writes that summary as the last step of a final drain, after stopping its query; a final drain is sticky (a
restarted parent pod re-reports it and never processes again). A pod is never created for a
range another shard owns (:func:`taskshard_operator.planner.range_conflicts`). A stale cache can only delay a
step: the status write is conditional, so a decision made from an old version writes nothing.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import ValidationError

from spark_runtime.config import parse_config
from spark_runtime.keygroups import KeyGroupRange
from taskshard_operator import builders, cache, naming, planner
from taskshard_operator import status as st
from taskshard_operator.act import (
    CRASH_AFTER_PHASE_ENV,
    ApplyConfigMap,
    Create,
    Decision,
    Delete,
    Emit,
    Event,
    Patch,
    carry_out,
)
from taskshard_operator.act import Backoff as BackoffAction
from taskshard_operator.cache import Observed
from taskshard_operator.kube import Kube
from taskshard_operator.live import shard_live_patch
from taskshard_operator.live import utc_now as live_utc_now
from taskshard_operator.models.shard import ShardPhase
from taskshard_operator.models.task import TaskSpec
from taskshard_operator.phases import check_transition, parse_phase
from taskshard_operator.views import shard_views

P = ShardPhase

__all__ = ["CRASH_AFTER_PHASE_ENV", "Backoff", "Emit", "decide_shard", "reconcile_shard", "validate_shard_config"]

STABLE_SECONDS = 60.0
"""A driver container that ran this long resets the pod replacement back-off."""


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


SHARD_LOG_FORMAT = os.environ.get("TASKSHARD_LOG_FORMAT", "plain")
"""The shard runtimes' log format: the operator's own ``--log-format`` (``__main__`` sets the variable)."""


def validate_shard_config(config: dict[str, Any]) -> None:
    """Validate ``shard.json`` with the runtime's own parser (``spark_runtime.config``, imports no pyspark).

    Raises ``ValueError`` (``ConfigError``) listing every bad field as ``<path>: <value> is invalid: ...``.
    """
    parse_config(config, "the shard config built by the operator")


# ---------------------------------------------------------------- the decision being built


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


# ---------------------------------------------------------------- observe -> decide -> act


def reconcile_shard(kube: Kube, observed: Observed, namespace: str, name: str, *, emit: Emit, backoff: Backoff):
    """One pass for the TaskShard ``namespace/name`` (see the module docstring). Returns seconds until the shard
    wants another pass (a back-off expiring), or None."""
    decision = decide_shard(observed, namespace, name, backoff_wait=backoff.ready)
    if decision is None:
        return None
    return carry_out(kube, observed, decision, emit=emit, backoff=backoff)


def decide_shard(observed: Observed, namespace: str, name: str, *, backoff_wait=lambda uid: 0.0) -> Decision | None:
    """The pure part of a pass: what to do for the shard, from the cache alone. None: nothing (shard gone)."""
    shard = observed.shard(namespace, name)
    if shard is None:
        return None
    if shard["metadata"].get("deletionTimestamp") and naming.SPLIT_FINALIZER not in _finalizers(shard):
        return None  # deleted (a shard being deleted mid-split goes on until its split finished or was undone)
    task_name = shard["spec"]["taskRef"]["name"]
    task = observed.task(namespace, task_name)
    ctx = ShardContext(
        observed=observed,
        namespace=namespace,
        shard=shard,
        task=task,
        spec=None,
        task_hash=None,
        pod=observed.pod(namespace, name),
        backoff_wait=backoff_wait(shard["metadata"].get("uid", name)),
        decision=Decision(naming.SHARD_PLURAL, shard),
    )
    _sync_active_label(ctx)
    task_alive = task is not None and not task["metadata"].get("deletionTimestamp")
    _sync_split_finalizer(ctx, want=task_alive and ctx.phase.splitting)
    if not task_alive:
        _stop(ctx)
        return ctx.decision
    parsed = observed.task_spec(task)
    if parsed.error is not None:
        message = f"Task {task_name} has an invalid spec, the shard waits for a fix: {first_error(parsed.error)}"
        ctx.write({"conditions": [ctx.cond(st.DEGRADED, True, "InvalidTaskSpec", message)]})
        return ctx.decision
    ctx.spec, ctx.task_hash = parsed.spec, parsed.template_hash
    STEPS[ctx.phase](ctx)
    _mirror_live(ctx)
    return ctx.decision


def _mirror_live(ctx: ShardContext) -> None:
    """``status.live`` (RATE, LAG, LAST BATCH) from the last scrape of the running driver's metrics endpoint
    (``taskshard_operator.live``), in this pass's one status write; only when the scrape says something new."""
    if not ctx.pod.running or ctx.pod.deleting:
        return
    scraped = ctx.observed.live(ctx.namespace, ctx.name)
    if scraped is None or scraped.pod_ip != ctx.pod.pod_ip:  # none yet, or of a pod this one replaced
        return
    live = shard_live_patch(ctx.status.get("live"), scraped)
    if live is not None:
        ctx.write({"live": live})


def _sync_active_label(ctx: ShardContext) -> None:
    """``taskshard.io/active``: "false" once the shard's phase is terminal (Split, Stopped), else "true" (patched
    only when it differs)."""
    want = "false" if ctx.phase.terminal else "true"
    if (ctx.shard["metadata"].get("labels") or {}).get(naming.LABEL_ACTIVE) != want:
        ctx.do(Patch(naming.SHARD_PLURAL, ctx.name, {"metadata": {"labels": {naming.LABEL_ACTIVE: want}}}))


def _finalizers(obj: dict[str, Any]) -> list[str]:
    return list(obj["metadata"].get("finalizers") or [])


def _sync_split_finalizer(ctx: ShardContext, *, want: bool) -> None:
    """``taskshard.io/split`` on the shard while a split of it is in progress (and its Task lives): a deletion then
    waits until the split finished or was undone, so children never wait for a parent that is gone. Patched only
    when it differs, conditional on the observed version; never added to a shard being deleted (the API refuses
    that, and a shard deleted before its split started has no children to strand)."""
    have = _finalizers(ctx.shard)
    if want == (naming.SPLIT_FINALIZER in have) or (want and ctx.shard["metadata"].get("deletionTimestamp")):
        return
    wanted = [*have, naming.SPLIT_FINALIZER] if want else [f for f in have if f != naming.SPLIT_FINALIZER]
    version = ctx.shard["metadata"].get("resourceVersion")
    ctx.do(Patch(naming.SHARD_PLURAL, ctx.name, {"metadata": {"finalizers": wanted, "resourceVersion": version}}))


def first_error(e: ValidationError) -> str:
    """The first validation error as ``spec.<field>: <message>``."""
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    return f"spec.{loc}: {err.get('msg')}" if loc else str(err.get("msg"))


# ---------------------------------------------------------------- Pending / Running / Failed


def _reconcile_active(ctx: ShardContext) -> None:
    """Pending, Running, Failed: the split request first, then the config, the pod, and the pod's state mirrored
    (while the Task is suspended: stop instead, except a split child whose parent is still handing over: the parent
    stops only once both children are ready, so they run until it has handed the range over)."""
    if ctx.spec.suspend and not _standby_parent(ctx):
        _suspend(ctx)
        return
    if _observe_split_request(ctx):
        return
    if not _ensure_config(ctx):
        return
    if _replace_or_create_pod(ctx):
        return
    _mirror_pod(ctx)


def _base_patch(ctx: ShardContext) -> dict[str, Any]:
    patch: dict[str, Any] = {"pod": naming.pod_name(ctx.name)}
    if ctx.restore_from and ctx.status.get("lineage") is None:
        patch["lineage"] = {"parent": ctx.restore_from["parent"]}
    return patch


def _keep_phase(ctx: ShardContext) -> ShardPhase:
    """The phase while a pod is not running yet: Failed stays Failed, anything else is Pending."""
    return P.FAILED if ctx.phase == P.FAILED else P.PENDING


def _observe_split_request(ctx: ShardContext) -> bool:
    """Step A: ``spec.split``, once per generation, decided before any pod action (a refusal changes nothing).
    True when the pass ends here."""
    if ctx.generation == ctx.status.get("observedGeneration"):
        return False
    split = ctx.shard["spec"].get("split")
    starting = ctx.phase == P.PENDING and planner.split_requested(split)
    load, load_seconds = _load_map(ctx)
    decision = planner.plan_split(
        shard=ctx.name,
        key_groups=ctx.key_groups,
        phase=P.RUNNING if starting else ctx.phase,
        split={**split, "by": "midpoint"} if starting else split,  # a starting shard's point is chosen once it runs
        load=load,
        load_seconds=load_seconds,
    )
    if starting and isinstance(decision, planner.SplitAccepted):
        _split_waits(ctx, "the shard is not running yet; the split starts once it runs")
        return False  # a valid request of a starting shard waits (an invalid one is refused at once, below)
    if isinstance(decision, planner.SplitAccepted):
        low, high = planner.child_names(ctx.task_name, decision.children)
        message = f"split accepted at key group {decision.at}: {ctx.name} -> {low} + {high}"
        accepted: dict[str, Any] = {"at": decision.at, "acceptedTime": st.now()}
        if decision.load is not None:
            shares = [round(s, 4) for s in decision.load.shares]
            accepted.update(
                by="load",
                expectedShares=shares,
                windowRows=int(decision.load.rows),
                windowSeconds=int(load_seconds),
            )
            message += (
                f" (by load: {shares[0]:.0%} / {shares[1]:.0%} of {int(decision.load.rows)} input rows"
                f"{f' in the last {load_seconds:.0f} s' if load_seconds else ' since its pod started'})"
            )
        ctx.write(
            {
                "observedGeneration": ctx.generation,
                "split": accepted,
                "conditions": [
                    ctx.cond(st.PROGRESSING, True, "SplitRequested", message),
                    ctx.cond(st.SPLIT_REJECTED, False, "Accepted", message),
                ],
            },
            phase=P.SPLIT_REQUESTED,
        )
        ctx.event("Normal", "SplitAccepted", message)
        return True
    if isinstance(decision, planner.SplitRefused):
        ctx.write(
            {
                "observedGeneration": ctx.generation,
                "conditions": [ctx.cond(st.SPLIT_REJECTED, True, "InvalidSplitRequest", decision.message)],
            }
        )
        ctx.event("Warning", "SplitRejected", decision.message)
        return True
    ctx.write({"observedGeneration": ctx.generation})
    return False


def _load_map(ctx: ShardContext) -> tuple[dict[tuple[int, int], float] | None, float]:
    """The shard's input rows per key-group bucket over the load window, from the last scrape of its running pod
    (``taskshard_operator.live``), and the seconds they cover; None when it exports no load map."""
    scraped = ctx.observed.live(ctx.namespace, ctx.name)
    if scraped is None or not scraped.stats.key_group_rows or scraped.pod_ip != ctx.pod.pod_ip:
        return None, 0.0
    return dict(scraped.load), scraped.load_seconds


def _ensure_config(ctx: ShardContext) -> bool:
    """Step B: the ConfigMap, applied only when its content differs from the cached one. False (and Degraded)
    when the config is invalid.

    An existing ConfigMap is replaced only once the shard was told to run the Task's current template (the roll
    reached it), so a not-yet-rolled shard whose container restarts in place keeps its old config. The config
    carries the last batch seen committed (``expectedBatch``): a recovery log that ends before it is refused.
    """
    annotations = ctx.shard["metadata"].get("annotations") or {}
    config = builders.build_shard_config(
        task=ctx.task_name,
        namespace=ctx.namespace,
        shard=ctx.name,
        key_groups=ctx.key_groups,
        spec=ctx.spec,
        restore_from=ctx.restore_from,
        task_created=(ctx.task or {}).get("metadata", {}).get("creationTimestamp"),
        task_uid=(ctx.task or {}).get("metadata", {}).get("uid"),
        expected_batch=(ctx.shard.get("status") or {}).get("lastCheckpoint", {}).get("batchId"),
        allow_fresh_start=annotations.get(naming.ANNOTATION_ALLOW_FRESH_START) == "true",
    )
    cm = builders.build_configmap(
        task=ctx.task_name, shard=ctx.name, key_groups=ctx.key_groups, config=config, spec=ctx.spec
    )
    have = ctx.observed.configmap_digest(ctx.namespace, ctx.name)
    if have == cache.data_digest(cm["data"]):
        return True  # exactly this config is applied (and was validated before it was)
    try:
        validate_shard_config(config)
    except ValueError as e:
        message = f"the shard runtime config built from Task {ctx.task_name} is invalid: {e}"
        ctx.write({"conditions": [ctx.cond(st.DEGRADED, True, "InvalidShardConfig", message)]})
        return False
    if have is None or ctx.template_hash == ctx.task_hash:
        kopf.adopt(cm, owner=ctx.shard)
        ctx.do(ApplyConfigMap(cm, exists=have is not None))
    return True


def _create_pod(ctx: ShardContext, *, restarts_base: int, abort_split: tuple[str, ...] = ()) -> None:
    if builders.executor_instances(ctx.spec) > 0 and not abort_split:
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
    )
    kopf.adopt(pod, owner=ctx.shard)
    name = pod["metadata"]["name"]
    what = "pod" if not abort_split else "pod to undo the split"
    ctx.do(Create("pods", pod, announce=Event("Normal", "PodCreated", f"created driver {what} {name}")))


def _replace_or_create_pod(ctx: ShardContext) -> bool:
    """Step C: a missing pod is created (a replacement waits for the back-off), an ended one is deleted (to be
    replaced), a pod of another template is restarted. Never for a range another shard owns (a stray or
    overlapping TaskShard): those key groups would be processed twice. True when the pass ends here."""
    pod = ctx.pod
    if not pod.exists:
        if _refuse_overlap(ctx):
            return True
        replacement = ctx.status.get("pod") is not None
        restarts = int(ctx.status.get("restarts") or 0) + (1 if replacement else 0)
        if replacement and ctx.backoff_wait > 0:
            message = f"replacing the pod in {ctx.backoff_wait:.0f}s"
            ctx.write({"conditions": [ctx.cond(st.PROGRESSING, True, "BackOff", message)]}, phase=_keep_phase(ctx))
            ctx.decision.again_in(ctx.backoff_wait)
            return True
        if replacement:
            ctx.do(BackoffAction(ctx.uid))
        _create_pod(ctx, restarts_base=restarts)
        ctx.write(
            {
                **_base_patch(ctx),
                "restarts": restarts,
                "conditions": [
                    # what the next pass mirrors from the new pod, so that pass has nothing to write
                    ctx.cond(st.READY, False, "PodStarting", f"driver pod {naming.pod_name(ctx.name)} is Pending"),
                    ctx.cond(st.PROGRESSING, True, "PodStarting", "driver pod created, waiting for it to run"),
                ],
            },
            phase=_keep_phase(ctx),
        )
        return True
    if pod.deleting:
        message = f"pod {pod.name} is terminating"
        ctx.write({"conditions": [ctx.cond(st.READY, False, "PodTerminating", message)]}, phase=_keep_phase(ctx))
        return True
    if pod.phase in ("Failed", "Succeeded"):
        _replace_ended_pod(ctx)
        return True
    if pod.template_hash != ctx.template_hash:
        message = (
            f"template changed ({pod.template_hash} -> {ctx.template_hash}); restarting {pod.name} from its checkpoint"
        )
        ctx.do(BackoffAction(ctx.uid, reset=True))
        ctx.do(Delete("pods", pod.name))
        ctx.write(
            {**_base_patch(ctx), "conditions": [ctx.cond(st.PROGRESSING, True, "RollingRestart", message)]},
            phase=P.PENDING,
        )
        ctx.event("Normal", "RollingRestart", message)
        return True
    return False


def _checkpoint_patch(ctx: ShardContext) -> dict[str, Any]:
    term = ctx.pod.terminated or ctx.pod.last_terminated
    checkpoint = term.checkpoint(with_manifest=False) if term is not None else None
    return {"lastCheckpoint": checkpoint, **_ended_live(ctx, checkpoint)} if checkpoint else {}


def _ended_live(ctx: ShardContext, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """``status.live`` of a shard whose driver ended with a summary: its last batch as reported at exit (the last
    scrape may be a few batches older), no rate, no lag."""
    live = {k: v for k, v in (ctx.status.get("live") or {}).items() if k not in ("lag", "lagUnit", "batchTime")}
    live.update(batchId=checkpoint["batchId"], rate=0.0, emitting=False, observedAt=live_utc_now())
    if checkpoint.get("time"):
        live["batchTime"] = checkpoint["time"]
    return {"live": live}


def _replace_ended_pod(ctx: ShardContext) -> None:
    """A pod that ended (Failed, or exited 0 outside a split) is replaced: last-state restart."""
    pod = ctx.pod
    term = pod.terminated or pod.last_terminated
    why = "failed" if pod.phase == "Failed" else "exited outside a split"
    failure = term.failure if term is not None else None
    if failure is not None:
        why += f", last exit code {term.exit_code}: {failure.text}"
    elif term is not None and term.drained:
        why += f" after a final drain at batch {term.batch_id}"
    elif term is not None and (term.message or {}).get("event") == "stopped":
        why += f" after a SIGTERM stop at batch {term.batch_id} (the new pod resumes from the recovery log)"
    reason = failure.condition_reason("PodEnded") if failure is not None else "PodEnded"
    announce = failure is None or not _degraded_shows(ctx, reason, failure.text)
    ctx.do(Delete("pods", pod.name, uid=pod.uid, grace=0))
    ctx.write(
        {
            **_base_patch(ctx),
            **_checkpoint_patch(ctx),
            "restarts": pod.restarts,
            "conditions": [
                ctx.cond(st.READY, False, reason, f"pod {pod.name} {why}; replacing it"),
                ctx.cond(st.DEGRADED, True, reason, f"pod {pod.name} {why}; replacing it (last-state restart)"),
            ],
        },
        phase=P.FAILED,
    )
    if announce:
        ctx.event("Warning", reason, f"pod {pod.name} {why}; replacing it")


def _mirror_pod(ctx: ShardContext) -> None:
    """Step D: the pod exists and is this template's: its state goes into status (standby, running, failed or
    starting)."""
    pod = ctx.pod
    standby_parent = _standby_parent(ctx) if pod.running else None
    if standby_parent:
        message = (
            f"standby: driver pod {pod.name} is started and warm; it restores its slice and starts processing "
            f"once parent {standby_parent} has finished draining"
        )
        ctx.write(
            {
                **_base_patch(ctx),
                "restarts": pod.restarts,
                "conditions": [
                    ctx.cond(st.READY, False, "Standby", message),
                    ctx.cond(st.PROGRESSING, True, "Standby", message),
                    ctx.cond(st.DEGRADED, False, "Healthy", ""),
                ],
            },
            phase=P.PENDING,
        )
    elif pod.running:
        running_for = pod.running_for()
        if running_for >= STABLE_SECONDS:
            ctx.do(BackoffAction(ctx.uid, reset=True))
        else:
            ctx.decision.again_in(STABLE_SECONDS - running_for + 1)
        if pod.ready:
            ready = ctx.cond(st.READY, True, "Emitting", f"driver pod {pod.name} processes {ctx.key_groups}")
        else:
            ready = ctx.cond(
                st.READY,
                False,
                "NotEmittingYet",
                f"driver pod {pod.name} runs {ctx.key_groups} and has not written to the sink yet (starting its "
                "query, restoring, or catching up with its parent's final positions)",
            )
        ctx.write(
            {
                **_base_patch(ctx),
                **_checkpoint_patch(ctx),
                "restarts": pod.restarts,
                "conditions": [
                    ready,
                    ctx.cond(st.PROGRESSING, False, "Stable", ""),
                    ctx.cond(st.DEGRADED, False, "Healthy", ""),
                ],
            },
            phase=P.RUNNING,
        )
    elif pod.failed:
        _mirror_failed_pod(ctx)
    elif not _missing_secret(ctx):
        message = f"driver pod {pod.name} is {pod.phase}"
        if pod.waiting_reason:
            detail = f": {st.truncate(pod.waiting_message)}" if pod.waiting_message else ""
            message += f" ({pod.waiting_reason}{detail})"
        ctx.write(
            {**_base_patch(ctx), "conditions": [ctx.cond(st.READY, False, "PodStarting", message)]},
            phase=P.FAILED if ctx.phase == P.FAILED else (P.PENDING if ctx.phase == P.PENDING else P.RUNNING),
        )


def _mirror_failed_pod(ctx: ShardContext) -> None:
    pod = ctx.pod
    term = pod.terminated or pod.last_terminated
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
        message = f"driver pod {pod.name} is {state} (restarts {pod.restarts}); the kubelet restarts it with back-off"
        if term is not None:
            message += f", last exit code {term.exit_code}"
        event, announce = "PodFailed", ctx.phase != P.FAILED
    ctx.write(
        {
            **_base_patch(ctx),
            **_checkpoint_patch(ctx),
            "restarts": pod.restarts,
            "conditions": [ctx.cond(st.READY, False, reason, message), ctx.cond(st.DEGRADED, True, reason, message)],
        },
        phase=P.FAILED,
    )
    if announce:
        ctx.event("Warning", event, message)


def _missing_secret(ctx: ShardContext) -> bool:
    """The pod waits for a missing credentials Secret: say so (once as an event). True when that is the case."""
    pod = ctx.pod
    s3 = ctx.spec.storage.s3
    secret = s3.credentials_secret if s3 is not None else None
    if secret is None or not pod.missing_secret(secret):
        return False
    message = (
        f"driver pod {pod.name} cannot start: Secret {secret!r} (spec.storage.s3.credentialsSecret) does not "
        f"exist in namespace {ctx.namespace} or lacks key {' or '.join(builders.S3_CREDENTIAL_KEYS)}; "
        f"the pod starts once it does (kubelet: {st.truncate(pod.waiting_message or '')})"
    )
    announce = not _degraded_shows(ctx, "SecretMissing", message)
    ctx.write(
        {
            **_base_patch(ctx),
            "conditions": [
                ctx.cond(st.READY, False, "SecretMissing", message),
                ctx.cond(st.DEGRADED, True, "SecretMissing", message),
            ],
        },
        phase=P.FAILED if ctx.phase == P.FAILED else (P.PENDING if ctx.phase == P.PENDING else P.RUNNING),
    )
    if announce:
        ctx.event("Warning", "SecretMissing", message)
    return True


def _standby_parent(ctx: ShardContext) -> str | None:
    """For a split child: its parent's name while the parent owns the range (the split is between
    SplitRequested and Drained), else None. A child cannot have run before its parent handed the range over
    (a split only moves forward), so this holds in any phase, also after a failed restore rehearsal."""
    if not ctx.restore_from:
        return None
    parent = ctx.observed.shard(ctx.namespace, ctx.restore_from["parent"])
    if parent is None:
        return None
    if parse_phase((parent.get("status") or {}).get("phase")).holds_range_for_children:
        return ctx.restore_from["parent"]
    return None


def _refuse_overlap(ctx: ShardContext) -> bool:
    """True (and status says why) when another shard of the Task owns key groups of this shard's range, so no pod
    may start for it (:func:`taskshard_operator.planner.range_conflicts`). Checked only before creating a pod."""
    views = shard_views(ctx.observed, ctx.namespace, ctx.task_name)
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
        ctx.event("Warning", "RangeOverlap", message)
    ctx.write(
        {
            "conditions": [
                ctx.cond(st.READY, False, "RangeOverlap", message),
                ctx.cond(st.DEGRADED, True, "RangeOverlap", message),
            ]
        },
        phase=_keep_phase(ctx),
    )
    return True


def _degraded_shows(ctx: ShardContext, reason: str, text: str) -> bool:
    """Status already shows this problem: Degraded is True with ``reason`` and its message contains ``text``.

    Decides whether a Warning event is posted: once per distinct error, not on every resync or crash-loop restart.
    """
    degraded = st.get_condition((ctx.shard.get("status") or {}).get("conditions"), st.DEGRADED)
    return (
        degraded is not None
        and degraded.get("status") == "True"
        and degraded.get("reason") == reason
        and text in (degraded.get("message") or "")
    )


# ---------------------------------------------------------------- suspend and resume


def _suspend(ctx: ShardContext) -> None:
    """The Task is suspended: delete the pod gracefully (SIGTERM: the runtime stops at a batch boundary and writes
    a savepoint), then write Suspended once the pod is gone. A split request waits."""
    pod = ctx.pod
    if pod.exists:
        if not pod.deleting:
            ctx.do(Delete("pods", pod.name))
        message = f"suspending: driver pod {pod.name} stops at a batch boundary and writes a savepoint"
        ctx.write(
            {
                "conditions": [
                    ctx.cond(st.READY, False, "Suspending", message),
                    ctx.cond(st.PROGRESSING, True, "Suspending", message),
                ]
            }
        )
    else:
        message = "suspended (Task spec.suspend: true): no pod; spec.suspend: false resumes from the recovery log"
        ctx.write(
            {
                "pod": None,
                "conditions": [
                    ctx.cond(st.READY, False, "Suspended", message),
                    ctx.cond(st.PROGRESSING, False, "Suspended", message),
                    ctx.cond(st.DEGRADED, False, "Healthy", ""),
                ],
            },
            phase=P.SUSPENDED,
        )
        if ctx.phase != parse_phase((ctx.shard.get("status") or {}).get("phase")):
            ctx.event("Normal", "Suspended", message)
    _split_waits(ctx, "the Task is suspended; the split starts once spec.suspend is false and the shard runs")


def _split_waits(ctx: ShardContext, why: str) -> None:
    """A split requested while the Task is suspended, or before the shard runs, is not taken yet (its generation
    stays unobserved) and says so: condition SplitRejected=False reason SplitWaiting, and one event."""
    if ctx.generation == ctx.status.get("observedGeneration") or not planner.split_requested(
        ctx.shard["spec"].get("split")
    ):
        return
    message = f"spec.split of {ctx.name} waits: {why}"
    shown = st.get_condition((ctx.shard.get("status") or {}).get("conditions"), st.SPLIT_REJECTED) or {}
    if shown.get("reason") != "SplitWaiting" or shown.get("message") != message:
        ctx.event("Normal", "SplitWaiting", message)
    ctx.write({"conditions": [ctx.cond(st.SPLIT_REJECTED, False, "SplitWaiting", message)]})


def _keep_suspended(ctx: ShardContext) -> None:
    """Suspended: no pod while the Task is suspended; resumed -> Pending, and the pod is created in the same pass
    (its runtime restores from the recovery log)."""
    if ctx.spec.suspend:
        _suspend(ctx)
        return
    message = "resuming: the driver pod restores from the recovery log"
    ctx.write({"conditions": [ctx.cond(st.PROGRESSING, True, "Resuming", message)]}, phase=P.PENDING)
    ctx.event("Normal", "Resuming", message)
    _reconcile_active(ctx)


# ---------------------------------------------------------------- split steps


def _split_request_changed(ctx: ShardContext) -> bool:
    """A new generation of ``spec.split`` during a split (:func:`planner.plan_split_change`). Withdrawn while
    SplitRequested or Draining (and the parent has not drained): AbortingSplit, and the pass ends here (True).
    Withdrawn later: too late, said once. Another split point: refused. The split in progress goes on."""
    if ctx.generation == ctx.status.get("observedGeneration"):
        return False
    change = planner.plan_split_change(
        shard=ctx.name,
        phase=ctx.phase,
        accepted_at=int(ctx.status["split"]["at"]),
        split=ctx.shard["spec"].get("split"),
    )
    if isinstance(change, planner.SplitUnchanged):
        ctx.write({"observedGeneration": ctx.generation})
        return False
    if isinstance(change, planner.SplitWithdrawn):
        drained = ctx.pod.terminated is not None and ctx.pod.terminated.drained
        if ctx.phase in (P.SPLIT_REQUESTED, P.DRAINING) and not drained:
            _begin_abort(ctx)
            return True
        message = (
            f"spec.split withdrawn too late: {ctx.name} has handed its range over to its children (phase "
            f"{ctx.phase.value}); the split completes"
        )
        reason = "SplitAbortTooLate"
    else:
        message, reason = change.message, "SplitInProgress"
    ctx.write(
        {"observedGeneration": ctx.generation, "conditions": [ctx.cond(st.SPLIT_REJECTED, True, reason, message)]}
    )
    ctx.event("Warning", reason, message)
    return False


def _split_children(ctx: ShardContext) -> list[str]:
    """The children's names of the split in progress (from ``status.split.at``), lower first."""
    return planner.child_names(ctx.task_name, ctx.key_groups.split(int(ctx.status["split"]["at"])))


def _step_request_drain(ctx: ShardContext) -> None:
    """Step 2: SplitRequested -> (create the children) -> Draining. The parent's pod keeps processing; the
    children and the parent's runtime hand over through storage (``spark_runtime.handover``)."""
    if _split_request_changed(ctx):
        return
    names = _ensure_children(ctx)
    if names is None:
        return  # a name collision (reported); the parent keeps processing until it is resolved
    if not ctx.pod.exists:
        _create_pod(ctx, restarts_base=int(ctx.status.get("restarts") or 0))
    message = (
        f"children {names[0]} and {names[1]} are catching up while {ctx.name} keeps processing; it stops at a "
        "batch boundary once both are ready"
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
    ctx.event("Normal", "Draining", message)


def _step_await_drain(ctx: ShardContext) -> None:
    """Step 3: Draining -> Drained once the container exited 0 with a manifest (a child deleted meanwhile is
    created again: it resumes its catch-up from its storage)."""
    if _split_request_changed(ctx) or _ensure_children(ctx) is None:
        return
    pod = ctx.pod
    if not pod.exists:
        _create_pod(ctx, restarts_base=int(ctx.status.get("restarts") or 0) + 1)
        return
    if pod.deleting:
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
        _record_drained(ctx, term)
        return
    if term.exit_code == 0 or pod.phase in ("Failed", "Succeeded"):
        # Ended without a snapshot manifest: nothing to restore from; run the drain again from the recovery log.
        message = (
            f"driver pod {pod.name} ended (exit code {term.exit_code}) without a snapshot manifest in its "
            f"termination message {term.message!r}; recreating it to drain again"
        )
        ctx.do(Delete("pods", pod.name, grace=0))
        ctx.write({"conditions": [ctx.cond(st.DEGRADED, True, "DrainWithoutManifest", message)]})
        ctx.event("Warning", "DrainWithoutManifest", message)


def _record_drained(ctx: ShardContext, term: st.Termination, *, note: str = "") -> None:
    """Draining (or AbortingSplit, too late) -> Drained: the parent's runtime ended its final drain."""
    final = term.checkpoint(with_manifest=True) or {"manifest": term.manifest}
    final.setdefault("batchId", 0)
    message = f"drained at batch {final['batchId']}; snapshot manifest {term.manifest}{note}"
    ctx.write(
        {
            "finalCheckpoint": final,
            "lastCheckpoint": final,
            **_ended_live(ctx, final),
            "restarts": ctx.pod.restarts,
            "conditions": [
                ctx.cond(st.PROGRESSING, True, "Drained", message),
                ctx.cond(st.DEGRADED, False, "Healthy", ""),
            ],
        },
        phase=P.DRAINED,
    )
    ctx.event("Normal" if not note else "Warning", "Drained" if not note else "SplitAbortTooLate", message)


# ---------------------------------------------------------------- aborting a split


def _begin_abort(ctx: ShardContext) -> None:
    """SplitRequested | Draining -> AbortingSplit: the request was withdrawn before the hand-over."""
    low, high = _split_children(ctx)
    message = (
        f"spec.split withdrawn: aborting the split of {ctx.name} into {low} and {high}: the children are deleted, "
        f"then {naming.pod_name(ctx.name)} undoes the split in storage and {ctx.name} resumes (unless it handed "
        "over already, then the split completes)"
    )
    ctx.write(
        {
            "observedGeneration": ctx.generation,
            "conditions": [
                ctx.cond(st.PROGRESSING, True, "AbortingSplit", message),
                ctx.cond(st.READY, False, "AbortingSplit", message),
                ctx.cond(st.SPLIT_REJECTED, False, "Withdrawn", message),
            ],
        },
        phase=P.ABORTING_SPLIT,
    )
    ctx.event("Normal", "SplitAborting", message)


def _step_abort(ctx: ShardContext) -> None:
    """AbortingSplit: delete the children (their pods follow) and stop the parent's pod; once all are gone, run
    the parent's pod with ``--abort-split`` (``spark_runtime.handover.abort_split``: it fences and clears the
    children's storage and the hand-over); its ``aborted`` summary -> Pending (the shard resumes from its
    recovery log). A parent that drained before it could be stopped -> Drained: the split completes."""
    pod = ctx.pod
    term = pod.terminated if pod.exists else None
    if term is not None and term.drained:
        _record_drained(ctx, term, note=" (the split request was withdrawn too late: the split completes)")
        return
    aborted = term.aborted if term is not None and pod.aborts_split else None
    if aborted is not None:
        _finish_abort(ctx, aborted)
        return
    waiting = []
    for name in _split_children(ctx):
        child = ctx.observed.shard(ctx.namespace, name)
        if child is not None and (child["spec"].get("restoreFrom") or {}).get("parent") == ctx.name:
            if not child["metadata"].get("deletionTimestamp"):
                ctx.do(Delete(naming.SHARD_PLURAL, name, uid=child["metadata"].get("uid")))
            waiting.append(f"TaskShard {name}")
        if ctx.observed.pod(ctx.namespace, name).exists:
            waiting.append(f"pod {naming.pod_name(name)}")
    if pod.exists and not pod.aborts_split:
        if not pod.deleting:
            ctx.do(Delete("pods", pod.name, uid=pod.uid))  # graceful: a SIGTERM stop at a batch boundary
        waiting.append(f"pod {pod.name}")
    if waiting:
        message = f"aborting the split: waiting until {', '.join(waiting)} are gone"
        ctx.write({"conditions": [ctx.cond(st.PROGRESSING, True, "AbortingSplit", message)]})
        ctx.decision.again_in(2.0)
        return
    if not pod.exists:
        _create_pod(ctx, restarts_base=int(ctx.status.get("restarts") or 0), abort_split=tuple(_split_children(ctx)))
        message = f"the children are gone; {naming.pod_name(ctx.name)} undoes the split in storage"
        ctx.write(
            {"pod": naming.pod_name(ctx.name), "conditions": [ctx.cond(st.PROGRESSING, True, "AbortingSplit", message)]}
        )
        return
    if pod.deleting:
        return
    if term is not None and pod.phase in ("Failed", "Succeeded"):  # ended without an abort summary: once more
        message = f"pod {pod.name} ended (exit code {term.exit_code}) without undoing the split: {term.message!r}"
        ctx.do(Delete("pods", pod.name, uid=pod.uid, grace=0))
        ctx.write({"conditions": [ctx.cond(st.DEGRADED, True, "AbortRetry", message)]})
        ctx.event("Warning", "AbortRetry", message)
    elif pod.failed:
        message = f"pod {pod.name} failed while undoing the split ({pod.waiting_reason}); it is restarted"
        ctx.write({"conditions": [ctx.cond(st.DEGRADED, True, "AbortRetry", message)]})


def _finish_abort(ctx: ShardContext, aborted: Any) -> None:
    """AbortingSplit -> Pending: the split is undone; the next pass starts the shard's pod as before the split."""
    lineage = {k: v for k, v in (ctx.status.get("lineage") or {}).items() if k != "children"}
    message = (
        f"split aborted: children {' and '.join(aborted.children)} fenced and removed; {ctx.name} resumes from "
        f"batch {aborted.batch_id}"
    )
    ctx.do(Delete("pods", ctx.pod.name, uid=ctx.pod.uid, grace=0))
    ctx.write(
        {
            "split": None,
            "lineage": {**lineage, "children": None} if lineage else None,
            "pod": None,
            "conditions": [
                ctx.cond(st.PROGRESSING, True, "SplitAborted", message),
                ctx.cond(st.READY, False, "SplitAborted", message),
                ctx.cond(st.DEGRADED, False, "Healthy", ""),
            ],
        },
        phase=P.PENDING,
    )
    ctx.event("Normal", "SplitAborted", message)


def _ensure_children(ctx: ShardContext) -> list[str] | None:
    """Both children's names (lower first), creating those the cache does not show; None after reporting a name
    collision (a TaskShard of a child's name that is not this shard's child)."""
    at = int(ctx.status["split"]["at"])
    manifest = builders.drain_summary_uri(ctx.task_name, ctx.spec, ctx.name)
    names = []
    for r in ctx.key_groups.split(at):
        body = builders.build_shard(
            ctx.task_name, r, template_hash=ctx.task_hash, restore_from={"parent": ctx.name, "manifest": manifest}
        )
        name = body["metadata"]["name"]
        existing = ctx.observed.shard(ctx.namespace, name)
        if existing is None:
            kopf.adopt(body, owner=ctx.task)
            note = f"created child {name}; it restores from {ctx.name} once drained"
            ctx.do(Create(naming.SHARD_PLURAL, body, announce=Event("Normal", "ChildCreated", note)))
        elif (existing["spec"].get("restoreFrom") or {}).get("parent") != ctx.name:
            message = f"cannot create child {name}: a TaskShard of that name exists and is not a child of {ctx.name}"
            ctx.write({"conditions": [ctx.cond(st.DEGRADED, True, "ChildNameTaken", message)]})
            ctx.event("Warning", "ChildNameTaken", message)
            return None
        names.append(name)
    return names


def _remove_own_pod(ctx: ShardContext) -> None:
    if ctx.pod.exists and not ctx.pod.deleting:
        ctx.do(Delete("pods", ctx.pod.name, grace=0))


def _step_create_children(ctx: ShardContext) -> None:
    """Step 4: Drained -> (delete the stopped pod, create both children) -> ChildrenCreated."""
    _split_request_changed(ctx)  # withdrawn now: too late, said once
    if ctx.pod.exists and ctx.pod.terminated is None and ctx.pod.phase not in ("Succeeded", "Failed"):
        return  # defensive: never create children while the parent's container could still run
    _remove_own_pod(ctx)
    names = _ensure_children(ctx)
    if names is None:
        return
    lineage = {**(ctx.status.get("lineage") or {}), "children": names}
    message = f"children {names[0]} and {names[1]} restore from {ctx.status['finalCheckpoint']['manifest']}"
    ctx.write(
        {"lineage": lineage, "pod": None, "conditions": [ctx.cond(st.PROGRESSING, True, "ChildrenCreated", message)]},
        phase=P.CHILDREN_CREATED,
    )


def _step_finish_split(ctx: ShardContext) -> None:
    """Step 5: ChildrenCreated -> Split once both children were seen by their reconciler."""
    _split_request_changed(ctx)
    _remove_own_pod(ctx)
    names = _ensure_children(ctx)
    if names is None:
        return
    children = [ctx.observed.shard(ctx.namespace, n) for n in names]
    if not all(c is not None and (c.get("status") or {}).get("phase") for c in children):
        return
    if ctx.observed.configmap_digest(ctx.namespace, ctx.name) is not None:
        ctx.do(Delete("configmaps", naming.configmap_name(ctx.name)))
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
    ctx.event("Normal", "Split", message)


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
            ctx.event("Warning", "SplitRejected", decision.message)
        ctx.write(patch)


def _stop(ctx: ShardContext) -> None:
    """The Task is gone or being deleted: stop the pod and mark the shard Stopped (terminal)."""
    if ctx.phase == P.SPLIT:
        _remove_own_pod(ctx)
    if ctx.phase.terminal:
        return
    if ctx.pod.exists and not ctx.pod.deleting:
        ctx.do(Delete("pods", ctx.pod.name))  # graceful: SIGTERM stops at a batch boundary
    if ctx.phase in (P.PENDING, P.RUNNING, P.FAILED, P.SUSPENDED):
        ctx.write(
            {"conditions": [ctx.cond(st.READY, False, "Stopped", f"Task {ctx.task_name} is being deleted")]},
            phase=P.STOPPED,
        )


def _nothing(ctx: ShardContext) -> None:
    """Stopped: terminal, nothing to do."""


# The dispatch, one step function per phase (the protocol in the module docstring; every arrow is one pass):
#
#   Pending/Running/Failed --_reconcile_active--> (config, pod, mirror) | SplitRequested (a valid spec.split)
#                                                 | Suspended (spec.suspend, once the pod is gone)
#   SplitRequested --_step_request_drain--> Draining --_step_await_drain--> Drained
#   Drained --_step_create_children--> ChildrenCreated --_step_finish_split--> Split (_keep_split: terminal)
#   SplitRequested | Draining (spec.split withdrawn) --> AbortingSplit --_step_abort--> Pending | Drained
#   Suspended --_keep_suspended--> Pending (resumed)          Stopped: terminal
STEPS = {
    P.PENDING: _reconcile_active,
    P.RUNNING: _reconcile_active,
    P.FAILED: _reconcile_active,
    P.SPLIT_REQUESTED: _step_request_drain,
    P.DRAINING: _step_await_drain,
    P.DRAINED: _step_create_children,
    P.CHILDREN_CREATED: _step_finish_split,
    P.ABORTING_SPLIT: _step_abort,
    P.SPLIT: _keep_split,
    P.STOPPED: _nothing,
    P.SUSPENDED: _keep_suspended,
}
"""The dispatch: one step function per phase (see the protocol above)."""
