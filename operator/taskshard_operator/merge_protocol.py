"""The operator's side of a merge: two adjacent shards become one, one protocol step per pass.

The user sets ``spec.merge: {with: <right neighbour>}`` on the left shard L; R is its right neighbour and M the
merged shard. Each phase is written to ``status`` *before* the step it names is acted on; a crash anywhere leaves
a phase from which the next pass continues, and every action is idempotent. The phases are drawn once, in
:mod:`taskshard_operator.phases`; the sequence with what each side writes is in ``docs/merge.md``.

- Step 1, L Running: a valid ``spec.merge`` (:func:`taskshard_operator.planner.plan_merge`: adjacent, both
  Running, neither asking for or claimed by another hand-over) is accepted in one pass: first the **claim** on R
  (the annotation ``taskshard.io/merge-left: L``, conditional on R's resourceVersion:
  :func:`taskshard_operator.handover.claim_patch`), then ``MergeRequested`` and ``status.merge``. A right shard
  that accepted a split or merge of its own meanwhile refuses the claim (409) and the pass decides again. A
  refusal writes condition MergeRejected (and an event) and changes nothing; while either shard is starting or
  restarting (Pending, Failed), or the claim of another merge on L is being decided, the request waits instead
  (MergeRejected=False, reason MergeWaiting; looked at again every few seconds).
- Step 2, L MergeRequested: re-check R (still claimed by L, and taking part in no other hand-over), create M
  (``<task>-<start>-<end>-<family>``, owned by the Task, ``spec.mergeFrom`` = both parents' drain summaries
  ``drained.json``; 409 = created before), then write ``Merging`` with ``status.lineage.children: [M]``. M's
  pod starts at once (it is named by L's ``status.merge.into`` and by L's claim on R) and waits on standby
  (``spark_runtime.merge``): it writes its ready note into both parents' storage, and each parent's runtime
  stops by itself at its next batch boundary and writes its drain summary, naming M as its successor.
- Step 2', R (Pending/Running/Failed, claimed by L): once the cache shows M naming L and R as its parents, R
  writes ``Merging`` and its own ``status.merge``. R never decides a merge itself; it follows what L accepted,
  and accepts no split or merge of its own while claimed (such a request waits, SplitWaiting / MergeWaiting).
- Step 3, Merging (each parent): wait for its container to exit 0 with a drain summary
  (:func:`taskshard_operator.handover.await_drain`); record ``status.finalCheckpoint`` and delete the pod.
- Step 4, Merging with a final checkpoint: once the other parent has one too, write ``Merged`` (terminal).

**Withdrawing a merge** (``spec.merge`` removed or changed on L) is possible until a parent has drained: before M
exists, L goes back to Running at once (and releases its claim); after, L writes ``AbortingMerge`` and M's pass
replaces M's pod by one that runs ``--abort-merge``: it claims M's next writer epoch as a barrier (from then on
M's ready notes are void, and a parent that wrote its final drain marker before the barrier is seen draining)
and reports whether a parent drained or began its final drain. M records that outcome
(``status.mergeAbort``); Aborted: L deletes M and goes back to Running, R follows (Running); TooLate: L goes back
to Merging (MergeRejected reason MergeAbortTooLate) and the merge completes. The parents keep processing
throughout. A withdrawal once a parent's final checkpoint is recorded is too late at once.

**A merge that does not finish** within ``spec.handover.mergeStallSeconds`` (default 600) shows Degraded=True
reason MergeStalled on its parents (and on the Task), naming what it waits for; it stays withdrawable until a
parent drained.

Ownership moves at one observed moment: both parents own their ranges until **both** recorded their final
checkpoint, and from then on M owns the union (:func:`taskshard_operator.planner.merges_taken_over`): never a
gap, never an overlap in the Task's tiling. No key group is processed by two shards: M emits nothing until both
drain summaries exist and name it, and each parent wrote its own as the last step of a final drain (sticky).
While a merge lasts, both parents carry the hand-over finalizer, so a deletion waits.

The runtime's side is :mod:`spark_runtime.merge`; the names both sides use are :mod:`spark_runtime.protocol`.
The pass that calls these steps is :func:`taskshard_operator.reconcile_shard.decide_shard`.
"""

