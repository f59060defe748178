"""One pass of a TaskShard: observe -> decide -> act -> write, with ``status`` as the write-ahead log.

:func:`reconcile_shard` is level-based and idempotent. It **observes** the shard, its Task, its driver pod,
ConfigMap and executor pods (and, when the step needs them, its parent, children and siblings) from the watch-fed cache
(:mod:`taskshard_operator.cache`, no GET); :func:`decide_shard` **decides** in pure code one protocol step, as a
:class:`~taskshard_operator.act.Decision` (actions, one status patch, events, when to look again); and
:func:`~taskshard_operator.act.carry_out` **acts**, then **writes** status once, conditional on the version the
decision was made from. Passes are serialised per shard by the work queue (``workqueue.py``).

The split protocol's steps (accept, hand over, abort) are :mod:`taskshard_operator.split_protocol` (its docstring
is the state diagram); a pass dispatches to them by phase (:data:`STEPS`).

A pod is never created for a range another shard owns (:func:`taskshard_operator.planner.range_conflicts`). A
stale cache can only delay a step: the status write is conditional, so a decision made from an old version writes
nothing.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import ValidationError

from spark_runtime.config import parse_config
from spark_runtime.live import METRICS_PORT
from spark_runtime.protocol import SummaryEvent
from taskshard_operator import builders, cache, executors, naming, planner
from taskshard_operator import status as st
from taskshard_operator.act import (
    CRASH_AFTER_PHASE_ENV,
    ApplyConfigMap,
    Backoff,
    Decision,
    Delete,
    Emit,
    Patch,
    carry_out,
)
from taskshard_operator.cache import Observed
from taskshard_operator.handover import Standing, finalizers, successor_standing, sync_handover_finalizer
from taskshard_operator.kube import Kube
from taskshard_operator.live import shard_live_patch
from taskshard_operator.merge_protocol import (
    claimed_waits,
    keep_merged,
    merge_abort_step,
    merged_parents_waiting,
    observe_merge_partner,
    observe_merge_request,
    step_aborting_merge,
    step_create_merged,
    step_merging,
)
from taskshard_operator.models.shard import ShardPhase
from taskshard_operator.models.task import NO_PROGRESS_SECONDS
from taskshard_operator.phases import parse_phase
from taskshard_operator.shard_context import ShardContext, create_pod, ended_live, remove_own_pod
from taskshard_operator.split_protocol import (
    keep_split,
    observe_split_request,
    split_children_of,
    split_waits,
    step_abort,
    step_await_drain,
    step_create_children,
    step_finish_split,
    step_request_drain,
)
from taskshard_operator.views import shard_views

P = ShardPhase

__all__ = [
    "CRASH_AFTER_PHASE_ENV",
    "Emit",
    "PodReplacementBackoff",
    "decide_shard",
    "reconcile_shard",
    "validate_shard_config",
]

METRICS_UNREACHABLE_SECONDS = 180.0
"""A running driver whose metrics endpoint has not answered for this long (since it started, or since its last
answer) is MetricsUnreachable: Ready=False, Degraded=True (a fresh JVM answers within a minute; three scrape
intervals without an answer already make its last answer stale)."""
STABLE_SECONDS = 60.0
"""A driver container that ran this long resets the pod replacement back-off."""


@dataclass
class PodReplacementBackoff:
    """In-memory back-off for replacing a shard's pod: ``base * 2**(n-1)`` capped at ``cap`` seconds, counted per
    template: the replacements of one template back off, and the first pod of a new template (a roll, the user's
    fix of a failing shard) starts at once, whatever the back-off of the template before.

    Lost on operator restart on purpose (a restarted operator retries at once); ``status.restarts`` persists.
    """

    base: float = 2.0
    cap: float = 60.0
    _state: dict[str, tuple[str | None, int, float]] = field(default_factory=dict)
    """Per key (a shard's uid): the template its replacements were counted for, how many, and when the next may
    go (monotonic seconds)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ready(self, key: str, template: str | None = None) -> float:
        """Seconds still to wait before the next replacement of ``template`` (0 = go)."""
        with self._lock:
            counted, _, not_before = self._state.get(key, (None, 0, 0.0))
        if template is not None and counted != template:
            return 0.0
        return max(0.0, not_before - time.monotonic())

    def record(self, key: str, template: str | None = None) -> float:
        with self._lock:
            counted, n, _ = self._state.get(key, (template, 0, 0.0))
            n = n if counted == template else 0
            delay = min(self.cap, self.base * 2**n)
            self._state[key] = (template, n + 1, time.monotonic() + delay)
            return delay

    def reset(self, key: str) -> None:
        with self._lock:
            self._state.pop(key, None)


def validate_shard_config(config: dict[str, Any]) -> None:
    """Validate ``shard.json`` with the runtime's own parser (``spark_runtime.config``, imports no pyspark).

    Raises ``ValueError`` (``ConfigError``) listing every bad field as ``<path>: <value> is invalid: ...``.
    """
    parse_config(config, "the shard config built by the operator")


# ---------------------------------------------------------------- the decision being built


# ---------------------------------------------------------------- observe -> decide -> act


def reconcile_shard(
    kube: Kube, observed: Observed, namespace: str, name: str, *, emit: Emit, backoff: PodReplacementBackoff
):
    """One pass for the TaskShard ``namespace/name`` (see the module docstring). Returns seconds until the shard
    wants another pass (a back-off expiring), or None."""
    decision = decide_shard(observed, namespace, name, backoff_wait=backoff.ready)
    if decision is None:
        return None
    return carry_out(kube, observed, decision, emit=emit, backoff=backoff)


def decide_shard(
    observed: Observed, namespace: str, name: str, *, backoff_wait=lambda uid, template=None: 0.0
) -> Decision | None:
    """The pure part of a pass: what to do for the shard, from the cache alone. None: nothing (shard gone).
    ``backoff_wait(uid, template)``: the seconds a replacement pod of that template still waits."""
    shard = observed.shard(namespace, name)
    if shard is None:
        return None
    if shard["metadata"].get("deletionTimestamp") and naming.HANDOVER_FINALIZER not in finalizers(shard):
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
        backoff_wait=0.0,
        decision=Decision(naming.SHARD_PLURAL, shard),
    )
    _sync_active_label(ctx)
    task_alive = task is not None and not task["metadata"].get("deletionTimestamp")
    sync_handover_finalizer(ctx, want=task_alive and ctx.phase.handing_over)
    if not task_alive:
        _stop(ctx)
        _mirror_executors(ctx)
        return ctx.decision
    parsed = observed.task_spec(task)
    if parsed.error is not None:
        message = f"Task {task_name} has an invalid spec, the shard waits for a fix: {first_error(parsed.error)}"
        ctx.write({"conditions": [ctx.cond(st.DEGRADED, True, "InvalidTaskSpec", message)]})
        return ctx.decision
    ctx.spec, ctx.task_hash = parsed.spec, parsed.template_hash
    ctx.backoff_wait = backoff_wait(ctx.uid, ctx.template_hash)
    STEPS[ctx.phase](ctx)
    _mirror_live(ctx)
    _mirror_executors(ctx)
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


