"""The operator's side of a merge: two adjacent shards become one, one protocol step per pass.

The user sets ``spec.merge: {with: <right neighbour>}`` on the left shard. Each phase is written to ``status``
*before* the step it names is acted on; a crash anywhere leaves a phase from which the next pass continues, and
every action is idempotent::

    left  L:  Running ──valid spec.merge──> MergeRequested ──merged shard M created──> Merging ──┐
              (status.merge {with: R, into: M, role: left})   (spec.mergeFrom: L, R;    pod drained:
                                                               standby until both       status.finalCheckpoint
                                                               parents drained)            │
    right R:  Pending | Running | Failed ──M names R and L accepted it──> Merging ─────────────┤
              (status.merge {with: L, into: M, role: right})                               both drained
                                                                                           ▼
                                                                          Merged (terminal, each parent)

- Step 1, L Running: a valid ``spec.merge`` (:func:`taskshard_operator.planner.plan_merge`: adjacent, both
  Running, neither asking for another hand-over) is accepted by writing ``MergeRequested`` and
  ``status.merge``, nothing else. A refusal writes condition MergeRejected (and an event) and changes nothing;
  while either shard is starting or restarting (Pending, Failed) the request waits instead (MergeRejected=False,
  reason MergeWaiting; looked at again every few seconds).
- Step 2, L MergeRequested: create M (``<task>-<start>-<end>-<family>``, owned by the Task, ``spec.mergeFrom``
  = both parents' drain summaries ``drained.json``; 409 = created before), then write ``Merging`` with
  ``status.lineage.children: [M]``. M's pod starts at once and waits on standby
  (``spark_runtime.merge``): it writes its ready note into both parents' storage, and each parent's runtime
  stops by itself at its next batch boundary and writes its drain summary.
- Step 2', R Pending/Running/Failed: L's pass annotates R with ``taskshard.io/merge-left: L`` (a pointer, so R
  finds its merge without scanning the Task's shards); once the cache shows M naming L and R as its parents and
  L's ``status.merge`` naming R and M, R writes ``Merging`` and its own ``status.merge``. R never decides a
  merge itself; it follows what L accepted (whatever R's pod does meanwhile: it drains once M is ready).
- Step 3, Merging (each parent): wait for its container to exit 0 with a drain summary (a missing pod is
  created again, a failing one restarts in place, one without a manifest drains again:
  :func:`taskshard_operator.split_protocol.await_drain`); record ``status.finalCheckpoint`` and delete the pod.
- Step 4, Merging with a final checkpoint: once the other parent has one too, write ``Merged`` (terminal).

Ownership moves at one observed moment: both parents own their ranges until **both** recorded their final
checkpoint, and from then on M owns the union (:func:`taskshard_operator.planner.merges_taken_over`): never a
gap, never an overlap in the Task's tiling. No key group is processed by two shards: M emits nothing until both
drain summaries exist, and each parent wrote its own as the last step of a final drain (sticky).

A merge cannot be withdrawn once accepted (a new ``spec.merge`` generation is refused, reason
MergeInProgress): its hand-over is one drain of each parent, a few batches. While it lasts, both parents carry
the hand-over finalizer ``taskshard.io/split``, so a deletion waits.

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
from taskshard_operator.models.shard import MergeRole, ShardPhase
from taskshard_operator.shard_context import ShardContext, create_pod, remove_own_pod
from taskshard_operator.split_protocol import await_drain, drained_status
from taskshard_operator.views import drained_for_merge, shard_views

P = ShardPhase

__all__ = [
    "keep_merged",
    "merged_parents_waiting",
    "observe_merge_partner",
    "observe_merge_request",
    "step_create_merged",
    "step_merging",
]


# ---------------------------------------------------------------- step 1: the request (left, Running)


def observe_merge_request(ctx: ShardContext) -> bool | None:
    """Step 1: ``spec.merge``, once per generation, decided before any pod action. True when the pass ends here
    (accepted, or refused); None when the request waits for a shard to run (the generation must stay unobserved,
    so nothing else in the pass may observe it); False when there is nothing to decide."""
    merge = ctx.shard["spec"].get("merge")
    if not merge or ctx.generation == ctx.status.get("observedGeneration"):
        return False
    right_name = merge["with"]
    views = {v.name: v for v in shard_views(ctx.observed, ctx.namespace, ctx.task_name)}
    me = views.get(ctx.name)
    if me is None:
        return False  # not in the cache's index yet
    right = ctx.observed.shard(ctx.namespace, right_name) if right_name in views else None
    decision = planner.plan_merge(
        task=ctx.task_name,
        left=me,
        right=views.get(right_name),
        right_name=right_name,
        right_wants=_asks_for(right),
        named_by=_merging_into(ctx),
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


MERGE_WAIT_RECHECK_SECONDS = 5.0
"""How soon a waiting merge request is looked at again (the other shard's changes do not trigger this pass)."""


def _merge_waits(ctx: ShardContext, message: str) -> None:
    """A merge request that waits for a shard to run again: its generation stays unobserved, condition
    MergeRejected=False reason MergeWaiting says why (an event when that changes), and the pass comes back soon."""
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
    """The merged shard of an accepted merge that names this shard as its right parent (None: none). Found from the
    annotation the left shard's pass sets on this one (:data:`taskshard_operator.naming.ANNOTATION_MERGE_LEFT`),
    then checked against the left shard's ``status.merge`` and the merged shard's ``spec.mergeFrom``."""
    left_name = (ctx.shard["metadata"].get("annotations") or {}).get(naming.ANNOTATION_MERGE_LEFT)
    left = ctx.observed.shard(ctx.namespace, left_name) if left_name else None
    if left is None:
        return None
    merge = (left.get("status") or {}).get("merge") or {}
    if merge.get("role") != MergeRole.LEFT.value or merge.get("with") != ctx.name:
        return None
    merged = ctx.observed.shard(ctx.namespace, merge.get("into") or "")
    parents = [p["parent"] for p in ((merged or {}).get("spec") or {}).get("mergeFrom") or []]
    return merge["into"] if parents == [left_name, ctx.name] else None


# ---------------------------------------------------------------- step 2': the right shard joins


def observe_merge_partner(ctx: ShardContext) -> bool:
    """Step 2' (right, Pending/Running/Failed): a merged shard that names this one as its right parent, accepted by
    its left parent: write Merging. True when the pass ends here."""
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


def _ensure_merged(ctx: ShardContext) -> str | None:
    """The merged shard's name, created when the cache does not show it, and the right shard pointed at this one
    (left only); None after reporting a name collision (a TaskShard of that name that is not this merge's)."""
    merge = ctx.status["merge"]
    into, right = merge["into"], merge["with"]
    right_shard = ctx.observed.shard(ctx.namespace, right)
    annotations = ((right_shard or {}).get("metadata") or {}).get("annotations") or {}
    if right_shard is not None and annotations.get(naming.ANNOTATION_MERGE_LEFT) != ctx.name:
        ctx.do(
            Patch(naming.SHARD_PLURAL, right, {"metadata": {"annotations": {naming.ANNOTATION_MERGE_LEFT: ctx.name}}})
        )
    existing = ctx.observed.shard(ctx.namespace, into)
    wanted = [ctx.name, right]
    if existing is not None:
        if [p["parent"] for p in existing["spec"].get("mergeFrom") or []] != wanted:
            message = f"cannot create merged shard {into}: a TaskShard of that name exists and is not this merge's"
            ctx.write({"conditions": [ctx.cond(st.DEGRADED, True, "ChildNameTaken", message)]})
            ctx.event("Warning", "ChildNameTaken", message)
            return None
        return into
    if right_shard is None:
        return None  # the right shard is gone (the finalizer holds it only once it is Merging): wait
    end = right_shard["spec"]["keyGroups"]["end"]
    merged_range = KeyGroupRange(ctx.key_groups.start, end)
    body = builders.build_shard(
        ctx.task_name,
        merged_range,
        template_hash=ctx.task_hash,
        merge_from=[
            {"parent": name, "manifest": builders.drain_summary_uri(ctx.task_name, ctx.spec, name)} for name in wanted
        ],
        family=naming.merge_family(ctx.name, right),
    )
    assert body["metadata"]["name"] == into, (body["metadata"]["name"], into)
    kopf.adopt(body, owner=ctx.task)
    note = f"created merged shard {into}; it restores from {ctx.name} and {right} once both drained"
    ctx.do(Create(naming.SHARD_PLURAL, body, announce=Event("Normal", "MergedShardCreated", note)))
    return into


def step_create_merged(ctx: ShardContext) -> None:
    """Step 2: MergeRequested -> (create the merged shard) -> Merging. The pod keeps processing."""
    _refuse_change(ctx)
    into = _ensure_merged(ctx)
    if into is None:
        return
    if not ctx.pod.exists:
        create_pod(ctx, restarts_base=int(ctx.status.get("restarts") or 0))
    _write_merging(ctx, ctx.status["merge"]["with"], into, {})


# ---------------------------------------------------------------- steps 3-4: Merging (each parent)


def step_merging(ctx: ShardContext) -> None:
    """Steps 3-4: Merging -> (pod drained: ``finalCheckpoint``, pod deleted) -> Merged once the other parent
    drained too."""
    _refuse_change(ctx)
    merge = ctx.status["merge"]
    if merge.get("role") == MergeRole.LEFT.value and _ensure_merged(ctx) is None:
        return
    if not ctx.status.get("finalCheckpoint"):
        await_drain(ctx, lambda term: _record_merge_drain(ctx, term))
        return
    remove_own_pod(ctx)
    if ctx.pod.exists:
        ctx.write({"pod": None})
    other = ctx.observed.shard(ctx.namespace, merge["with"])
    if other is not None and not drained_for_merge(other):
        message = f"drained; {merge['into']} takes over once {merge['with']} has drained too"
        ctx.write({"conditions": [ctx.cond(st.PROGRESSING, True, "MergeDrained", message)]})
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


def _refuse_change(ctx: ShardContext) -> None:
    """A new generation during a merge: observed; a changed ``spec.merge`` (or a split request) is refused once."""
    if ctx.generation == ctx.status.get("observedGeneration"):
        return
    merge = ctx.status.get("merge") or {}
    spec = ctx.shard["spec"]
    asked = spec.get("merge") or {}
    patch: dict[str, Any] = {"observedGeneration": ctx.generation}
    if (
        merge.get("role") == MergeRole.LEFT.value and asked.get("with") != merge.get("with")
    ) or planner.split_requested(spec.get("split")):
        message = (
            f"{ctx.name} is merging with {merge.get('with')} into {merge.get('into')}; an accepted merge cannot be "
            "withdrawn or changed, and a shard that merges cannot split"
        )
        patch["conditions"] = [ctx.cond(st.MERGE_REJECTED, True, "MergeInProgress", message)]
        ctx.event("Warning", "MergeInProgress", message)
    ctx.write(patch)


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


# ---------------------------------------------------------------- the merged shard on standby


def merged_parents_waiting(ctx: ShardContext) -> list[str]:
    """For a merged shard: its parents while they still own their ranges (not both drained), else []."""
    if not ctx.merge_from:
        return []
    names = [p["parent"] for p in ctx.merge_from]
    parents = [ctx.observed.shard(ctx.namespace, n) for n in names]
    if all(p is None or drained_for_merge(p) for p in parents):
        return []
    return names