from __future__ import annotations

from typing import Any

import kopf

from spark_runtime.keygroups import KeyGroupRange
from taskshard_operator import builders, naming, planner
from taskshard_operator import status as st
from taskshard_operator.act import Create, Delete, Event, Patch
from taskshard_operator.handover import (
    MergeClaim,
    await_drain,
    claim_of,
    claim_patch,
    drained_status,
    show_stall,
    split_waits,
)
from taskshard_operator.models.shard import MergeAbortOutcome, MergeRole, ShardPhase
from taskshard_operator.models.task import MERGE_STALL_SECONDS
from taskshard_operator.phases import parse_phase
from taskshard_operator.shard_context import ShardContext, create_pod, remove_own_pod
from taskshard_operator.views import drained_for_merge, shard_views

P = ShardPhase

__all__ = [
    "keep_merged",
    "merge_abort_step",
    "merged_parents_waiting",
    "observe_merge_partner",
    "observe_merge_request",
    "step_aborting_merge",
    "step_create_merged",
    "step_merging",
]

MERGE_WAIT_RECHECK_SECONDS = 5.0
"""How soon a waiting merge request is looked at again (the other shard's changes also wake this pass)."""


# ---------------------------------------------------------------- step 1: the request (left, Running)


def observe_merge_request(ctx: ShardContext) -> bool | None:
    """Step 1: ``spec.merge``, once per generation, decided before any pod action. True when the pass ends here
    (accepted, or refused); None when the request waits (the generation must stay unobserved, so nothing else in
    the pass may observe it); False when there is nothing to decide."""
    merge = ctx.shard["spec"].get("merge")
    if not merge or ctx.generation == ctx.status.get("observedGeneration"):
        return False
    right_name = merge["with"]
    views = {v.name: v for v in shard_views(ctx.observed, ctx.namespace, ctx.task_name)}
    me = views.get(ctx.name)
    if me is None:
        return False  # not in the cache's index yet
    right = ctx.observed.shard(ctx.namespace, right_name) if right_name in views else None
    claim = claim_of(ctx)
    if claim is not None and claim.into is None:
        _merge_waits(ctx, f"spec.merge.with: {right_name!r}: waiting until the merge {claim.describe()} is decided")
        return None
    decision = planner.plan_merge(
        task=ctx.task_name,
        left=me,
        right=views.get(right_name),
        right_name=right_name,
        right_wants=_asks_for(right),
        named_by=claim.into if claim is not None else None,
    )
    if isinstance(decision, planner.MergeRefused) and decision.waits:
        _merge_waits(ctx, decision.message)
        return None
    if isinstance(decision, planner.MergeRefused):
        ctx.write(
            {
                "observedGeneration": ctx.generation,
                "conditions": [ctx.cond(st.MERGE_REJECTED, True, "InvalidMergeRequest", decision.message)],
            }
        )
        ctx.event("Warning", "MergeRejected", decision.message)
        return True
    assert right is not None
    ctx.do(claim_patch(right, ctx.name))  # first: R refuses it (409) if it accepted a hand-over of its own
    message = f"merge accepted: {ctx.name} {ctx.key_groups} + {decision.right} -> {decision.into} {decision.key_groups}"
    ctx.write(
        {
            "observedGeneration": ctx.generation,
            "merge": {
                "with": decision.right,
                "into": decision.into,
                "role": MergeRole.LEFT.value,
                "acceptedTime": st.now(),
            },
            "conditions": [
                ctx.cond(st.PROGRESSING, True, "MergeRequested", message),
                ctx.cond(st.MERGE_REJECTED, False, "Accepted", message),
            ],
        },
        phase=P.MERGE_REQUESTED,
    )
    ctx.event("Normal", "MergeAccepted", message)
    return True