NO_EXECUTOR_PHASES = frozenset(
    {P.DRAINED, P.CHILDREN_CREATED, P.SPLIT, P.MERGED, P.STOPPED, P.SUSPENDED, P.ABORTING_SPLIT}
)
"""Phases in which the shard keeps no driver that runs executors (ended, handed over, suspended, or a pod that only
undoes a split): no ``status.executors`` and no ExecutorsReady condition."""


def _mirror_executors(ctx: ShardContext) -> None:
    """``status.executors`` and the ExecutorsReady condition from the executor pods the watch shows
    (:func:`taskshard_operator.executors.summarize`), in this pass's one status write; only what changed is written.

    Only for a Task with executors (``spec.spark.executors.instances > 0``) and a shard that keeps a driver; else
    both are removed (executors turned off, or the shard stopped, split or was suspended). A Warning event
    ExecutorsPending is posted when the condition's message changes to a new problem, never on every pass."""
    requested = builders.executor_instances(ctx.spec) if ctx.spec is not None else 0
    if requested <= 0 or ctx.phase in NO_EXECUTOR_PHASES:
        _drop_executors(ctx)
        return
    pod = ctx.pod
    driver_running = pod.running and not pod.deleting and not pod.aborts_split
    summary = executors.summarize(
        requested, ctx.observed.executors(ctx.namespace, ctx.name), driver_running=driver_running
    )
    ctx.write(
        {
            "executors": summary.status,
            "conditions": [ctx.cond(st.EXECUTORS_READY, summary.ready, summary.reason, summary.message)],
        }
    )
    if summary.reason == executors.EXECUTORS_PENDING:
        shown = st.get_condition((ctx.shard.get("status") or {}).get("conditions"), st.EXECUTORS_READY)
        if shown is None or (shown.get("reason"), shown.get("message")) != (summary.reason, summary.message):
            ctx.event("Warning", executors.EXECUTORS_PENDING, summary.message)


