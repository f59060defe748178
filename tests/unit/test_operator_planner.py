"""Pure planners: split requests (a table of good and bad ones), initial shards and tiling, rolls, task phase."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as s

from spark_runtime.keygroups import KeyGroupRange as R
from taskshard_operator.models.shard import ShardPhase as P
from taskshard_operator.models.task import TaskPhase
from taskshard_operator.planner import (
    ShardView,
    SplitAccepted,
    SplitRefused,
    child_names,
    owners,
    plan_roll,
    plan_split,
    plan_task_shards,
    range_conflicts,
    roll_held,
    task_phase,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("key_groups", "phase", "split", "expected_at"),
    [
        (R(0, 128), P.RUNNING, {"requested": True}, 64),
        (R(0, 128), P.RUNNING, {"requested": True, "at": 1}, 1),
        (R(0, 128), P.RUNNING, {"requested": True, "at": 127}, 127),
        (R(64, 128), P.RUNNING, {"requested": True}, 96),
        (R(5, 8), P.RUNNING, {"requested": True}, 6),
        (R(5, 7), P.RUNNING, {"requested": True}, 6),
    ],
)
def test_good_requests(key_groups, phase, split, expected_at):
    decision = plan_split(shard="t-x", key_groups=key_groups, phase=phase, split=split)
    assert decision == SplitAccepted(expected_at, (R(key_groups.start, expected_at), R(expected_at, key_groups.end)))


@pytest.mark.parametrize(
    ("key_groups", "phase", "split", "field", "needle"),
    [
        (
            R(0, 128),
            P.RUNNING,
            {"requested": True, "at": 0},
            "spec.split.at",
            "0 is not strictly inside spec.keyGroups [0, 128)",
        ),
        (R(0, 128), P.RUNNING, {"requested": True, "at": 128}, "spec.split.at", "128 is not strictly inside"),
        (R(0, 128), P.RUNNING, {"requested": True, "at": 500}, "spec.split.at", "0 < at < 128"),
        (
            R(64, 128),
            P.RUNNING,
            {"requested": True, "at": 10},
            "spec.split.at",
            "10 is not strictly inside spec.keyGroups [64, 128)",
        ),
        (R(0, 128), P.RUNNING, {"requested": True, "at": "64"}, "spec.split.at", "'64' is not strictly inside"),
        (R(0, 128), P.RUNNING, {"requested": True, "at": True}, "spec.split.at", "True is not strictly inside"),
        (R(7, 8), P.RUNNING, {"requested": True}, "spec.split.requested", "[7, 8) of shard t-x holds one key group"),
        (R(0, 128), P.PENDING, {"requested": True}, "spec.split.requested", "is in phase Pending"),
        (R(0, 128), P.FAILED, {"requested": True}, "spec.split.requested", "is in phase Failed"),
        (R(0, 128), P.DRAINING, {"requested": True}, "spec.split.requested", "is in phase Draining"),
        (R(0, 128), P.SPLIT, {"requested": True, "at": 3}, "spec.split.requested", "is in phase Split"),
    ],
)
def test_bad_requests_are_refused_with_field_and_value(key_groups, phase, split, field, needle):
    decision = plan_split(shard="t-x", key_groups=key_groups, phase=phase, split=split)
    assert isinstance(decision, SplitRefused)
    assert decision.field == field
    assert needle in decision.message
    assert decision.message.startswith(field)


@pytest.mark.parametrize("split", [None, {}, {"requested": False}, {"requested": False, "at": 3}])
def test_no_request(split):
    assert plan_split(shard="t-x", key_groups=R(0, 8), phase=P.RUNNING, split=split) is None


@given(s.integers(0, 1000).flatmap(lambda a: s.tuples(s.just(a), s.integers(a + 2, 1002))), s.data())
def test_accepted_children_tile_the_parent(bounds, data):
    parent = R(*bounds)
    at = data.draw(s.one_of(s.none(), s.integers(parent.start + 1, parent.end - 1)))
    decision = plan_split(shard="t", key_groups=parent, phase=P.RUNNING, split={"requested": True, "at": at})
    assert isinstance(decision, SplitAccepted)
    low, high = decision.children
    assert low.start == parent.start and low.end == high.start == decision.at and high.end == parent.end


def test_child_names_are_deterministic():
    assert child_names("orders", [R(0, 64), R(64, 128)]) == ["orders-0-64", "orders-64-128"]


def view(name, start, end, phase=P.RUNNING, **kw):
    return ShardView(name=name, key_groups=R(start, end), phase=phase, **kw)


def test_initial_shards_created_once():
    plan = plan_task_shards(task="t", max_key_groups=128, initial_shards=2, shards=[])
    assert plan.create == (R(0, 64), R(64, 128)) and plan.tiling_error is None
    plan = plan_task_shards(task="t", max_key_groups=128, initial_shards=2, shards=[view("t-0-64", 0, 64)])
    assert plan.create == (R(64, 128),)
    # After a split (children exist), nothing is re-created and the split parent does not count.
    shards = [
        view("t-0-64", 0, 64, P.SPLIT),
        view("t-0-32", 0, 32, restored=True),
        view("t-32-64", 32, 64, restored=True),
        view("t-64-128", 64, 128),
    ]
    plan = plan_task_shards(task="t", max_key_groups=128, initial_shards=2, shards=shards)
    assert plan.create == () and plan.tiling_error is None


def test_tiling_errors_are_reported():
    shards = [view("t-0-64", 0, 64, P.SPLIT), view("t-0-32", 0, 32, restored=True), view("t-64-128", 64, 128)]
    plan = plan_task_shards(task="t", max_key_groups=128, initial_shards=2, shards=shards)
    assert plan.tiling_error and "gap [32, 64)" in plan.tiling_error
    # During a split the parent owns its range until ChildrenCreated: no overlap with its children then.
    shards = [
        view("t-0-128", 0, 128, P.CHILDREN_CREATED),
        view("t-0-64", 0, 64, P.PENDING, restored=True),
        view("t-64-128", 64, 128, P.PENDING, restored=True),
    ]
    assert plan_task_shards(task="t", max_key_groups=128, initial_shards=1, shards=shards).tiling_error is None


def test_an_edited_initial_shards_creates_nothing_that_would_overlap():
    """initialShards 2 -> 4 on a live Task: [0, 32), [32, 64), ... would overlap the running halves. The CRD
    refuses the edit; should one get through (an older CRD), the planner still creates nothing."""
    running = [view("t-0-64", 0, 64), view("t-64-128", 64, 128)]
    plan = plan_task_shards(task="t", max_key_groups=128, initial_shards=4, shards=running)
    assert plan.create == ()
    assert plan.tiling_error and "overlap [0, 32) between [0, 32) and [0, 64)" in plan.tiling_error


def test_a_shard_starts_no_pod_over_a_range_another_shard_owns():
    running = [view("t-0-64", 0, 64), view("t-64-128", 64, 128)]
    stray = view("stray", 32, 96, P.PENDING)
    assert [c.name for c in range_conflicts(stray, [*running, stray])] == ["t-0-64", "t-64-128"]
    # The running shards conflict with the stray too: a replacement pod for either waits until it is gone.
    assert [c.name for c in range_conflicts(running[0], [*running, stray])] == ["stray"]
    assert range_conflicts(running[0], running) == []
    # A standby child overlaps only its draining parent, which it waits for: no conflict.
    parent = view("t-0-64", 0, 64, P.DRAINING)
    child = view("t-0-32", 0, 32, P.PENDING, restored=True, parent="t-0-64")
    assert range_conflicts(child, [parent, child, running[1]]) == []
    # A split parent (phase Split) owns nothing any more.
    assert range_conflicts(running[0], [view("old", 0, 128, P.SPLIT), *running]) == []


@pytest.mark.parametrize("parent_phase", [P.SPLIT_REQUESTED, P.DRAINING, P.DRAINED])
def test_children_on_standby_own_nothing_while_the_parent_drains(parent_phase):
    shards = [
        view("t-0-128", 0, 128, parent_phase),
        view("t-0-64", 0, 64, P.PENDING, restored=True, parent="t-0-128"),
        view("t-64-128", 64, 128, P.PENDING, restored=True, parent="t-0-128", pod_ready=True),
    ]
    assert [s.name for s in owners(shards)] == ["t-0-128"]
    assert plan_task_shards(task="t", max_key_groups=128, initial_shards=1, shards=shards).tiling_error is None
    assert task_phase(shards) == TaskPhase.SPLITTING
    assert plan_roll("h2", shards) is None  # only Running owners roll; a standby child is neither
    # Hand-over: from ChildrenCreated on the children own the halves.
    handed = [view("t-0-128", 0, 128, P.CHILDREN_CREATED), *shards[1:]]
    assert [s.name for s in owners(handed)] == ["t-0-64", "t-64-128"]
    assert plan_task_shards(task="t", max_key_groups=128, initial_shards=1, shards=handed).tiling_error is None


def test_roll_one_at_a_time():
    new = "h2"
    shards = [
        view("a", 0, 32, wanted_hash="h1", pod_hash="h1", pod_ready=True),
        view("b", 32, 64, wanted_hash="h1", pod_hash="h1", pod_ready=True),
    ]
    assert plan_roll(new, shards) == "a"
    shards[0] = view("a", 0, 32, P.PENDING, wanted_hash=new, pod_hash=None)
    assert plan_roll(new, shards) is None  # a is restarting: wait
    shards[0] = view("a", 0, 32, wanted_hash=new, pod_hash=new, pod_ready=True)
    assert plan_roll(new, shards) == "b"
    shards[1] = view("b", 32, 64, wanted_hash=new, pod_hash=new, pod_ready=True)
    assert plan_roll(new, shards) is None  # done
    # Splitting or split shards are not rolled (their children start with the new template).
    assert plan_roll(new, [view("c", 0, 8, P.DRAINING, wanted_hash="h1"), view("d", 8, 16, P.SPLIT)]) is None


def test_a_refused_template_stops_the_roll_and_the_next_template_goes_there_first():
    """A shard whose runtime refused the rolled template (e.g. StateSchemaIncompatible) holds the roll; a new
    template rolls to it before any Running shard."""
    from spark_runtime.protocol import STATE_SCHEMA_INCOMPATIBLE

    refused = view("b", 32, 64, P.FAILED, wanted_hash="h2", pod_hash="h2", degraded_reason=STATE_SCHEMA_INCOMPATIBLE)
    shards = [view("a", 0, 32, wanted_hash="h1", pod_hash="h1", pod_ready=True), refused]
    assert plan_roll("h2", shards) is None  # h2 was refused at b: the roll stops there
    assert plan_roll("h3", shards) == "b"  # the fix goes to the refused shard first


FAILURES = ["ProcessorFailed", "CrashLoopBackOff", "SourceTopicMissing", "StorageAccessDenied", "PodEnded", None]
"""Degraded reasons a Failed shard shows (None: none recorded yet): a processor that raises, a crash loop without a
reason of its own, a source or sink it cannot use, a pod that ended."""


@pytest.mark.parametrize("reason", FAILURES)
def test_a_failed_shard_is_the_first_a_changed_template_rolls_to(reason):
    """#53: a shard Failed for any reason cannot become Ready on its template and emits nothing meanwhile: a new
    template (the user's fix) rolls to it first, whatever its back-off, also while its crash-looping container runs
    for a moment between two failures (it stays Failed: no flapping), and also when it is not first in key-group
    order or the Task's only shard."""
    healthy = view("a", 0, 32, wanted_hash="h1", pod_hash="h1", pod_ready=True)
    crashed = view("b", 32, 64, P.FAILED, wanted_hash="h1", pod_hash="h1", pod_stuck=True, degraded_reason=reason)
    between = view("b", 32, 64, P.FAILED, wanted_hash="h1", pod_hash="h1", pod_ready=True, degraded_reason=reason)
    no_pod = view("b", 32, 64, P.FAILED, wanted_hash="h1", degraded_reason=reason)  # replaced after a back-off
    for failing in (crashed, between, no_pod):
        assert plan_roll("h2", [healthy, failing]) == "b", failing
        assert plan_roll("h2", [failing]) == "b", failing
        assert plan_roll("h2", [failing, view("c", 64, 96, P.FAILED, wanted_hash="h1")]) == "b"  # key-group order


@pytest.mark.parametrize("phase", [P.PENDING, P.RUNNING])
def test_a_shard_whose_pod_cannot_start_on_its_template_is_rolled_first(phase):
    """A pod that waits on what only another template fixes (its image, its config) or crash-loops before the shard
    noticed: the shard cannot become Ready on its template either (a new shard or a rolled one is Pending then)."""
    healthy = view("a", 0, 32, wanted_hash="h1", pod_hash="h1", pod_ready=True)
    waiting = view("b", 32, 64, phase, wanted_hash="h1", pod_hash="h1", pod_stuck=True)
    assert plan_roll("h2", [healthy, waiting]) == "b"
    starting = view("b", 32, 64, P.PENDING, wanted_hash="h1", pod_hash="h1")  # a pod that starts as it should
    assert plan_roll("h2", [healthy, starting]) == "a"


def test_a_rolled_failing_shard_holds_the_roll_until_it_recovers_and_a_failing_fix_stops_it_there():
    """The roll goes on only once the failing shard's new pod runs the new template and the shard is no longer
    Failed (it stays Failed, Recovering, until that pod commits a batch): a fix that fails too stops the roll at that
    shard (:func:`roll_held` names it; no other shard gets the template, nothing is rolled again), and the next fix
    goes there first again."""
    healthy = view("a", 0, 32, wanted_hash="h1", pod_hash="h1", pod_ready=True)

    def b(phase, pod_hash, **kw):
        return view("b", 32, 64, phase, wanted_hash="h2", pod_hash=pod_hash, degraded_reason="ProcessorFailed", **kw)

    for waits in (b(P.FAILED, "h1", pod_stuck=True), b(P.FAILED, None), b(P.FAILED, "h2", pod_ready=True)):
        assert plan_roll("h2", [healthy, waits]) is None, waits  # old pod going, new one starting or recovering
        assert roll_held("h2", [healthy, waits]) is None, waits
    assert plan_roll("h2", [healthy, b(P.RUNNING, "h2", pod_ready=True)]) == "a"  # recovered: the roll goes on
    for failed_again in (b(P.FAILED, "h2", pod_stuck=True), b(P.FAILED, "h2", pod_ready=True, pod_restarts=2)):
        shards = [healthy, failed_again]
        assert plan_roll("h2", shards) is None, failed_again
        assert roll_held("h2", shards) == failed_again
        assert plan_roll("h3", shards) == "b"  # the next fix goes there first
        assert roll_held("h2", [failed_again]) is None  # nothing else waits: its failure is its own (Degraded)
    # A Running shard the new template makes fail stops the roll there too.
    broke = view("a", 0, 32, P.FAILED, wanted_hash="h2", pod_hash="h2", pod_stuck=True)
    shards = [broke, view("b", 32, 64, wanted_hash="h1", pod_hash="h1", pod_ready=True)]
    assert plan_roll("h2", shards) is None and roll_held("h2", shards) == broke


def test_task_phase():
    assert task_phase([]) == TaskPhase.PENDING
    assert task_phase([view("a", 0, 8), view("b", 8, 16)]) == TaskPhase.RUNNING
    assert task_phase([view("a", 0, 8), view("b", 8, 16, P.PENDING)]) == TaskPhase.PENDING
    assert task_phase([view("a", 0, 8), view("b", 8, 16, P.FAILED)]) == TaskPhase.DEGRADED
    assert task_phase([view("a", 0, 8), view("b", 8, 16, P.DRAINING)]) == TaskPhase.SPLITTING
    assert task_phase([view("a", 0, 8)], tiling_error="gap") == TaskPhase.DEGRADED
