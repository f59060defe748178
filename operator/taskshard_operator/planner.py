"""Pure planners: what to do, decided from observed state; the handlers only carry the decisions out.

- :func:`plan_split`: accept, refuse or ignore a shard's ``spec.split`` request.
- :func:`plan_merge`: accept or refuse a shard's ``spec.merge`` request.
- :func:`plan_task_shards`: which initial shards a Task still needs, and whether its active shards tile
  ``[0, maxKeyGroups)`` (when they would not, it creates nothing).
- :func:`range_conflicts`: the shards that own part of a shard's range (it starts no pod while any exists).
- :func:`plan_roll`: which shard to roll next after a template change (one at a time, a stuck shard first);
  :func:`roll_held`: the shard a roll stopped at.
- :func:`task_phase`: the Task's phase summarised from its shards.

Errors and refusals name the field and the value and say what a valid value looks like.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from spark_runtime.keygroups import KeyGroupError, KeyGroupRange, TilingError, check_tiling, initial_ranges
from taskshard_operator import naming
from taskshard_operator.models.shard import ShardPhase, SplitBy
from taskshard_operator.models.task import TaskPhase
from taskshard_operator.split_points import LoadSplitPoint, load_split_point

# ---------------------------------------------------------------- split


@dataclass(frozen=True)
class SplitAccepted:
    """A valid request: split at ``at`` into ``children`` (lower range first)."""

    at: int
    children: tuple[KeyGroupRange, KeyGroupRange]
    load: LoadSplitPoint | None = None
    """``by: load`` or ``by: state`` (see :attr:`by`): the point's expected shares and the rows it was chosen
    from."""
    by: SplitBy | None = None
    """How the point was chosen (None: given as ``spec.split.at``)."""
    state_batch: int | None = None
    """``by: state``: the committed batch the state rows were counted at."""


@dataclass(frozen=True)
class SplitRefused:
    """An invalid request; ``field`` and ``message`` go into the SplitRejected condition and an event."""

    field: str
    message: str


SplitDecision = SplitAccepted | SplitRefused | None


def split_requested(split: Mapping[str, Any] | None) -> bool:
    return bool(split) and split.get("requested") is True


@dataclass(frozen=True)
class SplitWithdrawn:
    """``spec.split`` no longer asks for the split in progress: abort it if it has not handed over yet."""


@dataclass(frozen=True)
class SplitUnchanged:
    """A new generation that still asks for the split in progress (another field changed, or ``at`` repeated)."""


def plan_split_change(
    *, shard: str, phase: ShardPhase, accepted_at: int, split: Mapping[str, Any] | None
) -> SplitWithdrawn | SplitUnchanged | SplitRefused:
    """Decide on a new generation of ``spec.split`` while a split of the shard is in progress (``phase`` is one of
    the split's phases, ``accepted_at`` its point). Withdrawing it aborts the split before the hand-over (the
    caller knows whether that is still possible); asking for another point is refused with the way out named."""
    if not split_requested(split):
        return SplitWithdrawn()
    at = split.get("at")
    if at is None or at == accepted_at:
        return SplitUnchanged()
    return SplitRefused(
        "spec.split.at",
        f"spec.split.at: {at!r}: shard {shard} is splitting at key group {accepted_at} (phase {phase.value}); a "
        "second split request is refused. Wait until the split finished and split a child, or withdraw the "
        "request (spec.split.requested: false) to abort the split while it has not handed over",
    )


def split_by(split: Mapping[str, Any] | None) -> SplitBy:
    """``spec.split.by`` (midpoint when absent or unknown: the API server enforces the enum)."""
    try:
        return SplitBy((split or {}).get("by") or SplitBy.MIDPOINT)
    except ValueError:
        return SplitBy.MIDPOINT


def plan_split(
    *,
    shard: str,
    key_groups: KeyGroupRange,
    phase: ShardPhase,
    split: Mapping[str, Any] | None,
    load: Mapping[tuple[int, int], float] | None = None,
    load_seconds: float = 0.0,
    state: Mapping[tuple[int, int], float] | None = None,
    state_batch: int | None = None,
) -> SplitDecision:
    """Decide on ``spec.split`` of a shard that has not accepted a split yet.

    Returns None when no split is requested, :class:`SplitAccepted` for a valid request of a Running shard,
    else :class:`SplitRefused` (nothing may change then). The point is ``at``, else chosen as ``by`` says: the
    midpoint, or (``by: load``) where ``load`` (rows per key-group bucket over ``load_seconds``, from the
    shard's load map; None: no scrape with a load map) divides in half, or (``by: state``) where ``state`` (state
    rows per key-group bucket at committed batch ``state_batch``; None: no state map) divides in half.
    """
    if not split_requested(split):
        return None
    at = split.get("at")
    refused = _refuse_split_at(shard, key_groups, phase, at)
    if refused is not None:
        return refused
    point = None
    by = split_by(split) if at is None and split_by(split) != SplitBy.MIDPOINT else None
    if by is not None:
        rows = load if by == SplitBy.LOAD else state
        point = load_split_point(key_groups, rows or {})
        if point is None:
            return SplitRefused(
                "spec.split.by",
                f"spec.split.by: {by.value}: shard {shard} has {_no_point(by, rows, load_seconds)}; or split by "
                "midpoint, or give spec.split.at",
            )
        at = point.at
    try:
        low, high = key_groups.split(at)
    except KeyGroupError as e:  # defensive: the checks above cover every case KeyGroupRange.split refuses
        return SplitRefused("spec.split.at", f"spec.split.at: {e}")
    return SplitAccepted(
        at=low.end,
        children=(low, high),
        load=point,
        by=by,
        state_batch=state_batch if by == SplitBy.STATE else None,
    )


def _refuse_split_at(shard: str, key_groups: KeyGroupRange, phase: ShardPhase, at: Any) -> SplitRefused | None:
    """Why a split of ``shard`` (``spec.split.at``: ``at``) cannot be accepted whatever its point, else None."""
    if phase != ShardPhase.RUNNING:
        return SplitRefused(
            "spec.split.requested",
            f"spec.split.requested: shard {shard} is in phase {phase.value}; only a Running shard can be split "
            "(wait until status.phase is Running, then set spec.split again)",
        )
    if key_groups.size < 2:
        return SplitRefused(
            "spec.split.requested",
            f"spec.split.requested: spec.keyGroups {key_groups} of shard {shard} holds one key group and cannot "
            "be split (a split needs end - start >= 2)",
        )
    if at is not None and (
        isinstance(at, bool) or not isinstance(at, int) or not key_groups.start < at < key_groups.end
    ):
        return SplitRefused(
            "spec.split.at",
            f"spec.split.at: {at!r} is not strictly inside spec.keyGroups {key_groups} of shard {shard}; use an "
            f"integer with {key_groups.start} < at < {key_groups.end}, or omit it to split at the midpoint "
            f"{key_groups.midpoint()}",
        )
    return None


def _no_point(by: SplitBy, rows: Mapping[tuple[int, int], float] | None, load_seconds: float) -> str:
    """Why ``by`` found no split point, for the refusal (``rows``: the load or state map; None: none)."""
    enable = 'set spec.spark.conf spark.taskshard.keyGroupMetrics: "true" on the Task'
    if by == SplitBy.LOAD:
        if rows is None:
            return (
                f"no load map: {enable} (the shard then counts its input rows per key group) and wait for its "
                "next metrics scrape"
            )
        window = f"the last {load_seconds:.0f} s" if load_seconds else "its pod's lifetime"
        return f"its load map counted no input rows in {window}"
    if rows is None:
        return (
            f"no state map yet: {enable} (the shard then counts its state rows per key group every "
            "spark.taskshard.stateMapSeconds, 60 by default, once it committed a batch) and wait for its next "
            "metrics scrape (status.live.stateMapBatch)"
        )
    return "no state rows in its state map (nothing to divide)"


def child_names(task: str, children: Iterable[KeyGroupRange], family: str | None = None) -> list[str]:
    """Deterministic child names, lower range first (in the parent's merge ``family``, if any)."""
    return [naming.shard_name(task, r, family) for r in children]


# ---------------------------------------------------------------- merge


@dataclass(frozen=True)
class MergeAccepted:
    """A valid ``spec.merge``: this shard and ``right`` become ``into`` over ``key_groups``."""

    right: str
    into: str
    key_groups: KeyGroupRange
    family: str


@dataclass(frozen=True)
class MergeRefused:
    """An invalid ``spec.merge``; the message goes into the MergeRejected condition and an event. ``waits``: not
    now, but possibly soon (a shard is starting or restarting, Pending or Failed): the request stays undecided and
    is looked at again."""

    message: str
    waits: bool = False


MERGE_WAITS_FOR = frozenset({ShardPhase.PENDING, ShardPhase.FAILED})
"""Phases a merge's shard may leave for Running by itself: a request waits for them instead of being refused."""


def plan_merge(
    *,
    task: str,
    left: ShardView,
    right: ShardView | None,
    right_name: str,
    right_wants: str | None = None,
    named_by: str | None = None,
) -> MergeAccepted | MergeRefused:
    """Accept or refuse ``spec.merge: {with: right_name}`` of shard ``left`` (pure). ``right`` is that TaskShard
    of the same Task (None: none); ``right_wants`` what the right shard asks for itself (a ``spec.merge`` or a
    ``spec.split``, described), ``named_by`` a merge in progress that names ``left`` as its right shard.

    Refused when the right shard does not exist, is this shard, is not the right neighbour
    (``left.end != right.start``), when either is not Running (suspended, splitting, merging or handed over), or
    when either is about to hand its range over otherwise; a shard that is starting or restarting (Pending,
    Failed) makes the request wait (``waits``)."""
    where = f"spec.merge.with: {right_name!r}"
    if right is None:
        return MergeRefused(f"{where}: no TaskShard of that name belongs to Task {task}")
    if right.name == left.name:
        return MergeRefused(f"{where} is this shard itself; name its right neighbour")
    if right.key_groups.start != left.key_groups.end:
        return MergeRefused(
            f"{where} owns {right.key_groups}, which does not start where {left.name} {left.key_groups} ends "
            f"(key group {left.key_groups.end}); set spec.merge on the left one of two adjacent shards, naming its "
            "right neighbour"
        )
    for shard in (left, right):
        if shard.phase in MERGE_WAITS_FOR:
            return MergeRefused(
                f"{where}: waiting until {shard.name} runs again (it is {shard.phase.value}); the merge starts once "
                "both shards are Running",
                waits=True,
            )
        if shard.phase != ShardPhase.RUNNING:
            return MergeRefused(
                f"{where}: {shard.name} is {shard.phase.value}; both shards must be Running (not suspended, "
                "splitting, merging or handed over) for a merge to start"
            )
    if named_by is not None:
        return MergeRefused(f"{where}: {left.name} is merging into {named_by} already (as the right shard)")
    if right_wants is not None:
        return MergeRefused(f"{where}: {right.name} asks for {right_wants} itself; one hand-over at a time")
    family = naming.merge_family(left.name, right.name)
    merged = KeyGroupRange(left.key_groups.start, right.key_groups.end)
    return MergeAccepted(right.name, naming.shard_name(task, merged, family), merged, family)


# ---------------------------------------------------------------- task


@dataclass(frozen=True)
class ShardView:
    """What the Task-level planners need to know about one TaskShard (and its pod)."""

    name: str
    key_groups: KeyGroupRange
    phase: ShardPhase
    restored: bool = False
    """True for a split child (``spec.restoreFrom`` set)."""
    wanted_hash: str | None = None
    """The template hash the shard should run (its ``taskshard.io/template-hash`` annotation)."""
    pod_hash: str | None = None
    """The template hash its driver pod runs (the pod's annotation), None without a pod."""
    pod_ready: bool = False
    """True when the driver pod's container is running."""
    parent: str | None = None
    """A split child's parent (``spec.restoreFrom.parent``)."""
    merge_parents: tuple[str, ...] = ()
    """A merged shard's two parents (``spec.mergeFrom``), left first."""
    drained_for_merge: bool = False
    """A merge parent whose pod drained for good (Merging with ``status.finalCheckpoint``, or Merged)."""
    degraded_reason: str | None = None
    """The reason of its Degraded condition while that is True (e.g. MergeStalled), else None."""
    pod_stuck: bool = False
    """Its driver pod cannot run as it is: it gave up or crash-loops, or waits on its image or its config
    (:attr:`taskshard_operator.status.PodView.stuck`)."""
    pod_restarts: int = 0
    """In-place restarts of its current driver pod (each one a failure of that pod's template)."""

    @property
    def stuck(self) -> bool:
        """The shard cannot become Ready on the template its pod runs, and emits nothing meanwhile: Failed, for any
        reason (a crash loop, a processor that raises, a source or sink it cannot use, a refused template, a pod
        that ended; a replaced pod keeps it Failed until it commits), or its pod cannot start (Pending or Running
        with a pod that waits on its image or config, or crash-loops before the shard's status says so)."""
        if self.phase == ShardPhase.FAILED:
            return True
        return self.phase in (ShardPhase.PENDING, ShardPhase.RUNNING) and self.pod_stuck

    @property
    def active(self) -> bool:
        """The shard's phase owns its range (see :func:`owners` for children on standby)."""
        return self.phase.owns_range

    @property
    def parents(self) -> tuple[str, ...]:
        """Its split parent, or its merge parents, or none."""
        return (self.parent,) if self.parent else self.merge_parents


PARENT_OWNS_RANGE = frozenset(p for p in ShardPhase if p.holds_range_for_children)
"""A split or merge parent's phases in which it still owns its range although its children exist (they are on
standby)."""


def merges_taken_over(shards: Iterable[ShardView]) -> set[str]:
    """The merged shards that own their range already: every parent drained for the merge (or is gone). Until then
    both parents own theirs, so the ownership of the merged range moves at one observed moment, never leaving a
    gap or an overlap in the tiling."""
    shards = list(shards)
    by_name = {s.name: s for s in shards}
    return {
        s.name
        for s in shards
        if s.merge_parents and all(p not in by_name or by_name[p].drained_for_merge for p in s.merge_parents)
    }


def owners(shards: Iterable[ShardView]) -> list[ShardView]:
    """The shards that own their key groups: an owning phase, except children on standby (a parent, present in
    ``shards``, is in :data:`PARENT_OWNS_RANGE`) and merge parents whose merged shard took over
    (:func:`merges_taken_over`)."""
    shards = list(shards)
    taken = merges_taken_over(shards)
    handed = {p for s in shards if s.name in taken for p in s.merge_parents}
    holding = {s.name for s in shards if s.phase.holds_range_for_children and s.name not in handed}
    return [s for s in shards if s.active and s.name not in handed and not set(s.parents) & holding]


@dataclass(frozen=True)
class TaskPlan:
    create: tuple[KeyGroupRange, ...]
    """Initial ranges whose shards are missing (empty once any split happened)."""
    tiling_error: str | None
    """Why the active shards do not tile ``[0, maxKeyGroups)``, or None."""


def plan_task_shards(*, task: str, max_key_groups: int, initial_shards: int, shards: Iterable[ShardView]) -> TaskPlan:
    """Initial shards to create and the tiling check.

    The initial ranges are ``initial_ranges(initialShards, maxKeyGroups)``; each is created when no shard of that
    name exists, unless a split already happened (a child exists), after which the shards are what the splits
    made of them. The tiling check covers the active shards after the planned creations.
    """
    shards = list(shards)
    names = {s.name for s in shards}
    create: tuple[KeyGroupRange, ...] = ()
    if not any(s.restored for s in shards):
        create = tuple(
            r for r in initial_ranges(initial_shards, max_key_groups) if naming.shard_name(task, r) not in names
        )
    active = [s.key_groups for s in owners(shards)] + list(create)
    try:
        check_tiling(active, max_key_groups)
        error = None
    except TilingError as e:
        error = str(e)
    # Tiling is an invariant, not a report: a creation that would not tile (an edited initialShards, a stray
    # TaskShard) is not made, so no key group gets a second owner.
    return TaskPlan(create=() if error else create, tiling_error=error)


def range_conflicts(shard: ShardView, shards: Iterable[ShardView]) -> list[ShardView]:
    """The other shards that own key groups of ``shard``'s range (ascending): ``shard`` must not start a pod while
    any exists, or those key groups would be processed twice. A split child overlaps only its own parent, and a
    merged shard only its two parents, which it waits for on standby (processing nothing until their drain
    summaries exist): not a conflict."""
    r = shard.key_groups
    return sorted(
        (
            s
            for s in owners(shards)
            if s.name != shard.name
            and s.name not in shard.parents
            and s.key_groups.start < r.end
            and r.start < s.key_groups.end
        ),
        key=lambda s: s.key_groups,
    )


def plan_roll(target_hash: str, shards: Iterable[ShardView]) -> str | None:
    """The next shard to roll to ``target_hash``, or None (nothing to roll, or wait).

    One at a time: a shard told to roll (``wanted_hash == target``) holds the roll until its pod runs the target
    and it is no longer :attr:`~ShardView.stuck` (a shard that was Failed stays so until its new pod commits a
    batch), so a template that a shard's runtime refuses, or that fails there, stops the roll at that shard
    (:func:`roll_held`). First the stuck shards (:attr:`ShardView.stuck`: Failed for any reason, or a pod that
    cannot start), whatever their back-off: they cannot become Ready on their template, so a new template (the
    user's fix) goes to them before anything else, and a roll never waits on them; then the Running shards. Other
    phases are not rolled (a splitting or merging shard's successors are created with the new template; a
    suspended shard resumes with it). Order within each: key-group order.
    """
    shards = sorted(owners(shards), key=lambda s: s.key_groups)
    for s in shards:
        if s.wanted_hash == target_hash and not (s.pod_hash == target_hash and s.pod_ready and not s.stuck):
            return None  # a roll is in progress (or held)
    stuck = [s for s in shards if s.stuck]
    running = [s for s in shards if s.phase == ShardPhase.RUNNING and not s.stuck]
    return next((s.name for s in stuck + running if s.wanted_hash != target_hash), None)


def roll_held(target_hash: str, shards: Iterable[ShardView]) -> ShardView | None:
    """The shard a roll to ``target_hash`` stopped at because that template fails there too, else None: told to
    roll, its pod runs the target, and it is still :attr:`~ShardView.stuck` with that pod failed at least once (not
    running, or restarted), while other shards wait for the template. A shard that only recovers (its new pod
    runs, no commit yet) holds no roll, nor does the last shard of a roll (nothing waits: its failure is its own
    Degraded condition). The roll stays there, rolling nothing else, until the shard runs or the template changes
    again (then it goes there first)."""
    active = sorted(owners(shards), key=lambda s: s.key_groups)
    if all(s.wanted_hash == target_hash for s in active):
        return None
    for s in active:
        failed_once = not s.pod_ready or s.pod_restarts > 0
        if s.wanted_hash == target_hash and s.pod_hash == target_hash and s.stuck and failed_once:
            return s
    return None


def task_phase(shards: Iterable[ShardView], *, tiling_error: str | None = None, suspended: bool = False) -> TaskPhase:
    """Summarise the shards: Suspended (``spec.suspend``) > Splitting > Merging > Degraded > Pending > Running (see
    ``TaskPhase``); broken tiling is Degraded."""
    shards = list(shards)
    active = owners(shards)
    if suspended and tiling_error is None:
        return TaskPhase.SUSPENDED
    if tiling_error is not None or not active:
        return TaskPhase.PENDING if tiling_error is None or not shards else TaskPhase.DEGRADED
    if any(s.phase.splitting for s in shards):
        return TaskPhase.SPLITTING
    if any(s.phase.merging for s in shards):
        return TaskPhase.MERGING
    if any(s.phase == ShardPhase.FAILED for s in active):
        return TaskPhase.DEGRADED
    if all(s.phase == ShardPhase.RUNNING for s in active):
        return TaskPhase.RUNNING
    return TaskPhase.PENDING
