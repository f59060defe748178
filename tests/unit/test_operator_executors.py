"""Executor status on the TaskShard: the executor pod view (:mod:`taskshard_operator.executors`), the Kopf index and
event handler that feed it, and what :func:`~taskshard_operator.reconcile_shard.decide_shard` writes from it
(``status.executors`` and the ExecutorsReady condition, a Warning event once per distinct problem).

The pods are what the API shows for the executor pods a shard's Spark driver creates (``<shard>-exec-<n>``,
labelled ``taskshard.io/component=executor``); the decisions are made over the dict-backed World of
``fake_observed``.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kopf
import pytest

from taskshard_operator import naming
from taskshard_operator import status as st
from taskshard_operator.act import Event
from taskshard_operator.cache import KopfCache
from taskshard_operator.executors import ExecutorView, executor_view, summarize
from taskshard_operator.handlers import indexes, taskshard
from taskshard_operator.handlers.runtime import RUNTIME
from taskshard_operator.models.common import SHARD_CONDITION_TYPES

from .fake_cluster import merge_patch
from .fake_observed import PARENT, World, add_shard, decide, make_pod, running, sync_config
from .operator_spec import NS, SPEC

pytestmark = pytest.mark.unit

EXEC_1, EXEC_2 = f"{PARENT}-exec-1", f"{PARENT}-exec-2"
NO_MEMORY = "0/1 nodes are available: 1 Insufficient memory."
T0 = "2026-01-01T00:00:00Z"
EXECUTOR_SPEC = {**SPEC, "spark": {**SPEC["spark"], "executors": {"instances": 2}}}


# ---------------------------------------------------------------- executor pods as the API shows them


def executor_pod(name: str, status: dict[str, Any] | None = None, *, shard: str = PARENT, deleting: bool = False):
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-{name}",
        "labels": {
            naming.LABEL_TASK: "t",
            naming.LABEL_SHARD: shard,
            naming.LABEL_KEY_GROUPS: "0-16",
            naming.LABEL_COMPONENT: naming.COMPONENT_EXECUTOR,
            "spark-role": "executor",
        },
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": naming.pod_name(shard), "uid": "driver"}],
    }
    if deleting:
        meta["deletionTimestamp"] = T0
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {}, "status": status or {}}


def cond(type_: str, ok: bool, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
    c = {"type": type_, "status": "True" if ok else "False", "lastTransitionTime": T0}
    if reason:
        c["reason"] = reason
    if message:
        c["message"] = message
    return c


def container(state: dict[str, Any], *, ready: bool = False) -> dict[str, Any]:
    return {"name": "executor", "image": "img:1", "ready": ready, "restartCount": 0, "state": state}


def running_status() -> dict[str, Any]:
    return {
        "phase": "Running",
        "podIP": "10.1.0.9",
        "conditions": [
            cond("PodScheduled", True),
            cond("Initialized", True),
            cond("ContainersReady", True),
            cond("Ready", True),
        ],
        "containerStatuses": [container({"running": {"startedAt": T0}}, ready=True)],
    }


def unschedulable_status() -> dict[str, Any]:
    return {"phase": "Pending", "conditions": [cond("PodScheduled", False, "Unschedulable", NO_MEMORY)]}


def waiting_status(reason: str, message: str | None = None) -> dict[str, Any]:
    waiting = {"reason": reason, **({"message": message} if message else {})}
    return {
        "phase": "Pending",
        "conditions": [cond("PodScheduled", True), cond("Ready", False, "ContainersNotReady", "not ready")],
        "containerStatuses": [container({"waiting": waiting})],
    }


# ---------------------------------------------------------------- the view (pure)


def test_a_running_executor():
    view = executor_view(executor_pod(EXEC_1, running_status()))
    assert view == ExecutorView(name=EXEC_1, phase="Running", ready=True, deleting=False, reason=None, message=None)
    assert view.running and not view.pending and not view.explained


def test_a_running_executor_that_is_not_ready_yet_still_runs():
    status = running_status()
    status["conditions"][-1] = cond("Ready", False, "ContainersNotReady")
    view = executor_view(executor_pod(EXEC_1, status))
    assert view.running and not view.ready and view.reason is None


def test_an_unschedulable_executor_says_why():
    view = executor_view(executor_pod(EXEC_2, unschedulable_status()))
    assert view == ExecutorView(
        name=EXEC_2, phase="Pending", ready=False, deleting=False, reason="Unschedulable", message=NO_MEMORY
    )
    assert view.pending and view.explained and not view.running
    assert view.describe() == f"{EXEC_2} Pending (Unschedulable: {NO_MEMORY})"


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("CreateContainerConfigError", 'secret "s3-creds" not found'),
        ("ImagePullBackOff", 'Back-off pulling image "img:404"'),
    ],
)
def test_a_waiting_container_says_why(reason: str, message: str):
    view = executor_view(executor_pod(EXEC_1, waiting_status(reason, message)))
    assert (view.phase, view.ready, view.reason, view.message) == ("Pending", False, reason, message)
    assert view.explained


def test_a_starting_executor_shows_no_problem():
    """Just created (no status yet) or creating its container: pending, without a problem to report."""
    fresh = executor_view(executor_pod(EXEC_1))
    assert fresh == ExecutorView(name=EXEC_1)
    assert fresh.pending and not fresh.explained and fresh.describe() == f"{EXEC_1} Pending"
    creating = executor_view(executor_pod(EXEC_1, waiting_status("ContainerCreating")))
    assert creating.reason == "ContainerCreating" and creating.pending and not creating.explained


def test_a_failed_executor_names_its_exit():
    status = {
        "phase": "Failed",
        "conditions": [cond("PodScheduled", True)],
        "containerStatuses": [container({"terminated": {"exitCode": 137, "reason": "OOMKilled"}})],
    }
    view = executor_view(executor_pod(EXEC_1, status))
    assert (view.reason, view.message) == ("OOMKilled", "exit code 137")
    assert not view.pending and not view.running and view.explained


def test_an_executor_being_deleted_counts_as_neither_running_nor_pending():
    view = executor_view(executor_pod(EXEC_1, running_status(), deleting=True))
    assert view.deleting and view.phase == "Running"
    assert not view.running and not view.pending


def test_the_view_does_not_change_the_pod():
    pod = executor_pod(EXEC_1, unschedulable_status())
    before = copy.deepcopy(pod)
    executor_view(pod)
    assert pod == before


# ---------------------------------------------------------------- the summary (pure)


def test_summary_counts_and_messages():
    views = [
        executor_view(executor_pod(EXEC_1, running_status())),
        executor_view(executor_pod(EXEC_2, unschedulable_status())),
        executor_view(executor_pod(f"{PARENT}-exec-0", running_status(), deleting=True)),
    ]
    summary = summarize(2, views)
    assert summary.status == {"requested": 2, "running": 1, "pending": 1}
    assert (summary.ready, summary.reason) == (False, "ExecutorsPending")
    assert summary.message == f"1 of 2 executors not running: {EXEC_2} Pending (Unschedulable: {NO_MEMORY})"

    nothing = summarize(2, [])
    assert nothing.status == {"requested": 2, "running": 0, "pending": 0}
    assert (nothing.reason, nothing.message) == ("ExecutorsStarting", "2 of 2 executors not running: 2 not created yet")

    one = summarize(2, [executor_view(executor_pod(EXEC_1))])
    assert (one.reason, one.message) == (
        "ExecutorsStarting",
        f"2 of 2 executors not running: {EXEC_1} Pending; 1 not created yet",
    )
    driverless = summarize(2, [], driver_running=False)
    assert (driverless.ready, driverless.reason) == (False, "DriverNotRunning")


def test_a_long_scheduler_message_is_cut():
    status = unschedulable_status()
    status["conditions"][0]["message"] = "0/500 nodes are available: " + "x" * 2000
    summary = summarize(1, [executor_view(executor_pod(EXEC_1, status))])
    assert len(summary.message) < 400 and summary.message.endswith("...)")


# ---------------------------------------------------------------- the index and the event handler


def test_the_index_keys_each_executor_pod_by_namespace_and_shard():
    pod = executor_pod(EXEC_2, unschedulable_status(), shard="t-8-16")
    got = asyncio.run(indexes.executor_pods(namespace=NS, body=kopf.Body(pod)))
    assert got == {(NS, "t-8-16"): executor_view(pod)}
    unlabelled = executor_pod(EXEC_1)
    del unlabelled["metadata"]["labels"][naming.LABEL_SHARD]
    assert asyncio.run(indexes.executor_pods(namespace=NS, body=kopf.Body(unlabelled))) == {}


def test_every_cache_index_is_a_registered_kopf_index_and_executor_pods_are_watched():
    """Kopf passes each index to every handler as a kwarg named by its id, and ``KopfCache.bind`` takes every id of
    ``KopfCache.INDEXES`` from the startup handler's kwargs: each must be a registered index (else bind fails at
    start). The executor index and event handler select executor pods only, the driver pod's select shard pods."""
    registry = kopf.get_default_registry()
    registered = {h.id: h for h in registry._indexing.get_all_handlers()}  # no public API lists them
    assert set(KopfCache.INDEXES) == set(registered)
    executor_labels = {naming.LABEL_COMPONENT: naming.COMPONENT_EXECUTOR}
    assert registered[KopfCache.EXECUTORS].labels == executor_labels
    assert registered[KopfCache.PODS].labels == {naming.LABEL_COMPONENT: naming.COMPONENT_SHARD}
    watching = {h.id: h for h in registry._watching.get_all_handlers()}
    assert watching["executor_event"].labels == executor_labels