def _merge_waits(ctx: ShardContext, message: str) -> None:
    """A merge request that waits: its generation stays unobserved, condition MergeRejected=False reason
    MergeWaiting says why (an event when that changes), and the pass comes back soon."""
    shown = st.get_condition((ctx.shard.get("status") or {}).get("conditions"), st.MERGE_REJECTED) or {}
    if shown.get("reason") != "MergeWaiting" or shown.get("message") != message:
        ctx.event("Normal", "MergeWaiting", message)
    ctx.write({"conditions": [ctx.cond(st.MERGE_REJECTED, False, "MergeWaiting", message)]})
    ctx.decision.again_in(MERGE_WAIT_RECHECK_SECONDS)


def _asks_for(right: dict[str, Any] | None) -> str | None:
    """What the right shard asks for itself (its own ``spec.merge`` or a requested ``spec.split``), or None."""
    if right is None:
        return None
    spec = right["spec"]
    if spec.get("merge"):
        return f"a merge with {spec['merge'].get('with')!r} (spec.merge)"
    if planner.split_requested(spec.get("split")):
        return "a split (spec.split)"
    return None


def _merging_into(ctx: ShardContext) -> str | None:
    """The merged shard of the merge that claims this shard as its right parent, once the cache shows it naming
    both parents (None: no claim, or no merged shard yet)."""
    claim = claim_of(ctx)
    if claim is None or claim.into is None:
        return None
    merged = ctx.observed.shard(ctx.namespace, claim.into)
    parents = [p["parent"] for p in ((merged or {}).get("spec") or {}).get("mergeFrom") or []]
    return claim.into if parents == [claim.left, ctx.name] else None


# ---------------------------------------------------------------- step 2': the right shard joins


def observe_merge_partner(ctx: ShardContext) -> bool:
    """Step 2' (right, Pending/Running/Failed): the merged shard of the merge that claims this one exists: write
    Merging. True when the pass ends here."""
    into = _merging_into(ctx)
    if into is None:
        return False
    merged = ctx.observed.shard(ctx.namespace, into)
    assert merged is not None
    left = merged["spec"]["mergeFrom"][0]["parent"]
    _write_merging(
        ctx,
        left,
        into,
        {"merge": {"with": left, "into": into, "role": MergeRole.RIGHT.value, "acceptedTime": st.now()}},
    )
    return True


def claimed_waits(ctx: ShardContext) -> MergeClaim | None:
    """The claim of a left neighbour's merge on this (Pending/Running/Failed) shard, if any: a split request of
    it waits meanwhile (SplitWaiting), looked at again soon."""
    claim = claim_of(ctx)
    if claim is not None:
        ctx.decision.again_in(MERGE_WAIT_RECHECK_SECONDS)
    return claim


def _write_merging(ctx: ShardContext, other: str, into: str, extra: dict[str, Any]) -> None:
    """-> Merging (either parent): ``lineage.children``, the conditions and the event, plus ``extra``."""
    message = f"merging with {other} into {into}: the pod stops at a batch boundary once {into} is ready"
    ctx.write(
        {
            **extra,
            "lineage": {**(ctx.status.get("lineage") or {}), "children": [into]},
            "conditions": [
                ctx.cond(st.PROGRESSING, True, "Merging", message),
                ctx.cond(st.READY, False, "Merging", message),
            ],
        },
        phase=P.MERGING,
    )
    ctx.event("Normal", "Merging", message)


# ---------------------------------------------------------------- step 2: the merged shard (left, MergeRequested)


def _right_refuses(ctx: ShardContext, right: dict[str, Any] | None) -> str | None:
    """Why the right shard cannot be this merge's right parent any more (None: it can): gone, no longer claimed
    by this shard, or in a hand-over of its own. A merge accepted by an older operator had no claim yet: it gets
    one now (conditional, as at acceptance)."""
    merge = ctx.status["merge"]
    if right is None:
        return f"{merge['with']} does not exist any more"
    annotations = right["metadata"].get("annotations") or {}
    phase = parse_phase((right.get("status") or {}).get("phase"))
    if phase not in (P.PENDING, P.RUNNING, P.FAILED, P.MERGING):
        return f"{merge['with']} is {phase.value}"
    if phase == P.MERGING and ((right.get("status") or {}).get("merge") or {}).get("into") != merge["into"]:
        return f"{merge['with']} is merging into {(right['status'].get('merge') or {}).get('into')}"
    if annotations.get(naming.ANNOTATION_MERGE_LEFT) != ctx.name:
        ctx.do(claim_patch(right, ctx.name))
    return None


