"""A split whose parent never drains has a bound (``spec.handover.splitStallSeconds``): past it the parent and the
Task show Degraded=True reason SplitStalled, naming what it waits for and the way out; withdrawing the split undoes
it and the shard is healthy again. In the simulated world."""

from __future__ import annotations

import pytest

from taskshard_operator.reconcile_shard import PodReplacementBackoff, reconcile_shard
from taskshard_operator.reconcile_task import reconcile_task

from .fake_cluster import FakeKube, converge, new_world, phases, request_split, world_step
from .operator_spec import NS, SPEC

pytestmark = pytest.mark.unit


def passes(kube: FakeKube, events: list, rounds: int) -> None:
    """Operator passes and world steps in which the parent keeps running (its children never get ready)."""
    for _ in range(rounds):
        reconcile_task(kube, kube, NS, "t", emit=lambda *a: events.append(a))
        for name in list(kube.shards()):
            reconcile_shard(kube, kube, NS, name, emit=lambda *a: events.append(a), backoff=PodReplacementBackoff(0.0))
        world_step(kube, {}, hand_over=False)


def degraded(obj: dict) -> dict:
    return next(c for c in obj["status"]["conditions"] if c["type"] == "Degraded")


def test_a_split_that_does_not_drain_shows_split_stalled_and_can_be_withdrawn():
    kube = new_world({**SPEC, "handover": {"splitStallSeconds": 60}})
    events: list = []
    converge(kube, events)
    request_split(kube, "t-0-16", at=4)
    passes(kube, events, 4)
    assert phases(kube)["t-0-16"] == "Draining"
    assert degraded(kube.shards()["t-0-16"])["status"] == "False", "within its bound a split is healthy"
    kube.patch_custom_status("taskshards", NS, "t-0-16", {"split": {"acceptedTime": "2020-01-01T00:00:00Z"}})
    passes(kube, events, 2)
    shown = degraded(kube.shards()["t-0-16"])
    assert (shown["status"], shown["reason"]) == ("True", "SplitStalled"), shown
    assert "(bound 60s) and t-0-16 has not drained" in shown["message"], shown["message"]
    assert "child t-0-4 (" in shown["message"] and "child t-4-16 (" in shown["message"], shown["message"]
    assert "the parent's driver pod: Running" in shown["message"], shown["message"]
    assert '-p \'{"spec":{"split":null}}\'' in shown["message"], shown["message"]
    task = degraded(kube.objects[("tasks", "t")])
    assert (task["status"], task["reason"]) == ("True", "SplitStalled") and "t-0-16" in task["message"], task
    assert [e[2] for e in events].count("SplitStalled") == 1, "one Warning event, not one per pass"

    kube.patch_custom("taskshards", NS, "t-0-16", {"spec": {"split": None}})
    passes(kube, events, 1)
    assert phases(kube)["t-0-16"] == "AbortingSplit"
    converge(kube, events)
    assert phases(kube) == {"t-0-16": "Running"}, "withdrawn: the parent keeps its range"
    assert degraded(kube.shards()["t-0-16"])["status"] == "False"
    assert degraded(kube.objects[("tasks", "t")])["status"] == "False"
