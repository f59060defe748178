"""The floor both hand-overs stand on (operator side): one hand-over per shard at a time, who may succeed a shard,
the parent's drain wait and its summary, and the hand-over finalizer. :mod:`taskshard_operator.split_protocol`
and :mod:`taskshard_operator.merge_protocol` build their steps on it; neither imports the other.

**One hand-over per shard.** A shard takes part in at most one split, merge or abort at a time. Its own phase
says so for a hand-over it accepted itself (:attr:`~taskshard_operator.models.shard.ShardPhase.handing_over`);
the right shard of a merge is *claimed* by its left neighbour instead: the left shard's pass that accepts the
merge patches the annotation ``taskshard.io/merge-left: <left>`` onto the right shard **conditionally on the
right shard's resourceVersion** (:func:`claim_patch`), before it writes its own ``MergeRequested``. The right
shard's own acceptance of a split or merge is a status write conditional on the same resourceVersion, so of the
two only one can land: the other finds a newer version (409) and its pass decides again on fresher state, where
it sees the claim (:func:`merge_claim`) or the accepted hand-over. No stale cache can let both through.

**Who may succeed a shard.** A split child or merged shard gets a pod only once its parents' status names it
(:func:`successor_standing`): the split parent's ``status.lineage.children``, each merge parent's
``status.merge.into`` (the right one: or the merge that claims it). A TaskShard made by hand that names a running
shard in ``restoreFrom``/``mergeFrom`` never gets a pod (reason ``NotAChild``), so it cannot make that shard
hand over. The runtime is the backstop (``spark_runtime.handover``): a parent's drain summary names the
successors it handed over to, and a successor it does not name refuses to restore (``HandedToAnother``).

Pure: no API calls; actions are recorded on the pass's decision.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from taskshard_operator import naming, planner
from taskshard_operator import status as st
from taskshard_operator.act import Delete, Patch
from taskshard_operator.models.shard import MergeRole, ShardPhase
from taskshard_operator.phases import parse_phase
from taskshard_operator.shard_context import ShardContext, create_pod, ended_live

P = ShardPhase

__all__ = [
    "MergeClaim",
    "Standing",
    "await_drain",
    "claim_patch",
    "drained_status",
    "finalizers",
    "merge_claim",
    "related_shards",
    "split_waits",
    "successor_standing",
    "sync_handover_finalizer",
]


# ---------------------------------------------------------------- one hand-over per shard


@dataclass(frozen=True)
class MergeClaim:
    """The left neighbour's merge that claims a shard as its right parent."""

    left: str
    into: str | None
    """The merged shard (None: the left shard accepted it in a pass whose status write is not visible yet)."""

    def describe(self) -> str:
        into = f" into {self.into}" if self.into else ""
        return f"{self.left} is merging with it{into}"


def merge_claim(shard: dict[str, Any], left: dict[str, Any] | None) -> MergeClaim | None:
    """The merge of ``left`` (the shard the annotation ``taskshard.io/merge-left`` on ``shard`` names, as the
    cache shows it) that claims ``shard`` as its right parent, or None.

    A claim holds while the left shard's ``status.merge`` names ``shard`` and the merge goes on (MergeRequested,
    Merging, AbortingMerge), and also while the left shard's ``spec.merge`` names ``shard`` and its generation is
    not decided yet (the accepting pass patched the claim; its own status write may not be visible yet, or was
    refused and is being decided again). An annotation of a merge that ended, was withdrawn or refused is stale."""
    name = shard["metadata"]["name"]
    left_name = (shard["metadata"].get("annotations") or {}).get(naming.ANNOTATION_MERGE_LEFT)
    if not left_name or left is None or left["metadata"]["name"] != left_name:
        return None
    status = left.get("status") or {}
    merge = status.get("merge") or {}
    if (
        merge.get("role") == MergeRole.LEFT.value
        and merge.get("with") == name
        and parse_phase(status.get("phase")).merging
    ):
        return MergeClaim(left_name, merge.get("into"))
    asked = (left["spec"].get("merge") or {}).get("with")
    generation = int(left["metadata"].get("generation") or 1)
    if asked == name and generation != status.get("observedGeneration"):
        return MergeClaim(left_name, None)
    return None


def claim_of(ctx: ShardContext) -> MergeClaim | None:
    """:func:`merge_claim` of the shard of this pass, from the cache."""
    left_name = (ctx.shard["metadata"].get("annotations") or {}).get(naming.ANNOTATION_MERGE_LEFT)
    left = ctx.observed.shard(ctx.namespace, left_name) if left_name else None
    return merge_claim(ctx.shard, left)