def _ensure_merged(ctx: ShardContext) -> str | None:
    """The merged shard's name, created when the cache does not show it; None after reporting a name collision
    (a TaskShard of that name that is not this merge's) or while it cannot be created."""
    merge = ctx.status["merge"]
    into, right = merge["into"], merge["with"]
    existing = ctx.observed.shard(ctx.namespace, into)
    wanted = [ctx.name, right]
    if existing is not None:
        if [p["parent"] for p in existing["spec"].get("mergeFrom") or []] != wanted:
            message = f"cannot create merged shard {into}: a TaskShard of that name exists and is not this merge's"
            ctx.write({"conditions": [ctx.cond(st.DEGRADED, True, "ChildNameTaken", message)]})
            ctx.event("Warning", "ChildNameTaken", message)
            return None
        return into
    right_shard = ctx.observed.shard(ctx.namespace, right)
    assert right_shard is not None
    task, spec, task_hash = ctx.task, ctx.spec, ctx.task_hash
    assert task is not None and spec is not None and task_hash is not None  # a step runs for a live, valid Task
    end = right_shard["spec"]["keyGroups"]["end"]
    merged_range = KeyGroupRange(ctx.key_groups.start, end)
    body = builders.build_shard(
        ctx.task_name,
        merged_range,
        template_hash=task_hash,
        merge_from=[
            {"parent": name, "manifest": builders.drain_summary_uri(ctx.task_name, spec, name)} for name in wanted
        ],
        family=naming.merge_family(ctx.name, right),
    )
    assert body["metadata"]["name"] == into, (body["metadata"]["name"], into)
    kopf.adopt(body, owner=task)  # type: ignore[arg-type]  # kopf types owner as its Body; a dict works
    note = f"created merged shard {into}; it restores from {ctx.name} and {right} once both drained"
    ctx.do(Create(naming.SHARD_PLURAL, body, announce=Event("Normal", "MergedShardCreated", note)))
    return into


def step_create_merged(ctx: ShardContext) -> None:
    """Step 2: MergeRequested -> (re-check R, create the merged shard) -> Merging. The pod keeps processing."""
    if _withdrawn(ctx) or _observe_change(ctx):
        return
    merge = ctx.status["merge"]
    right = ctx.observed.shard(ctx.namespace, merge["with"])
    refused = _right_refuses(ctx, right) if ctx.observed.shard(ctx.namespace, merge["into"]) is None else None
    if refused is not None:
        _end_merge(
            ctx, "MergeAbandoned", f"merge with {merge['with']} abandoned before {merge['into']} existed: {refused}"
        )
        return
    into = _ensure_merged(ctx)
    if into is None:
        return
    if not ctx.pod.exists:
        create_pod(ctx, restarts_base=int(ctx.status.get("restarts") or 0))
    _write_merging(ctx, merge["with"], into, {})


# ---------------------------------------------------------------- steps 3-4: Merging (each parent)