def _drop_executors(ctx: ShardContext) -> None:
    """Remove ``status.executors`` and the ExecutorsReady condition when the observed status has them."""
    observed = ctx.shard.get("status") or {}
    if observed.get("executors") is not None:
        ctx.write({"executors": None})
    conditions = ctx.status.get("conditions") or []
    if st.get_condition(conditions, st.EXECUTORS_READY) is None:
        return
    kept = [c for c in conditions if c.get("type") != st.EXECUTORS_READY]
    if st.conditions_equal(kept, observed.get("conditions")):
        ctx.decision.status.pop("conditions", None)
    else:
        ctx.decision.status["conditions"] = kept  # a merge patch replaces the whole list


def _sync_active_label(ctx: ShardContext) -> None:
    """``taskshard.io/active``: "false" once the shard's phase is terminal (Split, Stopped), else "true" (patched
    only when it differs)."""
    want = "false" if ctx.phase.terminal else "true"
    if (ctx.shard["metadata"].get("labels") or {}).get(naming.LABEL_ACTIVE) != want:
        ctx.do(Patch(naming.SHARD_PLURAL, ctx.name, {"metadata": {"labels": {naming.LABEL_ACTIVE: want}}}))


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
    if observe_merge_partner(ctx):  # a merge accepted by the left neighbour goes on, even while suspended
        return
    if merge_abort_step(ctx):  # a merged shard whose merge is being withdrawn: its pod fences it
        return
    if ctx.spec.suspend and not _standby_parent(ctx):
        _suspend(ctx)
        return
    merge = observe_merge_request(ctx)
    if merge:
        return
    if merge is not None:  # (a waiting merge, None, leaves the generation unobserved: spec.split is not requested)
        claim = claimed_waits(ctx)
        if claim is not None:  # one hand-over per shard: a neighbour's merge claims this one
            split_waits(ctx, f"{claim.describe()}; the split starts once that merge has ended or was withdrawn")
        elif observe_split_request(ctx):
            return
    if not _ensure_config(ctx):
        return
    if _replace_orcreate_pod(ctx):
        return
    _mirror_pod(ctx)


def _base_patch(ctx: ShardContext) -> dict[str, Any]:
    patch: dict[str, Any] = {"pod": naming.pod_name(ctx.name)}
    if ctx.restore_from and ctx.status.get("lineage") is None:
        patch["lineage"] = {"parent": ctx.restore_from["parent"]}
    if ctx.merge_from and ctx.status.get("lineage") is None:
        patch["lineage"] = {"parents": [p["parent"] for p in ctx.merge_from]}
    return patch


def _keep_phase(ctx: ShardContext) -> ShardPhase:
    """The phase while a pod is not running yet: Failed stays Failed, anything else is Pending."""
    return P.FAILED if ctx.phase == P.FAILED else P.PENDING


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
        merge_from=ctx.merge_from,
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


def _replace_orcreate_pod(ctx: ShardContext) -> bool:
    """Step C: a missing pod is created (a replacement waits for the back-off), an ended one is deleted (to be
    replaced), a pod of another template is restarted. Never for a range another shard owns (a stray or
    overlapping TaskShard): those key groups would be processed twice. True when the pass ends here."""
    pod = ctx.pod
    if not pod.exists:
        if _refuse_unnamed(ctx) or _refuse_overlap(ctx):
            return True
        replacement = ctx.status.get("pod") is not None
        restarts = int(ctx.status.get("restarts") or 0) + (1 if replacement else 0)
        if replacement and ctx.backoff_wait > 0:
            message = f"replacing the pod in {ctx.backoff_wait:.0f}s"
            ctx.write({"conditions": [ctx.cond(st.PROGRESSING, True, "BackOff", message)]}, phase=_keep_phase(ctx))
            ctx.decision.again_in(ctx.backoff_wait)
            return True
        if replacement:
            ctx.do(Backoff(ctx.uid, template=ctx.template_hash))
        create_pod(ctx, restarts_base=restarts)
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
        if pod.template_hash == ctx.template_hash and _hold_refused_pod(ctx):
            return True
        _replace_ended_pod(ctx)
        return True
    if pod.template_hash != ctx.template_hash:
        # A failing shard's pod emits nothing: it is stopped at once (no SIGTERM savepoint of a batch that fails
        # anyway; the recovery log is the restart point, as after a crash), whatever its crash-loop back-off, and
        # the shard stays Failed until the new pod commits (_mirror_recovering_pod): a fix that fails too never
        # flaps it to Running. A healthy one stops gracefully, at a batch boundary.
        message = (
            f"template changed ({pod.template_hash} -> {ctx.template_hash}); restarting {pod.name} from its checkpoint"
        )
        failing = ctx.phase == P.FAILED
        ctx.do(Delete("pods", pod.name, uid=pod.uid if failing else None, grace=0 if failing else None))
        ctx.write(
            {**_base_patch(ctx), "conditions": [ctx.cond(st.PROGRESSING, True, "RollingRestart", message)]},
            phase=_keep_phase(ctx),
        )
        ctx.event("Normal", "RollingRestart", message)
        return True
    return False


