"""The TaskShard phase machine: which ``status.phase`` transitions the operator may write (pure).

The closed enum is :class:`~taskshard_operator.models.shard.ShardPhase`. This is the one drawing of the machine;
:data:`ALLOWED` below is the table the operator enforces (every status write goes through
:func:`check_transition`), and a unit test checks that every allowed transition is drawn here. Each line reads
``sources ──what happens──> target [──what happens──> target ...]`` (``|`` separates alternatives)::

    (new TaskShard) ──created──> Pending
    Pending ──its pod runs──> Running ──its pod failed──> Failed ──its pod runs again──> Running
    Pending ──the pod failed before it ran──> Failed ──the pod is replaced──> Pending
    Running ──pod replaced (a roll, a deleted pod)──> Pending
    Pending | Running | Failed ──the Task is suspended, the pod gone──> Suspended ──resumed──> Pending
    Pending | Running | Failed | Suspended ──the Task is deleted──> Stopped
    Pending | Running ──a valid spec.split──> SplitRequested ──children created──> Draining
    Draining ──the pod exited drained──> Drained ──the pod deleted──> ChildrenCreated ──children seen──> Split
    SplitRequested | Draining ──spec.split withdrawn──> AbortingSplit ──undone by the parent's pod──> Pending
    AbortingSplit ──the parent had drained first──> Drained
    Running ──a valid spec.merge (left shard)──> MergeRequested ──merged shard created──> Merging
    MergeRequested ──spec.merge withdrawn, or the right shard is gone──> Running
    Pending | Running | Failed ──a merged shard names it (right shard)──> Merging
    Merging ──the pod drained, and the other parent too──> Merged
    Merging ──spec.merge withdrawn (left)──> AbortingMerge ──no parent had drained──> Running
    AbortingMerge ──a parent had drained: the merge completes──> Merging
    Merging ──the left shard undid the merge (right)──> Running

Split, Merged and Stopped are terminal. ``Pending -> SplitRequested`` is not used by the split planner (it needs
Running); it exists so that a shard whose pod status was not observed yet cannot be forced into an inconsistent
state by a stale read.

Contracts:
- Writing the same phase again is always allowed (idempotent retries after a crash).
- A hand-over goes forward, or back only while no parent has drained: a split through AbortingSplit (withdrawn
  before the parent's runtime wrote its drain summary), a merge through Running (withdrawn before the merged
  shard exists) or AbortingMerge (after: undone unless a parent drained, then it completes). From Drained on a
  split is completed, never rolled back (a failed drain is retried by the pod's restart policy).
- Every phase's meaning is on the enum; ownership (``owns_range``) and the other facts too.
"""

from __future__ import annotations

from taskshard_operator.models.shard import ShardPhase

P = ShardPhase

ALLOWED: dict[ShardPhase, frozenset[ShardPhase]] = {
    P.PENDING: frozenset({P.RUNNING, P.FAILED, P.SPLIT_REQUESTED, P.STOPPED, P.SUSPENDED, P.MERGING}),
    P.RUNNING: frozenset(
        {P.PENDING, P.FAILED, P.SPLIT_REQUESTED, P.STOPPED, P.SUSPENDED, P.MERGE_REQUESTED, P.MERGING}
    ),
    P.FAILED: frozenset({P.PENDING, P.RUNNING, P.STOPPED, P.SUSPENDED, P.MERGING}),
    P.SUSPENDED: frozenset({P.PENDING, P.STOPPED}),
    P.SPLIT_REQUESTED: frozenset({P.DRAINING, P.ABORTING_SPLIT}),
    P.DRAINING: frozenset({P.DRAINED, P.ABORTING_SPLIT}),
    P.ABORTING_SPLIT: frozenset({P.PENDING, P.DRAINED}),
    P.DRAINED: frozenset({P.CHILDREN_CREATED}),
    P.CHILDREN_CREATED: frozenset({P.SPLIT}),
    P.SPLIT: frozenset(),
    P.MERGE_REQUESTED: frozenset({P.MERGING, P.RUNNING}),
    P.MERGING: frozenset({P.MERGED, P.ABORTING_MERGE, P.RUNNING}),
    P.ABORTING_MERGE: frozenset({P.RUNNING, P.MERGING}),
    P.MERGED: frozenset(),
    P.STOPPED: frozenset(),
}
"""Allowed ``old -> new`` transitions (besides ``old -> old``). ``Pending -> SplitRequested`` is not used by
the split planner (it needs Running) and exists only so that a shard whose pod status was not observed yet
cannot be forced into an inconsistent state by a stale read."""

SPLIT_STEPS = (P.SPLIT_REQUESTED, P.DRAINING, P.DRAINED, P.CHILDREN_CREATED, P.SPLIT)
"""The split protocol's phases, in order (each is written before the step it names is acted on)."""

TERMINAL = frozenset(p for p in P if p.terminal)


class TransitionError(ValueError):
    """A phase change the machine forbids; the message names both phases and the allowed targets."""


def parse_phase(value: str | None) -> ShardPhase:
    """``status.phase`` as an enum; an absent phase is Pending (a new shard)."""
    return ShardPhase(value) if value else ShardPhase.PENDING


def can_transition(old: ShardPhase, new: ShardPhase) -> bool:
    return old == new or new in ALLOWED[old]


def check_transition(old: ShardPhase, new: ShardPhase) -> ShardPhase:
    """Return ``new`` if ``old -> new`` is allowed, else raise :class:`TransitionError`."""
    if not can_transition(old, new):
        allowed = ", ".join(sorted(p.value for p in ALLOWED[old])) or "none (terminal)"
        raise TransitionError(f"status.phase: {old.value} -> {new.value} is not allowed; from {old.value}: {allowed}")
    return new


def is_splitting(phase: ShardPhase) -> bool:
    """True between an accepted split request and the end of the protocol (Split excluded)."""
    return phase.splitting