def step_merging(ctx: ShardContext) -> None:
    """Steps 3-4: Merging -> (pod drained: ``finalCheckpoint``, pod deleted) -> Merged once the other parent
    drained too. The left shard may withdraw (AbortingMerge); the right one follows a withdrawal (Running)."""
    merge = ctx.status["merge"]
    left = merge.get("role") == MergeRole.LEFT.value
    if left and _withdrawn(ctx):
        return
    if not left and _left_let_go(ctx):
        return
    _observe_change(ctx)
    if left and _ensure_merged(ctx) is None:
        return
    if not ctx.status.get("finalCheckpoint"):
        await_drain(ctx, lambda term: _record_merge_drain(ctx, term))
        _stall_check(ctx)
        return
    remove_own_pod(ctx)
    if ctx.pod.exists:
        ctx.write({"pod": None})
    other = ctx.observed.shard(ctx.namespace, merge["with"])
    if other is not None and not drained_for_merge(other):
        message = f"drained; {merge['into']} takes over once {merge['with']} has drained too"
        ctx.write({"conditions": [ctx.cond(st.PROGRESSING, True, "MergeDrained", message)]})
        _stall_check(ctx)
        return
    if ctx.observed.configmap_digest(ctx.namespace, ctx.name) is not None:
        ctx.do(Delete("configmaps", naming.configmap_name(ctx.name)))
    message = f"merged with {merge['with']} into {merge['into']}; this shard keeps no pod and owns no key groups"
    ctx.write(
        {
            "conditions": [
                ctx.cond(st.PROGRESSING, False, "Merged", message),
                ctx.cond(st.READY, False, "Merged", message),
                ctx.cond(st.DEGRADED, False, "Healthy", ""),
            ]
        },
        phase=P.MERGED,
    )
    ctx.event("Normal", "Merged", message)


def _record_merge_drain(ctx: ShardContext, term: st.Termination) -> None:
    """Merging: the pod ended its final drain; record it (the phase stays Merging until the other parent's too)."""
    patch, message = drained_status(ctx, term)
    ctx.write(patch)  # the stopped pod is deleted by the next pass, once this is written
    ctx.event("Normal", "Drained", f"{message} (merging into {ctx.status['merge']['into']})")


def _observe_change(ctx: ShardContext) -> bool:
    """A new generation during a merge: a split request waits until the merge has ended or was undone
    (SplitWaiting, the generation stays unobserved); a ``spec.merge`` naming another shard is refused (withdraw
    it first); anything else is observed. Returns False (the step goes on)."""
    if ctx.generation == ctx.status.get("observedGeneration"):
        return False
    merge = ctx.status.get("merge") or {}
    spec = ctx.shard["spec"]
    if planner.split_requested(spec.get("split")):
        _split_waits(ctx, f"{ctx.name} is merging with {merge.get('with')} into {merge.get('into')}")
        return False
    asked = (spec.get("merge") or {}).get("with")
    patch: dict[str, Any] = {"observedGeneration": ctx.generation}
    if merge.get("role") == MergeRole.LEFT.value and asked is not None and asked != merge.get("with"):
        message = (
            f"spec.merge.with: {asked!r}: {ctx.name} is merging with {merge.get('with')} into {merge.get('into')}; "
            "one merge at a time (remove spec.merge to withdraw this one while no parent has drained)"
        )
        patch["conditions"] = [ctx.cond(st.MERGE_REJECTED, True, "MergeInProgress", message)]
        ctx.event("Warning", "MergeInProgress", message)
    ctx.write(patch)
    return False


def _split_waits(ctx: ShardContext, why: str) -> None:
    split_waits(ctx, f"{why}; the split starts once the merge has ended or was withdrawn")
    ctx.decision.again_in(MERGE_WAIT_RECHECK_SECONDS)


# ---------------------------------------------------------------- withdrawing a merge