def _checkpoint_patch(ctx: ShardContext) -> dict[str, Any]:
    term = ctx.pod.terminated or ctx.pod.last_terminated
    checkpoint = term.checkpoint(with_manifest=False) if term is not None else None
    return {"lastCheckpoint": checkpoint, **ended_live(ctx, checkpoint)} if checkpoint else {}


def _hold_refused_pod(ctx: ShardContext) -> bool:
    """A pod whose runtime refused its template (exit 0, event ``refused``, e.g. ``StateSchemaIncompatible``) is kept,
    not replaced: the same template would refuse again. The shard shows the reason until the Task's template
    changes (a roll then replaces the pod). True when the pod was refused."""
    pod = ctx.pod
    term = pod.terminated or pod.last_terminated
    refused = term.refused if term is not None else None
    if refused is None:
        return False
    failure = term.failure
    assert failure is not None
    reason = failure.condition_reason("TemplateRefused")
    message = (
        f"pod {pod.name} refused template {pod.template_hash} before processing anything: {failure.text}; the shard "
        "stays stopped with its state until the Task's template changes"
    )
    announce = not _degraded_shows(ctx, reason, failure.text)
    ctx.write(
        {
            **_base_patch(ctx),
            "conditions": [
                ctx.cond(st.READY, False, reason, message),
                ctx.cond(st.DEGRADED, True, reason, message),
                ctx.cond(st.PROGRESSING, False, reason, "waiting for a template change"),
            ],
        },
        phase=P.FAILED,
    )
    if announce:
        ctx.event("Warning", reason, message)
    return True


def _replace_ended_pod(ctx: ShardContext) -> None:
    """A pod that ended (Failed, or exited 0 outside a split) is replaced: last-state restart."""
    pod = ctx.pod
    term = pod.terminated or pod.last_terminated
    why = "failed" if pod.phase == "Failed" else "exited outside a split"
    if pod.ended_reason:  # the kubelet's, e.g. Evicted: "Usage of EmptyDir volume "tmp" exceeds the limit ..."
        why = f"was {pod.ended_reason.lower()}" + (f": {pod.ended_message}" if pod.ended_message else "")
    failure = term.failure if term is not None else None
    if failure is not None:
        why += f", last exit code {term.exit_code}: {failure.text}"
    elif term is not None and term.drained:
        why += f" after a final drain at batch {term.batch_id}"
    elif term is not None and term.summary is not None and term.summary.event == SummaryEvent.STOPPED:
        why += f" after a SIGTERM stop at batch {term.batch_id} (the new pod resumes from the recovery log)"
    ended = f"Pod{pod.ended_reason}" if pod.ended_reason and pod.ended_reason.isalnum() else "PodEnded"
    reason = failure.condition_reason(ended) if failure is not None else ended
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
            f"once {'parents' if ctx.merge_from else 'parent'} {standby_parent} "
            f"{'have' if ctx.merge_from else 'has'} finished draining"
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
        _mirror_running_pod(ctx)
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


