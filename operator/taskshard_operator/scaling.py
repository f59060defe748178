"""Scaling a Task to ``spec.shards``: what to do about it, decided by a pure function (the Task pass acts on it).

``spec.shards`` is the desired number of active shards, the replicas of the Task's scale subresource:
``kubectl scale task NAME --replicas N``, a HorizontalPodAutoscaler or KEDA set it. With ``spec.autoscale`` the
count the autoscaler wants (:mod:`taskshard_operator.autoscale`, ``status.autoscale.desiredShards``) takes its place
(the two exclude each other). The count grows by splits and shrinks by merges. :func:`decide_scaling` applies
these rules, in this order, on every Task pass:

1. ``spec.shards`` unset: nothing to do (NoChange; condition ``Scaled=True`` reason NotRequested). The operator
   never changes the shard count on its own; shards split or merge only when someone sets a TaskShard's
   ``spec.split`` or ``spec.merge``.
2. Fewer than the active shards: **one merge at a time, on a quiet Task** (the same reasons to wait as rule 4,
   ``Scaled=False`` reason WaitingForMerge; a merge request, ``spec.merge``, its pass has not decided yet counts
   as a hand-over in progress). Otherwise merge the coldest pair of adjacent active shards L, R (Merge;
   ``Scaled=False`` reason MergingShards, a Normal event ScalingDown): the fewest input rows of both together
   over the load window; without load data for both, the narrowest pair, then key-group order. The Task pass
   sets L's ``spec.merge: {with: R}``; the merge protocol (``merge_protocol``) does the rest. A request that
   would repeat one L's pass refused exactly is not made: the next coldest pair is taken instead, and when every
   pair was refused the scaler is stuck (Wait; ``Scaled=False`` reason ScalingStuck, naming each refused shard and
   its MergeRejected message).
3. As many as the active shards: nothing to do (NoChange; ``Scaled=True`` reason DesiredShards).
4. More than the active shards: **one split at a time, on a quiet Task**. Wait (Wait; ``Scaled=False`` reason
   WaitingForSplit, the message says for what) while

   - the Task pass reports a reason not to act (``blocked``: the active shards do not tile, initial shards are
     still being created, a template roll is under way, ``spec.suspend`` is true);
   - any shard of the Task is in a split or merge phase (SplitRequested, Draining, Drained, ChildrenCreated,
     AbortingSplit, MergeRequested, Merging), or an active one has a ``spec.split`` or ``spec.merge`` request its
     own pass has not decided yet (the generation is not observed): never a second hand-over while one is under
     way, whoever asked for it;
   - any active shard is not Running, or runs but does not emit yet (its Ready condition is not True: a split
     child finishing its hand-over, a shard starting its query);
   - the Task counts load maps (``spark.taskshard.keyGroupMetrics: "true"``) and a shard that could be split has
     none yet, for at most :data:`LOAD_GRACE_SECONDS` after it started emitting (``awaiting_load``): the
     children of a split just done are then compared by their input rows, not by width alone.

   Otherwise split one shard S (Split; ``Scaled=False`` reason SplittingShard, a Normal event ScalingUp): the
   active shard of two or more key groups with the most input rows over the load window (its load map:
   ``taskshard_operator.live``, :data:`~taskshard_operator.live.LOAD_WINDOW_SECONDS`); ties and shards without
   load data: the widest range, then key-group order. The point: ``by: load`` (where S's rows divide in half)
   when S's load map counted rows in its range, else ``by: midpoint`` (also when S's last split request was
   refused, so a refused ``by: load`` is not asked again). The Task pass sets S's
   ``spec.split: {requested: true, by: ...}``; the split protocol (``split_protocol``) does the rest. A shard
   whose pass refused exactly that request is passed over for the next candidate; when every candidate was
   refused the scaler is stuck (ScalingStuck, as for merges).

So 1 -> 3 shards is two consecutive splits: the second shard is chosen only once the first split is over
(both children Running and emitting, the parent Split: no longer an owner). It is idempotent: a request that S's
pass has not taken yet makes the next pass wait instead of patching again, and a request that would repeat a
refused one exactly is not made. Lowering ``spec.shards`` does not withdraw a split already requested (withdraw
it by hand, ``spec.split.requested: false``, before the hand-over); withdrawing a split while ``spec.shards``
still asks for more shards makes the next pass ask again.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spark_runtime.keygroups import KeyGroupRange
from taskshard_operator import planner
from taskshard_operator import status as st
from taskshard_operator.live import Scraped
from taskshard_operator.models.shard import ShardPhase, SplitBy
from taskshard_operator.models.task import ScalingDecision

__all__ = [
    "DESIRED_SHARDS",
    "LOAD_GRACE_SECONDS",
    "MERGING_SHARDS",
    "NOT_REQUESTED",
    "SCALING_STUCK",
    "SPLITTING_SHARD",
    "WAITING_FOR_SPLIT",
    "Scaling",
    "ShardLoad",
    "MergeAsk",
    "SplitAsk",
    "decide_scaling",
    "rows_in_range",
    "WAITING_FOR_MERGE",
    "busy_reason",
    "merge_ask",
    "shard_load",
    "split_ask",
    "split_request",
]

NOT_REQUESTED = "NotRequested"
DESIRED_SHARDS = "DesiredShards"
SPLITTING_SHARD = "SplittingShard"
WAITING_FOR_SPLIT = "WaitingForSplit"
MERGING_SHARDS = "MergingShards"
WAITING_FOR_MERGE = "WaitingForMerge"
SCALING_STUCK = "ScalingStuck"
"""Every candidate's pass refused the request the scaler would make: nothing it can do moves the count (the
message names each refused shard; with ``spec.autoscale`` the autoscaler gives the step up)."""

LOAD_GRACE_SECONDS = 60.0
"""How long after a shard started emitting (its Ready condition turned True) the scaler waits for its first load
map (a scrape of its pod, every ``--live-status-seconds``) before it chooses without it, when the Task counts
load maps."""

NO_LOAD_DATA = (
    'no load data (spark.taskshard.keyGroupMetrics is not "true" in the Task\'s spark.conf, or no scrape yet)'
)
NO_ROWS = "no input rows in the load window"


@dataclass(frozen=True)
class ShardLoad:
    """A shard's input rows in its own range over the load window, from its current pod's load map."""

    rows: float
    seconds: float
    """The time the rows cover; 0 when they hold everything since the pod's runtime started."""

    def describe(self) -> str:
        window = f"in the last {self.seconds:.0f} s" if self.seconds else "since its pod started"
        return f"{int(self.rows):,} {window}"


