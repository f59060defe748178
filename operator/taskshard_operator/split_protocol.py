"""The operator's side of a split: accepting, handing over and aborting, one protocol step per pass.

Each phase is written to ``status`` *before* the step it names is acted on; a crash anywhere leaves a phase from
which the next pass continues, and every action is idempotent. The phases are drawn once, in
:mod:`taskshard_operator.phases`; the sequence with what each side writes is in ``docs/split-protocol.md``.

- Step 1, Running: a valid ``spec.split`` is accepted by writing ``phase: SplitRequested`` and ``status.split``
  (the point: ``at``, the midpoint, with ``by: load`` where the load map of the last five minutes divides in
  half, or with ``by: state`` where the last state map (state rows per key group at a committed batch) does, with
  the expected shares; :mod:`taskshard_operator.split_points`) in one patch (nothing else is touched yet).
  Crash after: the next pass finds SplitRequested.
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
Draining before the parent's pod exited drained): SplitRequested | Draining -> AbortingSplit -> Pending (undone), or
-> Drained (the parent handed over first).

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

The runtime's side is :mod:`spark_runtime.handover`; the names both sides use are :mod:`spark_runtime.protocol`.
The pass that calls these steps is :func:`taskshard_operator.reconcile_shard.decide_shard`.
"""

from __future__ import annotations

from typing import Any

import kopf

from spark_runtime.keygroups import KeyGroupRange
from taskshard_operator import builders, naming, planner
from taskshard_operator import status as st
from taskshard_operator.act import Create, Delete, Event
from taskshard_operator.handover import await_drain, drained_status, show_stall, split_waits
from taskshard_operator.models.shard import ShardPhase, SplitBy
from taskshard_operator.models.task import SPLIT_STALL_SECONDS
from taskshard_operator.shard_context import ShardContext, create_pod, remove_own_pod

P = ShardPhase

__all__ = [
    "keep_split",
    "split_children_of",
    "observe_split_request",
    "step_abort",
    "step_await_drain",
    "step_create_children",
    "step_finish_split",
    "step_request_drain",
]


# ---------------------------------------------------------------- step 1: the request (Running)


def observe_split_request(ctx: ShardContext) -> bool:
    """Step A: ``spec.split``, once per generation, decided before any pod action (a refusal changes nothing).
    True when the pass ends here."""
    if ctx.generation == ctx.status.get("observedGeneration"):
        return False
    split = ctx.shard["spec"].get("split")
    starting = ctx.phase == P.PENDING and planner.split_requested(split)
    load, load_seconds = _load_map(ctx)
    state, state_batch = _state_map(ctx)
    decision = planner.plan_split(
        shard=ctx.name,
        key_groups=ctx.key_groups,
        phase=P.RUNNING if starting else ctx.phase,
        split={**split, "by": "midpoint"} if starting else split,  # a starting shard's point is chosen once it runs
        load=load,
        load_seconds=load_seconds,
        state=state,
        state_batch=state_batch,
    )
    if starting and isinstance(decision, planner.SplitAccepted):
        split_waits(ctx, "the shard is not running yet; the split starts once it runs")
        return False  # a valid request of a starting shard waits (an invalid one is refused at once, below)
    if isinstance(decision, planner.SplitAccepted):
        low, high = planner.child_names(ctx.task_name, decision.children, ctx.family)
        accepted, why = _accepted_split(decision, load_seconds)
        message = f"split accepted at key group {decision.at}: {ctx.name} -> {low} + {high}{why}"
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


def _accepted_split(decision: planner.SplitAccepted, load_seconds: float) -> tuple[dict[str, Any], str]:
    """``status.split`` of an accepted split, and what the event adds about its point (by state or by load)."""
    accepted: dict[str, Any] = {"at": decision.at, "acceptedTime": st.now()}
    if decision.load is None:
        return accepted, ""
    shares = [round(s, 4) for s in decision.load.shares]
    rows = int(decision.load.rows)
    if decision.by == SplitBy.STATE:
        accepted.update(by="state", expectedShares=shares, stateRows=rows, stateBatch=decision.state_batch)
        return accepted, (
            f" (by state: {shares[0]:.0%} / {shares[1]:.0%} of {rows} state rows at batch {decision.state_batch})"
        )
    accepted.update(by="load", expectedShares=shares, windowRows=rows, windowSeconds=int(load_seconds))
    since = f" in the last {load_seconds:.0f} s" if load_seconds else " since its pod started"
    return accepted, f" (by load: {shares[0]:.0%} / {shares[1]:.0%} of {rows} input rows{since})"


def _load_map(ctx: ShardContext) -> tuple[dict[tuple[int, int], float] | None, float]:
    """The shard's input rows per key-group bucket over the load window, from the last scrape of its running pod
    (``taskshard_operator.live``), and the seconds they cover; None when it exports no load map."""
    scraped = ctx.observed.live(ctx.namespace, ctx.name)
    if scraped is None or not scraped.stats.key_group_rows or scraped.pod_ip != ctx.pod.pod_ip:
        return None, 0.0
    return dict(scraped.load), scraped.load_seconds