def _mirror_running_pod(ctx: ShardContext) -> None:
    """The pod runs (not on standby): Running, Ready once it emits; a pod that replaced a failed one is recovering
    until it commits a batch or runs :data:`STABLE_SECONDS` (it then also resets the replacement back-off)."""
    pod = ctx.pod
    running_for = pod.running_for()
    if running_for >= STABLE_SECONDS:
        ctx.do(Backoff(ctx.uid, reset=True))
    else:
        ctx.decision.again_in(STABLE_SECONDS - running_for + 1)
    if ctx.phase == P.FAILED and running_for < STABLE_SECONDS and not _committed_since_start(ctx):
        _mirror_recovering_pod(ctx)
        return
    stalled = _no_progress(ctx)
    unreachable = _metrics_unreachable(ctx) if stalled is None else None
    degraded = ctx.cond(st.DEGRADED, False, "Healthy", "")
    if stalled is not None:
        ready = ctx.cond(st.READY, False, st.NO_PROGRESS, stalled)
        degraded = ctx.cond(st.DEGRADED, True, st.NO_PROGRESS, stalled)
    elif unreachable is not None:
        ready = ctx.cond(st.READY, False, st.METRICS_UNREACHABLE, unreachable)
        degraded = ctx.cond(st.DEGRADED, True, st.METRICS_UNREACHABLE, unreachable)
    elif pod.ready:
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
                degraded,
            ],
        },
        phase=P.RUNNING,
    )


def _no_progress(ctx: ShardContext) -> str | None:
    """Why the running driver shows no progress (its batch in flight has run ``spec.noProgressSeconds`` or more
    without committing, by a fresh scrape of this pod), else None; a batch in flight that may reach the bound
    gets a pass when it would."""
    pod = ctx.pod
    scraped = ctx.observed.live(ctx.namespace, ctx.name)
    if scraped is None or scraped.stale or scraped.pod_ip != pod.pod_ip:
        return None
    limit = ctx.spec.no_progress_seconds if ctx.spec is not None else NO_PROGRESS_SECONDS
    if scraped.stats.heartbeat is not None:
        quiet = time.time() - scraped.stats.heartbeat
        if quiet >= limit:
            return (
                f"the runtime's poll loop in driver pod {pod.name} has not run for {_minutes(quiet)} while its "
                f"metrics endpoint answers (spec.noProgressSeconds {limit}): blocked in a storage call or a hung "
                f"driver thread; its liveness probe restarts it after {naming.LIVENESS_STALE_MINUTES} min; see the "
                "pod's log"
            )
        ctx.decision.again_in(limit - quiet + 1)
    running = scraped.stats.batch_running
    if running <= 0:
        return None
    if running < limit:
        ctx.decision.again_in(limit - running + 1)
        return None
    return (
        f"driver pod {pod.name} has run its current batch for {_minutes(running)} without committing it (after "
        f"batch {scraped.stats.batch_id}; spec.noProgressSeconds {limit}): a hung batch, a source it cannot read, "
        "or a processor that does not return; see the pod's log"
    )


def _metrics_unreachable(ctx: ShardContext) -> str | None:
    """Why the running driver counts as unreachable: the operator scrapes live metrics, yet this pod has not
    answered for :data:`METRICS_UNREACHABLE_SECONDS` since it started (or since its last answer); else None. A
    driver that stops answering must not stay Ready on its readiness file alone."""
    pod = ctx.pod
    if not ctx.observed.scraping():
        return None
    scraped = ctx.observed.live(ctx.namespace, ctx.name)
    if scraped is not None and not scraped.stale and scraped.pod_ip == pod.pod_ip:
        return None
    own = scraped is not None and scraped.pod_ip == pod.pod_ip
    silent = min(pod.running_for(), time.monotonic() - scraped.scraped_at) if own else pod.running_for()
    if silent < METRICS_UNREACHABLE_SECONDS:
        ctx.decision.again_in(METRICS_UNREACHABLE_SECONDS - silent + 1)
        return None
    since = f"since its last answer at {scraped.observed_at}" if own else "since it started"
    return (
        f"driver pod {pod.name} has not answered on its metrics endpoint (http://{pod.pod_ip}:{METRICS_PORT}"
        f"/metrics) for {_minutes(silent)} {since}: a driver that stopped answering, or a network policy that keeps "
        "the operator out; its status.live and the autoscaler's signal are stale"
    )


def _minutes(seconds: float) -> str:
    """A duration for a condition message, in whole minutes from one minute on (so it changes rarely)."""
    return f"{int(seconds)} s" if seconds < 60 else f"over {int(seconds // 60)} min"