@dataclass(frozen=True)
class SplitAsk:
    """A shard's ``spec.split`` as the scaler sees it."""

    split: Mapping[str, Any] | None
    pending: bool = False
    """Requested, and the shard's pass has not decided on it yet (its generation is not observed)."""
    refused: bool = False
    """Requested, decided, and refused (condition SplitRejected=True)."""
    why: str = ""
    """The SplitRejected condition's message when refused."""


@dataclass(frozen=True)
class MergeAsk:
    """A shard's ``spec.merge`` as the scaler sees it."""

    with_: str
    pending: bool = False
    """Its pass has not decided on it yet (the generation is not observed)."""
    refused: bool = False
    """Decided and refused (condition MergeRejected=True)."""
    why: str = ""
    """The MergeRejected condition's message when refused."""


@dataclass(frozen=True)
class Scaling:
    """The decision: what to write in ``status.scaling`` and the Scaled condition, and for Split the shard."""

    decision: ScalingDecision
    reason: str
    message: str
    desired: int | None
    active: int
    shard: str | None = None
    by: SplitBy | None = None
    merge_with: str | None = None
    """Decision Merge: the right shard that ``shard`` merges with."""

    @property
    def scaled(self) -> bool:
        """The Scaled condition's status: True while nothing is to be done."""
        return self.decision == ScalingDecision.NO_CHANGE


def rows_in_range(key_groups: KeyGroupRange, load: Mapping[tuple[int, int], float]) -> float:
    """The rows of ``load`` (rows per ``(start, end)`` bucket) that fall in ``key_groups`` (a bucket that reaches
    past the range counts in proportion, its rows spread evenly over its key groups)."""
    total = 0.0
    for (a, b), n in load.items():
        lo, hi = max(a, key_groups.start), min(b, key_groups.end)
        if hi > lo and b > a and n > 0:
            total += float(n) * (hi - lo) / (b - a)
    return total


def shard_load(key_groups: KeyGroupRange, scraped: Scraped | None, pod_ip: str | None) -> ShardLoad | None:
    """The shard's load over the window from its last scrape, as the split protocol reads it for ``by: load``:
    None without a load map, or when the scrape is of another pod than the one running now."""
    if scraped is None or not scraped.stats.key_group_rows or scraped.pod_ip != pod_ip:
        return None
    return ShardLoad(rows_in_range(key_groups, scraped.load), scraped.load_seconds)


