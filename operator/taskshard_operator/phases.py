"""The TaskShard phase machine: which ``status.phase`` transitions the operator may write (pure).

The closed enum is :class:`~taskshard_operator.models.shard.ShardPhase` (its docstring draws the diagram). This
module is the table the operator enforces; every status write goes through :func:`check_transition`::

    (new) ─> Pending ──pod running──> Running ──valid spec.split──> SplitRequested ──drain asked──> Draining
               ▲  │ ▲                  │  │                                                        │
    replace pod│  │ └─roll / pod gone──┘  │                                 pod exited 0 + manifest │
               │  ▼                       ▼                                                        ▼
               └─ Failed <──pod failed────┘                 Split <──children seen── ChildrenCreated <── Drained
                    └──pod running again──> Running         (terminal)                (both children exist)

    Running ──valid spec.merge (left)──> MergeRequested ──merged shard created──> Merging ──pod drained──> Merged
    Pending | Running | Failed ──a merged shard names it (right)──> Merging                          (terminal)
    Pending | Running | Failed ──Task deleted──> Stopped (terminal)
    Pending | Running | Failed ──Task suspended, pod gone──> Suspended ──resumed──> Pending
    SplitRequested | Draining ──spec.split withdrawn──> AbortingSplit ──parent's pod undid it──> Pending
                                                                     └──it had drained already──> Drained

Contracts:
- Writing the same phase again is always allowed (idempotent retries after a crash).
- A split goes forward, or back only through AbortingSplit: withdrawn (``spec.split.requested: false`` or
  ``spec.split`` removed) before the parent's runtime wrote its drain summary, it is undone and the shard
  resumes; from Drained on it is completed, never rolled back (a failed drain is retried by the pod's restart
  policy, the phase stays Draining).
- A merge only goes forward: accepted, it cannot be withdrawn (its hand-over takes one drain of each parent).
- Split, Merged and Stopped are terminal.
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
    P.MERGE_REQUESTED: frozenset({P.MERGING}),
    P.MERGING: frozenset({P.MERGED}),
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