def test_the_cache_serves_the_executor_index_sorted_by_name():
    stores = {name: {} for name in KopfCache.INDEXES}
    b = executor_view(executor_pod(EXEC_2, unschedulable_status()))
    a = executor_view(executor_pod(EXEC_1, running_status()))
    stores[KopfCache.EXECUTORS][(NS, PARENT)] = [b, a]
    cache = KopfCache()
    cache.bind(stores)
    assert cache.executors(NS, PARENT) == [a, b]
    assert cache.executors(NS, "other") == []
    with pytest.raises(KeyError):
        KopfCache().bind({k: v for k, v in stores.items() if k != KopfCache.EXECUTORS})


def test_an_executor_pod_event_enqueues_its_shard(monkeypatch):
    queued: list = []
    monkeypatch.setattr(RUNTIME, "enqueue", lambda key, delay=0.0: queued.append(key))
    labels = executor_pod(EXEC_1)["metadata"]["labels"]
    asyncio.run(taskshard.executor_event(namespace=NS, labels=labels))
    asyncio.run(taskshard.executor_event(namespace=NS, labels={}))
    assert queued == [("shard", NS, PARENT)]


# ---------------------------------------------------------------- what the shard pass decides


def executor_world(spec: dict[str, Any] | None = None, *executors: dict[str, Any]) -> World:
    """A Running shard whose driver pod runs and emits, its config applied, and these executor pods."""
    world = World(spec or EXECUTOR_SPEC)
    add_shard(world, PARENT, phase="Running", status={"pod": naming.pod_name(PARENT)})
    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running())
    sync_config(world, PARENT)
    world.executor_pods[PARENT] = list(executors)
    return world