def _withdrawn(ctx: ShardContext) -> bool:
    """The left shard's ``spec.merge`` no longer names its partner (removed, or a split asked instead): undo the
    merge (before M exists: at once; after: AbortingMerge), or say once that it is too late. True when the pass
    ends here."""
    merge = ctx.status["merge"]
    asked = (ctx.shard["spec"].get("merge") or {}).get("with")
    if asked is not None:
        return False
    drained = _drained_parents(ctx)
    if drained:
        message = (
            f"spec.merge withdrawn too late: {' and '.join(drained)} drained for {merge['into']} already; the merge "
            "completes"
        )
        shown = st.get_condition((ctx.shard.get("status") or {}).get("conditions"), st.MERGE_REJECTED) or {}
        if shown.get("reason") != "MergeAbortTooLate":
            ctx.event("Warning", "MergeAbortTooLate", message)
        ctx.write({"conditions": [ctx.cond(st.MERGE_REJECTED, True, "MergeAbortTooLate", message)]})
        return False
    if ctx.phase == P.MERGE_REQUESTED and ctx.observed.shard(ctx.namespace, merge["into"]) is None:
        _end_merge(ctx, "MergeWithdrawn", f"spec.merge withdrawn: the merge with {merge['with']} is undone")
        return True
    message = (
        f"spec.merge withdrawn: {merge['into']}'s pod fences it in storage; unless {ctx.name} or {merge['with']} "
        "drained already, the merge is undone and both go on (else it completes)"
    )
    ctx.write(
        {
            "conditions": [
                ctx.cond(st.PROGRESSING, True, "AbortingMerge", message),
                ctx.cond(st.MERGE_REJECTED, False, "Withdrawn", message),
            ]
        },
        phase=P.ABORTING_MERGE,
    )
    ctx.event("Normal", "MergeAborting", message)
    return True


def _drained_parents(ctx: ShardContext) -> list[str]:
    """The parents of this merge that drained for it (recorded, or their pod exited drained)."""
    merge = ctx.status["merge"]
    out = []
    if ctx.status.get("finalCheckpoint") or (ctx.pod.terminated is not None and ctx.pod.terminated.drained):
        out.append(ctx.name)
    other = ctx.observed.shard(ctx.namespace, merge["with"])
    term = ctx.observed.pod(ctx.namespace, merge["with"]).terminated
    if (other is not None and drained_for_merge(other)) or (term is not None and term.drained):
        out.append(merge["with"])
    return out


def step_aborting_merge(ctx: ShardContext) -> None:
    """AbortingMerge (left): the merged shard's abort pod reports (``status.mergeAbort`` of M): Aborted -> delete
    M, release the claim on R, Running; TooLate -> Merging (the merge completes). The pod keeps processing, and a
    drain it finished meanwhile is recorded (the outcome is then TooLate)."""
    merge = ctx.status["merge"]
    if not ctx.status.get("finalCheckpoint"):
        term = ctx.pod.terminated
        if term is not None and term.drained:
            _record_merge_drain(ctx, term)
    merged = ctx.observed.shard(ctx.namespace, merge["into"])
    outcome = ((merged or {}).get("status") or {}).get("mergeAbort") or {}
    if outcome.get("outcome") == MergeAbortOutcome.ABORTED.value and not _drained_parents(ctx):
        ctx.do(Delete(naming.SHARD_PLURAL, merge["into"], uid=(merged or {})["metadata"].get("uid")))
        _end_merge(ctx, "MergeAborted", f"merge into {merge['into']} undone: {merge['into']} is fenced and deleted")
        return
    if outcome.get("outcome") == MergeAbortOutcome.TOO_LATE.value or _drained_parents(ctx):
        drained = ", ".join(outcome.get("drained") or _drained_parents(ctx))
        message = f"spec.merge withdrawn too late: {drained} drained for {merge['into']} already; the merge completes"
        ctx.write({"conditions": [ctx.cond(st.MERGE_REJECTED, True, "MergeAbortTooLate", message)]}, phase=P.MERGING)
        ctx.event("Warning", "MergeAbortTooLate", message)
        return
    message = f"aborting the merge: waiting for {merge['into']}'s pod to fence it and report"
    ctx.write({"conditions": [ctx.cond(st.PROGRESSING, True, "AbortingMerge", message)]})
    ctx.decision.again_in(MERGE_WAIT_RECHECK_SECONDS)


def _end_merge(ctx: ShardContext, reason: str, message: str) -> None:
    """The left shard's merge is over without a hand-over (withdrawn, aborted, abandoned): release the claim on
    the right shard, forget the merge, Running (its pod never stopped)."""
    merge = ctx.status["merge"]
    right = ctx.observed.shard(ctx.namespace, merge["with"])
    if right is not None and (right["metadata"].get("annotations") or {}).get(naming.ANNOTATION_MERGE_LEFT) == ctx.name:
        ctx.do(
            Patch(
                naming.SHARD_PLURAL, merge["with"], {"metadata": {"annotations": {naming.ANNOTATION_MERGE_LEFT: None}}}
            )
        )
    _leave_merge(ctx, reason, message)