def _committed_since_start(ctx: ShardContext) -> bool:
    """The running driver's live metrics (of this pod) show a batch committed after its container started."""
    pod = ctx.pod
    scraped = ctx.observed.live(ctx.namespace, ctx.name)
    if scraped is None or scraped.pod_ip != pod.pod_ip or scraped.stats.batch_time is None:
        return False
    return scraped.stats.batch_time >= time.time() - pod.running_for()


def _mirror_recovering_pod(ctx: ShardContext) -> None:
    """A pod that replaced a failed one is not healthy yet: the shard stays Failed and Degraded (with the failure's
    message) until the pod has committed a batch or run :data:`STABLE_SECONDS`, so a shard that keeps failing never
    flaps to Running (and its Task to Ready) with each restart."""
    pod = ctx.pod
    message = (
        f"driver pod {pod.name} replaced a failed one (restarts {pod.restarts}); the shard counts as healthy once it "
        f"commits a batch or has run {STABLE_SECONDS:.0f} s"
    )
    ctx.write(
        {
            **_base_patch(ctx),
            "restarts": pod.restarts,
            "conditions": [ctx.cond(st.READY, False, "Recovering", message)],
        },
        phase=P.FAILED,
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
    (a split only moves forward), so this holds in any phase, also after a failed restore rehearsal. For a merged
    shard: both parents' names until both drained."""
    waiting = merged_parents_waiting(ctx)
    if waiting:
        return " and ".join(waiting)
    if not ctx.restore_from:
        return None
    parent = ctx.observed.shard(ctx.namespace, ctx.restore_from["parent"])
    if parent is None:
        return None
    if parse_phase((parent.get("status") or {}).get("phase")).holds_range_for_children:
        return ctx.restore_from["parent"]
    return None


def _refuse_unnamed(ctx: ShardContext) -> bool:
    """True (and status says why) when this shard restores from parents that do not name it as their successor
    (:func:`taskshard_operator.handover.successor_standing`): a TaskShard made by hand that names a running shard
    in ``restoreFrom``/``mergeFrom`` gets no pod (``NotAChild``), so it cannot make that shard hand over; a
    successor of a hand-over accepted a moment ago waits until the parent's next step names it."""
    parents = [ctx.restore_from["parent"]] if ctx.restore_from else [p["parent"] for p in ctx.merge_from or []]
    if not parents:
        return False
    standing, why = successor_standing(
        ctx.shard,
        {name: ctx.observed.shard(ctx.namespace, name) for name in parents},
        split_children=lambda parent: split_children_of(ctx.task_name, parent),
    )
    if standing == Standing.NAMED:
        return False
    if standing == Standing.SOON:
        ctx.write({"conditions": [ctx.cond(st.READY, False, "PodStarting", why)]}, phase=_keep_phase(ctx))
        ctx.decision.again_in(2.0)
        return True
    message = f"not starting: {why}; delete this TaskShard (kubectl delete taskshard {ctx.name})"
    if not _degraded_shows(ctx, "NotAChild", why):
        ctx.event("Warning", "NotAChild", message)
    ctx.write(
        {
            "conditions": [
                ctx.cond(st.READY, False, "NotAChild", message),
                ctx.cond(st.DEGRADED, True, "NotAChild", message),
            ]
        },
        phase=_keep_phase(ctx),
    )
    return True


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
    split_waits(ctx, "the Task is suspended; the split starts once spec.suspend is false and the shard runs")


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


# ---------------------------------------------------------------- aborting a split


def _stop(ctx: ShardContext) -> None:
    """The Task is gone or being deleted: stop the pod and mark the shard Stopped (terminal)."""
    if ctx.phase in (P.SPLIT, P.MERGED):
        remove_own_pod(ctx)
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


# The dispatch, one step function per phase (the machine is drawn once, in taskshard_operator.phases).
STEPS = {
    P.PENDING: _reconcile_active,
    P.RUNNING: _reconcile_active,
    P.FAILED: _reconcile_active,
    P.SPLIT_REQUESTED: step_request_drain,
    P.DRAINING: step_await_drain,
    P.DRAINED: step_create_children,
    P.CHILDREN_CREATED: step_finish_split,
    P.ABORTING_SPLIT: step_abort,
    P.SPLIT: keep_split,
    P.MERGE_REQUESTED: step_create_merged,
    P.MERGING: step_merging,
    P.ABORTING_MERGE: step_aborting_merge,
    P.MERGED: keep_merged,
    P.STOPPED: _nothing,
    P.SUSPENDED: _keep_suspended,
}
"""The dispatch: one step function per phase (see the protocol above)."""