def claim_patch(right: dict[str, Any], left: str) -> Patch:
    """The left shard's claim on its right neighbour: the annotation, conditional on the version of ``right`` the
    decision was made from (a right shard that accepted a hand-over of its own since refuses it with a 409)."""
    version = right["metadata"].get("resourceVersion")
    return Patch(
        naming.SHARD_PLURAL,
        right["metadata"]["name"],
        {"metadata": {"annotations": {naming.ANNOTATION_MERGE_LEFT: left}, "resourceVersion": version}},
    )


def split_waits(ctx: ShardContext, why: str) -> None:
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


# ---------------------------------------------------------------- who may succeed a shard


class Standing(StrEnum):
    """What a successor's parents say of it (:func:`successor_standing`)."""

    NAMED = "named"
    """Every parent names it (or is gone after it ran): it may have a pod."""
    SOON = "soon"
    """A parent accepted the hand-over and names it in its next step: wait."""
    NOT_A_CHILD = "not-a-child"
    """A parent does not name it: no pod (reason ``NotAChild``)."""


def _names(parent: dict[str, Any], child: str) -> bool:
    status = parent.get("status") or {}
    children = (status.get("lineage") or {}).get("children") or []
    return child in children or (status.get("merge") or {}).get("into") == child


def successor_standing(
    child: dict[str, Any], parents: dict[str, dict[str, Any] | None], *, split_children: Any = None
) -> tuple[Standing, str]:
    """Whether ``child`` (a TaskShard with ``spec.restoreFrom`` or ``spec.mergeFrom``) is a successor its parents
    named, and why not. ``parents``: each parent's name -> its TaskShard as the cache shows it (None: none);
    ``split_children(parent) -> [names]``: the children of an accepted split (SplitRequested: named in the pass
    after the one that created them). A successor that ran before (``status.lineage`` set) stays one when its
    parent is gone."""
    name = child["metadata"]["name"]
    ran = bool((child.get("status") or {}).get("lineage"))
    soon = []
    for parent_name, parent in parents.items():
        if parent is None:
            if ran:
                continue
            return Standing.NOT_A_CHILD, f"its parent {parent_name} does not exist"
        if _names(parent, name):
            continue
        phase = parse_phase((parent.get("status") or {}).get("phase"))
        if phase == P.SPLIT_REQUESTED and split_children is not None and name in split_children(parent):
            soon.append(parent_name)
            continue
        claim = merge_claim(parent, _left_of(parent, parents))
        if claim is not None and claim.into == name:
            soon.append(parent_name)
            continue
        return Standing.NOT_A_CHILD, (
            f"{parent_name} ({phase.value}) does not name it as its successor (status.lineage.children, "
            "status.merge.into): only a shard the operator created for an accepted split or merge may restore from "
            "it"
        )
    if soon:
        return Standing.SOON, f"waiting until {' and '.join(soon)} names it as its successor"
    return Standing.NAMED, ""


def _left_of(parent: dict[str, Any], parents: dict[str, dict[str, Any] | None]) -> dict[str, Any] | None:
    left_name = (parent["metadata"].get("annotations") or {}).get(naming.ANNOTATION_MERGE_LEFT)
    return parents.get(left_name) if left_name else None


# ---------------------------------------------------------------- who follows whom


def related_shards(shard: dict[str, Any]) -> set[str]:
    """The shards whose pass follows a change of ``shard`` (a parent, a child, a merge partner, the merged shard):
    an event of one hand-over participant wakes every other one at once, so no phase waits for the resync."""
    spec, status = shard.get("spec") or {}, shard.get("status") or {}
    names = {(spec.get("restoreFrom") or {}).get("parent")}
    names |= {p.get("parent") for p in spec.get("mergeFrom") or []}
    names.add((spec.get("merge") or {}).get("with"))
    merge = status.get("merge") or {}
    names |= {merge.get("with"), merge.get("into")}
    lineage = status.get("lineage") or {}
    names |= set(lineage.get("children") or []) | set(lineage.get("parents") or []) | {lineage.get("parent")}
    names.add((shard["metadata"].get("annotations") or {}).get(naming.ANNOTATION_MERGE_LEFT))
    names.discard(shard["metadata"]["name"])
    return {n for n in names if isinstance(n, str) and n}