def _state_map(ctx: ShardContext) -> tuple[dict[tuple[int, int], float] | None, int | None]:
    """The shard's state rows per key-group bucket and the committed batch they were counted at, from the last
    scrape of its running pod (``taskshard_operator.live``); (None, None) when it exports no state map."""
    scraped = ctx.observed.live(ctx.namespace, ctx.name)
    if scraped is None or scraped.state is None or scraped.pod_ip != ctx.pod.pod_ip:
        return None, None
    return scraped.state, scraped.state_batch


# ---------------------------------------------------------------- steps 2-5


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
    return planner.child_names(ctx.task_name, ctx.key_groups.split(int(ctx.status["split"]["at"])), ctx.family)


def split_children_of(task: str, parent: dict[str, Any]) -> list[str]:
    """The children's names of ``parent``'s accepted split (``status.split.at``), lower first; [] without one."""
    at = ((parent.get("status") or {}).get("split") or {}).get("at")
    if at is None:
        return []
    kg = parent["spec"]["keyGroups"]
    family = (parent["metadata"].get("labels") or {}).get(naming.LABEL_FAMILY)
    return planner.child_names(task, KeyGroupRange(kg["start"], kg["end"]).split(int(at)), family)


def step_request_drain(ctx: ShardContext) -> None:
    """Step 2: SplitRequested -> (create the children) -> Draining. The parent's pod keeps processing; the
    children and the parent's runtime hand over through storage (``spark_runtime.handover``)."""
    if _split_request_changed(ctx):
        return
    names = _ensure_children(ctx)
    if names is None:
        return  # a name collision (reported); the parent keeps processing until it is resolved
    if not ctx.pod.exists:
        create_pod(ctx, restarts_base=int(ctx.status.get("restarts") or 0))
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


def step_await_drain(ctx: ShardContext) -> None:
    """Step 3: Draining -> Drained once the container exited 0 with a manifest (a child deleted meanwhile is
    created again: it resumes its catch-up from its storage); a split accepted longer ago than the Task's bound
    shows Degraded reason SplitStalled (:func:`_stall_check`)."""
    if _split_request_changed(ctx) or _ensure_children(ctx) is None:
        return
    await_drain(ctx, lambda term: _record_drained(ctx, term))
    if ctx.pod.terminated is None or not ctx.pod.terminated.drained:
        _stall_check(ctx)


def _stall_check(ctx: ShardContext) -> None:
    """Degraded=True reason SplitStalled (and one Warning event) once the split was accepted longer ago than
    ``spec.handover.splitStallSeconds`` and the parent has not drained, naming what it waits for (each child's
    state, the parent's) and the way out (withdraw the split: the parent keeps its range); else a pass when the
    bound passes. A saturated parent whose children never catch up would otherwise stay Draining for ever."""
    bound = ctx.spec.handover.split_stall_seconds if ctx.spec and ctx.spec.handover else SPLIT_STALL_SECONDS
    show_stall(
        ctx,
        (ctx.status.get("split") or {}).get("acceptedTime"),
        bound,
        st.SPLIT_STALLED,
        lambda elapsed: (
            f"the split was accepted {elapsed:.0f}s ago (bound {bound}s) and {ctx.name} has not "
            f"drained: {_waits_for(ctx)}"
        ),
    )


def _waits_for(ctx: ShardContext) -> str:
    """What a Draining parent waits for: each child not yet ready to take over, in its own words (its Ready
    condition, or its driver pod's state), then the parent's pod and the way out."""
    parts = []
    for child in _split_children(ctx):
        shard = ctx.observed.shard(ctx.namespace, child)
        ready = st.get_condition(((shard or {}).get("status") or {}).get("conditions"), st.READY) or {}
        pod = ctx.observed.pod(ctx.namespace, child)
        state = "no pod" if not pod.exists else (pod.waiting_reason or pod.phase or "starting")
        said = f"{ready.get('reason')}: {st.truncate(str(ready.get('message') or ''), 200)}" if ready else "no status"
        parts.append(f"child {child} ({said}; its driver pod: {state})")
    pod = ctx.pod
    state = "no pod" if not pod.exists else (pod.waiting_reason or pod.phase or "starting")
    lag = (ctx.status.get("live") or {}).get("lagSeconds")
    parts.append(f"the parent's driver pod: {state}" + (f", lag {lag}s" if lag is not None else ""))
    parts.append(
        f'withdraw it with kubectl patch taskshard {ctx.name} --type=merge -p \'{{"spec":{{"split":null}}}}\' '
        "(the parent keeps its range) while it has not drained"
    )
    return "; ".join(parts)


def _record_drained(ctx: ShardContext, term: st.Termination, *, note: str = "") -> None:
    """Draining (or AbortingSplit, too late) -> Drained: the parent's runtime ended its final drain."""
    patch, message = drained_status(ctx, term, note=note)
    ctx.write(patch, phase=P.DRAINED)
    ctx.event("Normal" if not note else "Warning", "Drained" if not note else "SplitAbortTooLate", message)