def _leave_merge(ctx: ShardContext, reason: str, message: str) -> None:
    lineage = {k: v for k, v in (ctx.status.get("lineage") or {}).items() if k != "children"}
    ctx.write(
        {
            "merge": None,
            "lineage": {**lineage, "children": None} if lineage else None,
            "conditions": [
                ctx.cond(st.PROGRESSING, False, reason, message),
                ctx.cond(st.MERGE_REJECTED, False, reason, message),
                ctx.cond(st.DEGRADED, False, "Healthy", ""),
            ],
        },
        phase=P.RUNNING,
    )
    ctx.event("Normal", reason, message)


def _left_let_go(ctx: ShardContext) -> bool:
    """The right shard of a merge the left one undid (its ``status.merge`` no longer names this shard): back to
    Running, unless this shard drained for it (then it says so: its range has no owner)."""
    merge = ctx.status["merge"]
    left = ctx.observed.shard(ctx.namespace, merge["with"])
    named = ((left or {}).get("status") or {}).get("merge") or {}
    if named.get("with") == ctx.name and named.get("into") == merge["into"]:
        return False
    if left is None and (ctx.status.get("finalCheckpoint") or (ctx.pod.terminated and ctx.pod.terminated.drained)):
        return False  # the left parent is gone after both drained: the merge completes as before
    if ctx.status.get("finalCheckpoint"):
        message = f"{merge['with']} no longer merges with this shard, but it drained for {merge['into']}"
        ctx.write({"conditions": [ctx.cond(st.DEGRADED, True, "MergeLost", message)]})
        return True
    _leave_merge(ctx, "MergeAborted", f"{merge['with']} withdrew the merge into {merge['into']}; this shard goes on")
    return True


# ---------------------------------------------------------------- a merge that does not end


def _stall_check(ctx: ShardContext) -> None:
    """Degraded=True reason MergeStalled once the merge was accepted longer ago than the Task's bound, naming what
    it waits for; else a pass when the bound passes."""
    bound = ctx.spec.handover.merge_stall_seconds if ctx.spec and ctx.spec.handover else MERGE_STALL_SECONDS
    show_stall(
        ctx,
        (ctx.status.get("merge") or {}).get("acceptedTime"),
        bound,
        st.MERGE_STALLED,
        lambda elapsed: (
            f"the merge into {ctx.status['merge']['into']} was accepted {elapsed:.0f}s ago (bound "
            f"{bound}s): {_waits_for(ctx)}"
        ),
    )


def _waits_for(ctx: ShardContext) -> str:
    merge = ctx.status["merge"]
    parts = []
    for name in (ctx.name, merge["with"]):
        shard = ctx.shard if name == ctx.name else ctx.observed.shard(ctx.namespace, name)
        if shard is not None and (
            drained_for_merge(shard) or (shard is ctx.shard and ctx.status.get("finalCheckpoint"))
        ):
            continue
        pod = ctx.observed.pod(ctx.namespace, name)
        state = "no pod" if not pod.exists else (pod.waiting_reason or pod.phase or "starting")
        parts.append(f"{name} has not drained (its driver pod: {state})")
    into = ctx.observed.pod(ctx.namespace, merge["into"])
    if not into.running:
        state = "no pod" if not into.exists else (into.waiting_reason or into.phase or "starting")
        parts.append(f"{merge['into']} is not running on standby (its driver pod: {state})")
    parts.append('withdraw it with kubectl patch taskshard ... -p \'{"spec":{"merge":null}}\' while no parent drained')
    return "; ".join(parts)


# ---------------------------------------------------------------- Merged (terminal)