# ---------------------------------------------------------------- the hand-over finalizer


def finalizers(obj: dict[str, Any]) -> list[str]:
    return list(obj["metadata"].get("finalizers") or [])


def sync_handover_finalizer(ctx: ShardContext, *, want: bool) -> None:
    """:data:`~taskshard_operator.naming.HANDOVER_FINALIZER` on the shard while a split or merge of it is in
    progress (and its Task lives): a deletion then waits until the hand-over finished or was undone, so successors
    never wait for a parent that is gone. Patched only when it differs, conditional on the observed version; never
    added to a shard being deleted (the API refuses that, and a shard deleted before its hand-over started has no
    successors to strand)."""
    have = finalizers(ctx.shard)
    if want == (naming.HANDOVER_FINALIZER in have) or (want and ctx.shard["metadata"].get("deletionTimestamp")):
        return
    wanted = [*have, naming.HANDOVER_FINALIZER] if want else [f for f in have if f != naming.HANDOVER_FINALIZER]
    version = ctx.shard["metadata"].get("resourceVersion")
    ctx.do(Patch(naming.SHARD_PLURAL, ctx.name, {"metadata": {"finalizers": wanted, "resourceVersion": version}}))


# ---------------------------------------------------------------- a parent's drain


def await_drain(ctx: ShardContext, on_drained: Any) -> None:
    """A parent's pod while it hands its range over (a split's Draining, a merge's Merging): a missing pod is
    created (it resumes from its recovery log and drains once its successors are ready), a failing one is reported
    (``restartPolicy: OnFailure`` restarts it in place), one that exited 0 without a snapshot manifest is deleted
    to drain again; once it exited drained, ``on_drained(termination)``."""
    pod = ctx.pod
    if not pod.exists:
        create_pod(ctx, restarts_base=int(ctx.status.get("restarts") or 0) + 1)
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
        on_drained(term)
        return
    if term.exit_code == 0 or pod.phase in ("Failed", "Succeeded"):
        # Ended without a snapshot manifest: nothing to restore from; run the drain again from the recovery log.
        message = (
            f"driver pod {pod.name} ended (exit code {term.exit_code}) without a snapshot manifest in its "
            f"termination message {term.message!r}; recreating it to drain again"
        )
        assert pod.name is not None  # an existing pod has a name
        ctx.do(Delete("pods", pod.name, grace=0))
        ctx.write({"conditions": [ctx.cond(st.DEGRADED, True, "DrainWithoutManifest", message)]})
        ctx.event("Warning", "DrainWithoutManifest", message)


def drained_status(ctx: ShardContext, term: st.Termination, *, note: str = "") -> tuple[dict[str, Any], str]:
    """The status patch (``finalCheckpoint``, ``lastCheckpoint``, the live fields, conditions) and the message of
    a parent whose runtime ended its final drain (``term``, its pod's termination)."""
    final = term.checkpoint(with_manifest=True) or {"manifest": term.manifest}
    final.setdefault("batchId", 0)
    message = f"drained at batch {final['batchId']}; snapshot manifest {term.manifest}{note}"
    patch = {
        "finalCheckpoint": final,
        "lastCheckpoint": final,
        **ended_live(ctx, final),
        "restarts": ctx.pod.restarts,
        "conditions": [
            ctx.cond(st.PROGRESSING, True, "Drained", message),
            ctx.cond(st.DEGRADED, False, "Healthy", ""),
        ],
    }
    return patch, message


def show_stall(ctx: Any, accepted_time: Any, bound: int, reason: str, describe: Any) -> None:
    """A hand-over's bound (a split's SplitStalled, a merge's MergeStalled): once it was accepted (``accepted_time``,
    RFC 3339) longer ago than ``bound`` seconds, Degraded=True with ``reason`` and the message ``describe(elapsed)``,
    and one Warning event when the condition first shows it; before that, a pass when the bound passes."""
    accepted = st.parse_time(accepted_time)
    if accepted is None:
        return
    elapsed = (dt.datetime.now(dt.UTC) - accepted).total_seconds()
    if elapsed < bound:
        ctx.decision.again_in(bound - elapsed + 1)
        return
    message = describe(elapsed)
    shown = st.get_condition((ctx.shard.get("status") or {}).get("conditions"), st.DEGRADED) or {}
    if shown.get("reason") != reason:
        ctx.event("Warning", reason, message)
    ctx.write({"conditions": [ctx.cond(st.DEGRADED, True, reason, message)]})
