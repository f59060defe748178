"""The phase machine: allowed and forbidden transitions, and its one drawing."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as s

from taskshard_operator import phases
from taskshard_operator.models.shard import ShardPhase as P
from taskshard_operator.phases import (
    ALLOWED,
    SPLIT_STEPS,
    TERMINAL,
    TransitionError,
    can_transition,
    check_transition,
    is_splitting,
    parse_phase,
)

pytestmark = pytest.mark.unit


def test_every_phase_has_a_row():
    assert set(ALLOWED) == set(P)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (P.PENDING, P.RUNNING),
        (P.RUNNING, P.FAILED),
        (P.FAILED, P.RUNNING),
        (P.FAILED, P.PENDING),
        (P.RUNNING, P.PENDING),
        (P.RUNNING, P.SPLIT_REQUESTED),
        (P.SPLIT_REQUESTED, P.DRAINING),
        (P.DRAINING, P.DRAINED),
        (P.DRAINED, P.CHILDREN_CREATED),
        (P.CHILDREN_CREATED, P.SPLIT),
        (P.RUNNING, P.STOPPED),
        (P.SPLIT_REQUESTED, P.ABORTING_SPLIT),
        (P.DRAINING, P.ABORTING_SPLIT),
        (P.ABORTING_SPLIT, P.PENDING),  # undone: the shard resumes
        (P.ABORTING_SPLIT, P.DRAINED),  # too late: the parent had drained
        (P.MERGE_REQUESTED, P.RUNNING),  # withdrawn before the merged shard exists
        (P.MERGING, P.ABORTING_MERGE),
        (P.ABORTING_MERGE, P.RUNNING),  # undone: no parent had drained
        (P.ABORTING_MERGE, P.MERGING),  # too late: the merge completes
        (P.MERGING, P.RUNNING),  # the right shard follows a merge its left neighbour undid
    ],
)
def test_allowed(old, new):
    assert check_transition(old, new) == new


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (P.SPLIT, P.RUNNING),
        (P.STOPPED, P.RUNNING),
        (P.DRAINING, P.RUNNING),  # an accepted split is rolled back only through AbortingSplit
        (P.DRAINED, P.ABORTING_SPLIT),  # handed over: too late to abort
        (P.CHILDREN_CREATED, P.ABORTING_SPLIT),
        (P.ABORTING_SPLIT, P.RUNNING),
        (P.ABORTING_SPLIT, P.CHILDREN_CREATED),
        (P.DRAINED, P.FAILED),
        (P.SPLIT_REQUESTED, P.DRAINED),  # no step is skipped
        (P.RUNNING, P.DRAINING),
        (P.PENDING, P.SPLIT),
        (P.FAILED, P.SPLIT_REQUESTED),  # only a Running shard is split
        (P.MERGED, P.RUNNING),
        (P.ABORTING_MERGE, P.MERGED),  # an abort that finds a drained parent goes back to Merging first
        (P.MERGE_REQUESTED, P.ABORTING_MERGE),  # before the merged shard exists a withdrawal needs no abort
    ],
)
def test_forbidden(old, new):
    with pytest.raises(TransitionError, match=f"{old.value} -> {new.value}"):
        check_transition(old, new)


@given(s.sampled_from(list(P)))
def test_self_transitions_are_idempotent(phase):
    assert can_transition(phase, phase)


@given(s.sampled_from(list(P)), s.sampled_from(list(P)))
def test_terminal_phases_never_leave_and_split_only_moves_forward(old, new):
    if old in TERMINAL and new != old:
        assert not can_transition(old, new)
    if old in SPLIT_STEPS and new != old and can_transition(old, new):
        aborts = new == P.ABORTING_SPLIT and old in (P.SPLIT_REQUESTED, P.DRAINING)
        assert aborts or SPLIT_STEPS.index(new) == SPLIT_STEPS.index(old) + 1
    if old == P.ABORTING_SPLIT and new != old and can_transition(old, new):
        assert new in (P.PENDING, P.DRAINED)


@given(s.lists(s.sampled_from(list(P)), max_size=30))
def test_any_allowed_walk_keeps_the_split_in_order(walk):
    """Along any allowed walk, each split attempt follows SPLIT_STEPS in order; it leaves the order only through
    AbortingSplit before Drained, which undoes it (back to Pending: a later attempt starts from SplitRequested)
    or finds it handed over (on at Drained)."""
    phase = P.PENDING
    seen = [phase]
    for new in walk:
        if can_transition(phase, new):
            phase = new
            seen.append(phase)
    deduped = [p for i, p in enumerate(seen) if i == 0 or seen[i - 1] != p]
    at = -1  # index in SPLIT_STEPS of the current attempt's last step (-1: no attempt)
    for prev, p in zip(deduped, deduped[1:], strict=False):
        if p == P.ABORTING_SPLIT:
            assert prev in (P.SPLIT_REQUESTED, P.DRAINING)
        elif prev == P.ABORTING_SPLIT:
            assert p in (P.PENDING, P.DRAINED)
            at = SPLIT_STEPS.index(P.DRAINED) if p == P.DRAINED else -1
        elif p in SPLIT_STEPS:
            assert SPLIT_STEPS.index(p) == at + 1, deduped
            at = SPLIT_STEPS.index(p)


def test_helpers():
    assert parse_phase(None) == P.PENDING
    assert parse_phase("Draining") == P.DRAINING
    assert is_splitting(P.DRAINED) and not is_splitting(P.SPLIT) and not is_splitting(P.RUNNING)
    assert is_splitting(P.ABORTING_SPLIT) and P.ABORTING_SPLIT.owns_range and P.ABORTING_SPLIT.holds_range_for_children


ARROW = re.compile(r"\s*──.*?──>\s*")


def drawn_transitions(doc: str) -> set[tuple[P, P]]:
    """The transitions of the drawing in ``doc``: on each line ``sources ──what──> target ──what──> target ...``,
    every phase of one part leads to every phase of the next (``|`` separates alternatives)."""
    names = {p.value: p for p in P}
    edges: set[tuple[P, P]] = set()
    for line in doc.splitlines():
        if "──>" not in line:
            continue
        parts = [{names[n.strip()] for n in part.split("|") if n.strip() in names} for part in ARROW.split(line)]
        for sources, targets in zip(parts, parts[1:], strict=False):
            edges |= {(a, b) for a in sources for b in targets}
    return edges


def test_the_one_drawing_shows_exactly_the_allowed_transitions():
    drawn = drawn_transitions(phases.__doc__)
    allowed = {(old, new) for old, targets in ALLOWED.items() for new in targets}
    assert allowed - drawn == set(), f"allowed but not drawn in phases.py: {sorted(allowed - drawn)}"
    assert drawn - allowed == set(), f"drawn but not allowed: {sorted(drawn - allowed)}"


def test_the_drawing_test_sees_a_missing_arrow():
    assert (P.MERGING, P.MERGED) in drawn_transitions(phases.__doc__)
    without = phases.__doc__.replace("Merging ──the pod drained, and the other parent too──> Merged", "")
    assert (P.MERGING, P.MERGED) not in drawn_transitions(without)