def _ensure_children(ctx: ShardContext) -> list[str] | None:
    """Both children's names (lower first), creating those the cache does not show; None after reporting a name
    collision (a TaskShard of a child's name that is not this shard's child)."""
    task, spec, task_hash = ctx.task, ctx.spec, ctx.task_hash
    assert task is not None and spec is not None and task_hash is not None  # a step runs for a live, valid Task
    at = int(ctx.status["split"]["at"])
    manifest = builders.drain_summary_uri(ctx.task_name, spec, ctx.name)
    names = []
    for r in ctx.key_groups.split(at):
        body = builders.build_shard(
            ctx.task_name,
            r,
            template_hash=task_hash,
            restore_from={"parent": ctx.name, "manifest": manifest},
            family=ctx.family,
        )
        name = body["metadata"]["name"]
        existing = ctx.observed.shard(ctx.namespace, name)
        if existing is None:
            kopf.adopt(body, owner=task)  # type: ignore[arg-type]  # kopf types owner as its Body; a dict works
            note = f"created child {name}; it restores from {ctx.name} once drained"
            ctx.do(Create(naming.SHARD_PLURAL, body, announce=Event("Normal", "ChildCreated", note)))
        elif (existing["spec"].get("restoreFrom") or {}).get("parent") != ctx.name:
            message = f"cannot create child {name}: a TaskShard of that name exists and is not a child of {ctx.name}"
            ctx.write({"conditions": [ctx.cond(st.DEGRADED, True, "ChildNameTaken", message)]})
            ctx.event("Warning", "ChildNameTaken", message)
            return None
        names.append(name)
    return names


def step_create_children(ctx: ShardContext) -> None:
    """Step 4: Drained -> (delete the stopped pod, create both children) -> ChildrenCreated."""
    _split_request_changed(ctx)  # withdrawn now: too late, said once
    if ctx.pod.exists and ctx.pod.terminated is None and ctx.pod.phase not in ("Succeeded", "Failed"):
        return  # defensive: never create children while the parent's container could still run
    remove_own_pod(ctx)
    names = _ensure_children(ctx)
    if names is None:
        return
    lineage = {**(ctx.status.get("lineage") or {}), "children": names}
    message = f"children {names[0]} and {names[1]} restore from {ctx.status['finalCheckpoint']['manifest']}"
    ctx.write(
        {"lineage": lineage, "pod": None, "conditions": [ctx.cond(st.PROGRESSING, True, "ChildrenCreated", message)]},
        phase=P.CHILDREN_CREATED,
    )


def step_finish_split(ctx: ShardContext) -> None:
    """Step 5: ChildrenCreated -> Split once both children were seen by their reconciler."""
    _split_request_changed(ctx)
    remove_own_pod(ctx)
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


def keep_split(ctx: ShardContext) -> None:
    """Split (terminal): no pod; a new split request (a new generation) is refused."""
    remove_own_pod(ctx)
    if ctx.generation != ctx.status.get("observedGeneration"):
        decision = planner.plan_split(
            shard=ctx.name, key_groups=ctx.key_groups, phase=P.SPLIT, split=ctx.shard["spec"].get("split")
        )
        patch: dict[str, Any] = {"observedGeneration": ctx.generation}
        if isinstance(decision, planner.SplitRefused):
            patch["conditions"] = [ctx.cond(st.SPLIT_REJECTED, True, "InvalidSplitRequest", decision.message)]
            ctx.event("Warning", "SplitRejected", decision.message)
        ctx.write(patch)


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


def step_abort(ctx: ShardContext) -> None:
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
        assert pod.name is not None  # an existing pod has a name
        if not pod.deleting:
            ctx.do(Delete("pods", pod.name, uid=pod.uid))  # graceful: a SIGTERM stop at a batch boundary
        waiting.append(f"pod {pod.name}")
    if waiting:
        message = f"aborting the split: waiting until {', '.join(waiting)} are gone"
        ctx.write({"conditions": [ctx.cond(st.PROGRESSING, True, "AbortingSplit", message)]})
        ctx.decision.again_in(2.0)
        return
    if not pod.exists:
        create_pod(ctx, restarts_base=int(ctx.status.get("restarts") or 0), abort_split=tuple(_split_children(ctx)))
        message = f"the children are gone; {naming.pod_name(ctx.name)} undoes the split in storage"
        ctx.write(
            {"pod": naming.pod_name(ctx.name), "conditions": [ctx.cond(st.PROGRESSING, True, "AbortingSplit", message)]}
        )
        return
    if pod.deleting:
        return
    if term is not None and pod.phase in ("Failed", "Succeeded"):  # ended without an abort summary: once more
        assert pod.name is not None  # an existing pod has a name
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
    pod = ctx.pod
    assert pod.name is not None  # its pod reported the abort, so it exists and has a name
    ctx.do(Delete("pods", pod.name, uid=pod.uid, grace=0))
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