def written(world: World, decision) -> None:
    """What the API does with the decision's status (a merge patch: None removes a field)."""
    merge_patch(world.shards[PARENT]["status"], decision.status)


def settle(world: World) -> None:
    """Passes until the shard's status stops changing (the driver's own conditions settle first)."""
    for _ in range(5):
        decision = decide(world, PARENT)
        if not decision.status:
            return
        written(world, decision)
    raise AssertionError("the shard's status never settled")


def executors_ready(world_or_decision) -> dict[str, Any] | None:
    status = world_or_decision.status if hasattr(world_or_decision, "status") else world_or_decision
    return st.get_condition(status.get("conditions"), st.EXECUTORS_READY)


def test_all_executors_running_is_ready_and_then_nothing_is_written():
    world = executor_world(None, executor_pod(EXEC_1, running_status()), executor_pod(EXEC_2, running_status()))
    decision = decide(world, PARENT)
    assert decision.status["executors"] == {"requested": 2, "running": 2, "pending": 0}
    ready = executors_ready(decision)
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "True",
        "ExecutorsRunning",
        "2 of 2 executors running",
    )
    assert ready["observedGeneration"] == 1
    assert decision.events == []
    written(world, decision)
    again = decide(world, PARENT)
    assert again.status == {} and again.events == [], "nothing changed: no status write"


def test_an_unschedulable_executor_is_reported_once():
    world = executor_world(None, executor_pod(EXEC_1, running_status()), executor_pod(EXEC_2, unschedulable_status()))
    message = f"1 of 2 executors not running: {EXEC_2} Pending (Unschedulable: {NO_MEMORY})"
    decision = decide(world, PARENT)
    assert decision.status["executors"] == {"requested": 2, "running": 1, "pending": 1}
    cond_ = executors_ready(decision)
    assert (cond_["status"], cond_["reason"], cond_["message"]) == ("False", "ExecutorsPending", message)
    assert decision.events == [Event("Warning", "ExecutorsPending", message)]
    assert st.get_condition(decision.status["conditions"], st.READY)["status"] == "True", "the driver itself runs"

    written(world, decision)
    again = decide(world, PARENT)
    assert again.events == [], "the same problem is not announced again"
    assert again.status == {}, "nor written again"

    # Another problem is announced once more; once the pod runs, the condition is True without an event.
    world.executor_pods[PARENT][1] = executor_pod(EXEC_2, waiting_status("ImagePullBackOff", "Back-off pulling"))
    other = decide(world, PARENT)
    new_message = f"1 of 2 executors not running: {EXEC_2} Pending (ImagePullBackOff: Back-off pulling)"
    assert other.events == [Event("Warning", "ExecutorsPending", new_message)]
    assert "executors" not in other.status, "the counts did not change"
    written(world, other)
    world.executor_pods[PARENT][1] = executor_pod(EXEC_2, running_status())
    recovered = decide(world, PARENT)
    assert recovered.events == []
    assert executors_ready(recovered)["status"] == "True"
    assert recovered.status["executors"] == {"requested": 2, "running": 2, "pending": 0}