def split_ask(shard: Mapping[str, Any]) -> SplitAsk:
    """The :class:`SplitAsk` of a TaskShard object."""
    split = (shard.get("spec") or {}).get("split")
    if not planner.split_requested(split):
        return SplitAsk(split)
    status = shard.get("status") or {}
    if (shard.get("metadata") or {}).get("generation") != status.get("observedGeneration"):
        return SplitAsk(split, pending=True)
    rejected = st.get_condition(status.get("conditions"), st.SPLIT_REJECTED) or {}
    refused = rejected.get("status") == "True"
    return SplitAsk(split, refused=refused, why=str(rejected.get("message") or "") if refused else "")


def split_request(by: SplitBy, current: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``spec.split`` merge patch that asks for a split ``by`` (an ``at`` left from an earlier request is
    removed: it would override ``by``)."""
    request: dict[str, Any] = {"requested": True, "by": by.value}
    if (current or {}).get("at") is not None:
        request["at"] = None
    return request


def merge_ask(shard: Mapping[str, Any]) -> MergeAsk | None:
    """The :class:`MergeAsk` of a TaskShard object (None: no ``spec.merge``)."""
    merge = (shard.get("spec") or {}).get("merge")
    if not merge:
        return None
    status = shard.get("status") or {}
    if (shard.get("metadata") or {}).get("generation") != status.get("observedGeneration"):
        return MergeAsk(str(merge.get("with")), pending=True)
    rejected = st.get_condition(status.get("conditions"), st.MERGE_REJECTED) or {}
    refused = rejected.get("status") == "True"
    return MergeAsk(str(merge.get("with")), refused=refused, why=str(rejected.get("message") or "") if refused else "")


def _names(views: Iterable[planner.ShardView], limit: int = 5) -> str:
    items = [f"{v.name} ({v.phase.value})" for v in views]
    shown = ", ".join(items[:limit])
    return shown if len(items) <= limit else f"{shown} and {len(items) - limit} more"


def decide_scaling(
    desired: int | None,
    views: Sequence[planner.ShardView],
    *,
    ready: Collection[str],
    loads: Mapping[str, ShardLoad],
    asks: Mapping[str, SplitAsk],
    blocked: str | None = None,
    awaiting_load: Collection[str] = (),
    merges: Mapping[str, MergeAsk] = {},  # noqa: B006 - read only
    wanted_by: str = "spec.shards",
) -> Scaling:
    """Decide about ``spec.shards`` (see the module docstring for the rules).

    ``views`` are all the Task's shards (``views.shard_views``); ``ready`` the names of those whose Ready
    condition is True; ``loads`` the active shards' load over the window (absent: no load data); ``asks`` their
    ``spec.split`` (absent: none); ``blocked`` why the Task pass must not start a split now, or None;
    ``awaiting_load`` the shards whose first load map is expected soon (see :data:`LOAD_GRACE_SECONDS`);
    ``merges`` the shards' ``spec.merge`` (absent: none); ``wanted_by`` names where ``desired`` comes from in the
    messages (``spec.shards``, or the autoscaler's ``status.autoscale.desiredShards``).
    """
    active = planner.owners(views)
    count = len(active)
    if desired is None:
        message = "spec.shards is not set: the shard count changes only when a shard is split by hand (spec.split)"
        return Scaling(ScalingDecision.NO_CHANGE, NOT_REQUESTED, message, None, count)
    if desired == count:
        message = f"{count} active shards, as {wanted_by} asks"
        return Scaling(ScalingDecision.NO_CHANGE, DESIRED_SHARDS, message, desired, count)

    down = desired < count
    want = f"{wanted_by} {desired} {'<' if down else '>'} {count} active shards"
    why_wait = _reason_to_wait(
        views,
        active,
        ready=ready,
        loads=loads,
        asks=asks,
        merges=merges,
        blocked=blocked,
        awaiting_load=awaiting_load,
        down=down,
    )
    waiting = WAITING_FOR_MERGE if down else WAITING_FOR_SPLIT
    if why_wait is not None:
        return Scaling(ScalingDecision.WAIT, waiting, f"{want}; waiting: {why_wait}", desired, count)
    if down:
        return _merge_coldest(want, desired, count, active, loads=loads, merges=merges)
    return _split_busiest(want, desired, count, active, loads=loads, asks=asks)


def _reason_to_wait(
    views: Sequence[planner.ShardView],
    active: Sequence[planner.ShardView],
    *,
    ready: Collection[str],
    loads: Mapping[str, ShardLoad],
    asks: Mapping[str, SplitAsk],
    merges: Mapping[str, MergeAsk],
    blocked: str | None,
    awaiting_load: Collection[str],
    down: bool,
) -> str | None:
    """Rules 2 and 4: the reasons to start no split (``down``: no merge) now, the first that applies, or None:
    the Task is quiet."""
    busy = busy_reason(views, active, ready=ready, asks=asks, merges=merges, blocked=blocked, down=down)
    if busy:
        return busy
    candidates = active if down else [v for v in active if v.key_groups.size >= 2]
    if not candidates:
        return "no active shard has two or more key groups"
    unmeasured = [v for v in candidates if v.name in awaiting_load and v.name not in loads]
    if unmeasured:
        return (
            f"the first load map of {_names(unmeasured)} (a scrape of its pod, at most {LOAD_GRACE_SECONDS:.0f} s "
            f"after it started emitting), to choose the {'shards to merge' if down else 'shard to split'} by input "
            "rows"
        )
    return None


def busy_reason(
    views: Sequence[planner.ShardView],
    active: Sequence[planner.ShardView],
    *,
    ready: Collection[str],
    asks: Mapping[str, SplitAsk],
    merges: Mapping[str, MergeAsk],
    blocked: str | None,
    down: bool | None = None,
) -> str | None:
    """Why no split or merge may start now (None: the Task is quiet): ``blocked`` (the Task pass's reason), a
    hand-over in progress or asked for and not yet decided, an active shard not Running or not emitting. The
    autoscaler holds on the same reasons. ``down``: which kind the message names (None: either)."""
    if blocked:
        return blocked
    splitting = [v for v in views if v.phase.splitting]
    if splitting:
        return f"the split of {_names(splitting)} is in progress (one hand-over at a time)"
    merging = [v for v in views if v.phase.merging]
    if merging:
        return f"the merge of {_names(merging)} is in progress (one hand-over at a time)"
    pending = [v for v in active if (ask := asks.get(v.name)) is not None and ask.pending]
    if pending:
        return f"{_names(pending)} has a split request (spec.split) its pass has not taken yet"
    pending = [v for v in active if (m := merges.get(v.name)) is not None and m.pending]
    if pending:
        return f"{_names(pending)} has a merge request (spec.merge) its pass has not taken yet"
    kind = "split or merge" if down is None else "merge" if down else "split"
    not_running = [v for v in active if v.phase != ShardPhase.RUNNING]
    if not_running:
        return f"{_names(not_running)} not Running yet (a {kind} starts only when every active shard runs)"
    silent = [v for v in active if v.name not in ready]
    if silent:
        return f"{_names(silent)} running but not emitting yet (starting its query or finishing a hand-over)"
    return None


def _merge_coldest(
    want: str,
    desired: int,
    count: int,
    active: Sequence[planner.ShardView],
    *,
    loads: Mapping[str, ShardLoad],
    merges: Mapping[str, MergeAsk],
) -> Scaling:
    """Rule 2 on a quiet Task: merge the adjacent pair with the fewest input rows together (the narrowest pair
    without load data for both) among those whose left shard's pass did not refuse exactly this request
    (none left: ScalingStuck)."""
    ordered = sorted(active, key=lambda v: v.key_groups)
    pairs = [(a, b) for a, b in zip(ordered, ordered[1:], strict=False) if a.key_groups.end == b.key_groups.start]
    if not pairs:  # pragma: no cover - active shards that tile [0, n) with two or more always have a pair
        return Scaling(
            ScalingDecision.WAIT, WAITING_FOR_MERGE, f"{want}; waiting: no two adjacent active shards", desired, count
        )

    def rows(pair: tuple[planner.ShardView, planner.ShardView]) -> float | None:
        both = [loads.get(v.name) for v in pair]
        return None if any(x is None for x in both) else sum(x.rows for x in both if x is not None)

    measured = all(rows(p) is not None for p in pairs)

    def refusal(pair: tuple[planner.ShardView, planner.ShardView]) -> MergeAsk | None:
        ask = merges.get(pair[0].name)
        return ask if ask is not None and ask.refused and ask.with_ == pair[1].name else None

    open_pairs = [p for p in pairs if refusal(p) is None]
    if not open_pairs:
        refused = "; ".join(f"{a.name} with {b.name}: {_refused_because(refusal((a, b)))}" for a, b in pairs)
        why = f"every adjacent pair's merge was refused (see their MergeRejected conditions): {refused}"
        return Scaling(ScalingDecision.WAIT, SCALING_STUCK, f"{want}; stuck: {why}", desired, count)
    left, right = min(
        open_pairs,
        key=lambda p: (rows(p) if measured else 0.0, p[0].key_groups.size + p[1].key_groups.size, p[0].key_groups),
    )
    passed = [p for p in pairs if p not in open_pairs]
    if measured:
        why = f"{left.name} and {right.name} have the fewest input rows together ({int(rows((left, right)) or 0):,})"
    else:
        why = f"{NO_LOAD_DATA}: {left.name} and {right.name} are the narrowest adjacent pair"
    if passed:
        why += " of those not refused (" + ", ".join(f"{a.name} with {b.name}" for a, b in passed) + " was refused)"
    more = count - desired - 1
    after = f"; {more} more merge{'s' if more > 1 else ''} after this one, one at a time" if more else ""
    return Scaling(
        ScalingDecision.MERGE,
        MERGING_SHARDS,
        f"{want}; {why}; merging {left.name} {left.key_groups} with {right.name} {right.key_groups}{after}",
        desired,
        count,
        shard=left.name,
        merge_with=right.name,
    )


def _split_busiest(
    want: str,
    desired: int,
    count: int,
    active: Sequence[planner.ShardView],
    *,
    loads: Mapping[str, ShardLoad],
    asks: Mapping[str, SplitAsk],
) -> Scaling:
    """Rule 4 on a quiet Task: split the shard with the most input rows (widest without load data), by load when
    it counted rows; never repeat a request its pass refused (the next candidate, or ScalingStuck)."""
    candidates = [v for v in active if v.key_groups.size >= 2]

    def rows(v: planner.ShardView) -> float:
        load = loads.get(v.name)
        return load.rows if load is not None else 0.0

    def request(v: planner.ShardView) -> tuple[SplitBy, SplitAsk]:
        load = loads.get(v.name)
        ask = asks.get(v.name) or SplitAsk(None)
        return (SplitBy.LOAD if load is not None and load.rows > 0 and not ask.refused else SplitBy.MIDPOINT), ask

    def refused_again(v: planner.ShardView) -> bool:
        by, ask = request(v)
        return ask.refused and dict(ask.split or {}) == {"requested": True, "by": by.value}

    ranked = sorted(candidates, key=lambda v: (-rows(v), -v.key_groups.size, v.key_groups.start))
    open_candidates = [v for v in ranked if not refused_again(v)]
    if not open_candidates:
        refused = "; ".join(f"{v.name}: {_refused_because(request(v)[1])}" for v in ranked)
        why = f"every shard's split was refused (see their SplitRejected conditions): {refused}"
        return Scaling(ScalingDecision.WAIT, SCALING_STUCK, f"{want}; stuck: {why}", desired, count)
    chosen = open_candidates[0]
    by, ask = request(chosen)
    load = loads.get(chosen.name)
    passed = ranked[: ranked.index(chosen)]
    if load is not None and load.rows > 0:
        why = f"TaskShard {chosen.name} has the most input rows ({load.describe()})"
    else:
        none = NO_ROWS if any(loads.get(v.name) is not None for v in candidates) else NO_LOAD_DATA
        why = f"{none}: TaskShard {chosen.name} {chosen.key_groups} is the widest"
    if passed:
        why += f" of those not refused ({', '.join(v.name for v in passed)} refused this split)"
    how = "by load (where its input rows divide in half)" if by == SplitBy.LOAD else "at the midpoint"
    if ask.refused:
        how += " (its last split request was refused)"
    more = desired - count - 1
    after = f"; {more} more split{'s' if more > 1 else ''} after this one, one at a time" if more else ""
    return Scaling(
        ScalingDecision.SPLIT,
        SPLITTING_SHARD,
        f"{want}; {why}; splitting it {how}{after}",
        desired,
        count,
        shard=chosen.name,
        by=by,
    )


def _refused_because(ask: SplitAsk | MergeAsk | None) -> str:
    why = (ask.why if ask is not None else "").strip()
    return why if why else "refused"