def keep_merged(ctx: ShardContext) -> None:
    """Merged (terminal): no pod, no ConfigMap; a new split or merge request is refused."""
    remove_own_pod(ctx)
    if ctx.observed.configmap_digest(ctx.namespace, ctx.name) is not None:
        ctx.do(Delete("configmaps", naming.configmap_name(ctx.name)))
    if ctx.generation == ctx.status.get("observedGeneration"):
        return
    patch: dict[str, Any] = {"observedGeneration": ctx.generation}
    spec = ctx.shard["spec"]
    into = (ctx.status.get("merge") or {}).get("into")
    if planner.split_requested(spec.get("split")) or (
        spec.get("merge") and (spec["merge"].get("with") != (ctx.status.get("merge") or {}).get("with"))
    ):
        message = f"{ctx.name} merged into {into} and owns no key groups: split or merge {into} instead"
        patch["conditions"] = [ctx.cond(st.MERGE_REJECTED, True, "Merged", message)]
        ctx.event("Warning", "MergeRejected", message)
    ctx.write(patch)


# ---------------------------------------------------------------- the merged shard


def merged_parents_waiting(ctx: ShardContext) -> list[str]:
    """For a merged shard: its parents while they still own their ranges (not both drained), else []."""
    if not ctx.merge_from:
        return []
    names = [p["parent"] for p in ctx.merge_from]
    parents = [ctx.observed.shard(ctx.namespace, n) for n in names]
    if all(p is None or drained_for_merge(p) for p in parents):
        return []
    return names


def merge_abort_step(ctx: ShardContext) -> bool:
    """A merged shard whose left parent withdrew the merge (AbortingMerge): replace its pod by one that runs
    ``--abort-merge`` (it claims a barrier epoch of this shard and reports whether a parent drained), record the
    outcome in ``status.mergeAbort`` and remove that pod. Once the left parent is no longer aborting, the record
    and an abort pod go, and the shard runs as before (the merge completes). True when the pass ends here."""
    if not ctx.merge_from:
        return False
    left = ctx.observed.shard(ctx.namespace, ctx.merge_from[0]["parent"])
    left_status = (left or {}).get("status") or {}
    aborting = (
        parse_phase(left_status.get("phase")) == P.ABORTING_MERGE
        and (left_status.get("merge") or {}).get("into") == ctx.name
    )
    pod = ctx.pod
    if not aborting:
        if ctx.status.get("mergeAbort"):
            ctx.write({"mergeAbort": None})
        if pod.exists and pod.aborts_merge:
            remove_own_pod(ctx)
            return True
        return False
    if ctx.status.get("mergeAbort"):
        remove_own_pod(ctx)
        return True
    if pod.exists and not pod.aborts_merge:
        remove_own_pod(ctx)
        message = f"merge withdrawn by {ctx.merge_from[0]['parent']}: stopping {pod.name} to fence this shard"
        ctx.write({"conditions": [ctx.cond(st.PROGRESSING, True, "AbortingMerge", message)]})
        return True
    if not pod.exists:
        create_pod(ctx, restarts_base=int(ctx.status.get("restarts") or 0), abort_merge=True)
        return True
    term = pod.terminated
    summary = term.merge_abort if term is not None else None
    if summary is not None:
        record = {"outcome": summary.outcome.value, "drained": list(summary.drained), "time": st.now()}
        message = f"merge abort: {summary.outcome.value}" + (
            f" ({', '.join(summary.drained)} drained already)" if summary.drained else ""
        )
        ctx.write({"mergeAbort": record, "conditions": [ctx.cond(st.PROGRESSING, True, "AbortingMerge", message)]})
        ctx.event("Normal", "MergeAbortChecked", message)
        return True
    if term is not None and pod.phase in ("Failed", "Succeeded"):
        assert pod.name is not None  # an existing pod has a name
        message = f"pod {pod.name} ended (exit code {term.exit_code}) without a merge-abort summary: {term.message!r}"
        ctx.do(Delete("pods", pod.name, uid=pod.uid, grace=0))
        ctx.write({"conditions": [ctx.cond(st.DEGRADED, True, "AbortRetry", message)]})
        ctx.event("Warning", "AbortRetry", message)
    return True