def test_executors_not_created_yet_or_starting_are_no_warning():
    world = executor_world(None)
    decision = decide(world, PARENT)
    assert decision.status["executors"] == {"requested": 2, "running": 0, "pending": 0}
    c = executors_ready(decision)
    assert (c["status"], c["reason"], c["message"]) == (
        "False",
        "ExecutorsStarting",
        "2 of 2 executors not running: 2 not created yet",
    )
    assert decision.events == []
    world.executor_pods[PARENT] = [executor_pod(EXEC_1), executor_pod(EXEC_2, waiting_status("ContainerCreating"))]
    starting = decide(world, PARENT)
    assert executors_ready(starting)["reason"] == "ExecutorsStarting" and starting.events == []
    assert starting.status["executors"]["pending"] == 2


def test_executors_being_deleted_are_not_counted():
    world = executor_world(
        None,
        executor_pod(EXEC_1, running_status()),
        executor_pod(EXEC_2, running_status(), deleting=True),
        executor_pod(f"{PARENT}-exec-3"),
    )
    decision = decide(world, PARENT)
    assert decision.status["executors"] == {"requested": 2, "running": 1, "pending": 1}
    assert executors_ready(decision)["reason"] == "ExecutorsStarting"


def test_a_driver_that_does_not_run_has_no_executors_ready_and_posts_nothing():
    world = executor_world(None, executor_pod(EXEC_2, unschedulable_status()))
    world.pods[PARENT] = make_pod(PARENT, phase="Pending")
    decision = decide(world, PARENT)
    c = executors_ready(decision)
    assert (c["status"], c["reason"]) == ("False", "DriverNotRunning")
    assert decision.status["executors"] == {"requested": 2, "running": 0, "pending": 1}
    assert [e for e in decision.events if e.reason == "ExecutorsPending"] == []


def test_a_task_without_executors_gets_no_executor_status():
    world = executor_world(SPEC, executor_pod(EXEC_1, running_status()))  # a stray executor pod changes nothing
    settle(world)
    status = world.shards[PARENT]["status"]
    assert "executors" not in status and executors_ready(status) is None
    assert status["phase"] == "Running"


def test_turning_executors_off_removes_the_stale_status():
    world = executor_world(None, executor_pod(EXEC_1, running_status()), executor_pod(EXEC_2, unschedulable_status()))
    settle(world)
    assert executors_ready(world.shards[PARENT]["status"])["reason"] == "ExecutorsPending"
    world.tasks["t"]["spec"]["spark"].pop("executors")
    world.executor_pods[PARENT] = []
    decision = decide(world, PARENT)
    assert "executors" in decision.status and decision.status["executors"] is None, "removed by the merge patch"
    assert executors_ready(decision) is None and decision.status["conditions"], "the whole list, without it"
    assert decision.events == []
    written(world, decision)
    assert "executors" not in world.shards[PARENT]["status"]
    assert decide(world, PARENT).status == {}


def test_a_stopped_shard_drops_its_executor_status():
    world = executor_world(None, executor_pod(EXEC_1, running_status()), executor_pod(EXEC_2, running_status()))
    settle(world)
    assert world.shards[PARENT]["status"]["executors"]["running"] == 2
    del world.tasks["t"]
    decision = decide(world, PARENT)
    assert decision.status["phase"] == "Stopped"
    assert decision.status["executors"] is None and executors_ready(decision) is None


def test_executors_ready_is_an_advertised_shard_condition():
    assert st.EXECUTORS_READY in {t.value for t in SHARD_CONDITION_TYPES}


def test_the_crd_names_the_phases_without_executor_status():
    from taskshard_operator.models.shard import TaskShardStatus
    from taskshard_operator.reconcile_shard import NO_EXECUTOR_PHASES

    description = TaskShardStatus.model_fields["executors"].description
    assert all(phase.value in description for phase in NO_EXECUTOR_PHASES)
