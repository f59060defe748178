"""The reconcilers against an in-memory API: the split protocol, crash-and-resume at every step, refusals,
pod replacement and rolls, in the simulated cluster of ``fake_cluster`` (the kubelet and the shard runtime
simulated; the in-memory API is also the passes' cache, and a pass never reads through the API: ``reads`` stays 0).
"""

from __future__ import annotations

import copy
import datetime as dt
import json

import kopf
import pytest

from spark_runtime.keygroups import KeyGroupRange
from taskshard_operator import naming
from taskshard_operator.reconcile_shard import PodReplacementBackoff, reconcile_shard
from taskshard_operator.reconcile_task import delete_task, reconcile_task

from .fake_cluster import (
    Crash,
    FakeKube,
    converge,
    count_creations,
    new_world,
    owner_ranges,
    phases,
    request_split,
    world_step,
)
from .operator_spec import NS, SPEC

pytestmark = pytest.mark.unit


def test_task_creates_shards_and_pods_run():
    kube = new_world({**SPEC, "initialShards": 2})
    events: list = []
    converge(kube, events)
    assert phases(kube) == {"t-0-8": "Running", "t-8-16": "Running"}
    assert set(kube.pods()) == {"t-0-8-driver", "t-8-16-driver"}
    pod = kube.pods()["t-0-8-driver"]
    assert pod["metadata"]["ownerReferences"][0]["name"] == "t-0-8"
    assert kube.shards()["t-0-8"]["metadata"]["ownerReferences"][0]["kind"] == "Task"
    task = kube.objects[("tasks", "t")]
    assert task["status"]["phase"] == "Running" and task["status"]["shards"] == 2
    conds = {c["type"]: c["status"] for c in task["status"]["conditions"]}
    assert conds == {
        "Ready": "True",
        "Progressing": "False",
        "Degraded": "False",
        "Tiled": "True",
        "Splitting": "False",
        "Scaled": "True",  # spec.shards is unset: the operator leaves the count to splits by hand
    }


def test_an_edited_initial_shards_and_a_stray_shard_never_get_a_pod():
    """Tiling is enforced, not reported: initialShards edited on a live Task creates nothing, and a TaskShard made
    by hand (no labels, only a taskRef) over owned key groups gets no pod; the Task says Tiled=False."""
    kube = new_world({**SPEC, "initialShards": 2})
    events: list = []
    converge(kube, events)
    kube.patch_custom("tasks", NS, "t", {"spec": {"initialShards": 4}})
    converge(kube, events)
    assert set(kube.shards()) == {"t-0-8", "t-8-16"}, "no shard over an owned range"
    task = kube.objects[("tasks", "t")]
    tiled = {c["type"]: c for c in task["status"]["conditions"]}["Tiled"]
    assert tiled["status"] == "False" and "overlap [0, 4) between [0, 4) and [0, 8)" in tiled["message"]
    assert [e for e in events if e[2] == "TilingBroken"], "a Warning event says why"
    kube.patch_custom("tasks", NS, "t", {"spec": {"initialShards": 2}})
    converge(kube, events)

    kube._new(
        "taskshards",
        {
            "apiVersion": "taskshard.io/v1alpha1",
            "kind": "TaskShard",
            "metadata": {"name": "stray"},
            "spec": {"taskRef": {"name": "t"}, "keyGroups": {"start": 4, "end": 12}},
        },
    )
    converge(kube, events, owners_tile=False)
    assert "stray-driver" not in kube.pods() and {"t-0-8-driver", "t-8-16-driver"} <= set(kube.pods())
    stray = kube.shards()["stray"]["status"]
    conditions = {c["type"]: c for c in stray["conditions"]}
    assert conditions["Ready"]["reason"] == "RangeOverlap" and conditions["Degraded"]["status"] == "True"
    assert "t-0-8 [0, 8), t-8-16 [8, 16)" in conditions["Degraded"]["message"]
    assert len([e for e in events if e[2] == "RangeOverlap"]) == 1, "one event per distinct problem"
    tiled = {c["type"]: c for c in kube.objects[("tasks", "t")]["status"]["conditions"]}["Tiled"]
    assert tiled["status"] == "False" and "overlap" in tiled["message"]
    # A running shard's pod that goes away is not replaced while the stray overlaps it either.
    kube.delete_pod(NS, "t-0-8-driver")
    converge(kube, events, owners_tile=False)
    assert "t-0-8-driver" not in kube.pods()
    kube.objects.pop(("taskshards", "stray"))
    converge(kube, events)
    assert "t-0-8-driver" in kube.pods()
    tiled = {c["type"]: c for c in kube.objects[("tasks", "t")]["status"]["conditions"]}["Tiled"]
    assert tiled["status"] == "True"


def test_the_status_vocabulary_is_what_the_crds_advertise():
    """Every condition type written on a TaskShard or a Task over a split, refusals and a tiling problem is one
    the CRD names (its description is generated from the same tuples), and each advertised one is written; the
    Splitting condition follows the split steps; a split parent is labelled active=false; a Task being deleted
    is Stopping. The Task asks for an executor (which the simulated world never starts), so ExecutorsReady is
    written too."""
    from taskshard_operator.models.common import SHARD_CONDITION_TYPES, TASK_CONDITION_TYPES

    spark = {**SPEC["spark"], "executors": {"instances": 1}}
    kube = new_world({**SPEC, "checkpointRetention": "Retain", "spark": spark})
    events: list = []
    converge(kube, events)
    splitting_seen: list[tuple[str, str]] = []
    original = kube.patch_custom_status

    def spy(plural, namespace, name, status, **kwargs):
        for c in status.get("conditions") or []:
            if plural == "taskshards" and c["type"] == "Splitting":
                splitting_seen.append((c["status"], c["reason"]))
        return original(plural, namespace, name, status, **kwargs)

    kube.patch_custom_status = spy
    kube.patch_custom("taskshards", NS, "t-0-16", {"spec": {"merge": {"with": "t-16-32"}}})  # refused: MergeRejected
    converge(kube, events)
    kube.patch_custom("taskshards", NS, "t-0-16", {"spec": {"merge": None}})
    request_split(kube, "t-0-16", at=99)  # refused: SplitRejected
    converge(kube, events)
    request_split(kube, "t-0-16", at=4)
    converge(kube, events)
    shard_types = {c["type"] for s in kube.shards().values() for c in s["status"]["conditions"]}
    task = kube.objects[("tasks", "t")]
    task_types = {c["type"] for c in task["status"]["conditions"]}
    assert shard_types == {t.value for t in SHARD_CONDITION_TYPES}
    assert task_types == {t.value for t in TASK_CONDITION_TYPES}
    assert ("True", "SplitRequested") in splitting_seen and ("True", "Draining") in splitting_seen
    parent = kube.shards()["t-0-16"]
    assert {c["type"]: c["status"] for c in parent["status"]["conditions"]}["Splitting"] == "False"
    labels = {n: s["metadata"]["labels"]["taskshard.io/active"] for n, s in kube.shards().items()}
    assert labels == {"t-0-16": "false", "t-0-4": "true", "t-4-16": "true"}
    with pytest.raises(kopf.TemporaryError):
        delete_task(kube, NS, "t", kube.objects[("tasks", "t")], emit=lambda *a: events.append(a))
    assert kube.objects[("tasks", "t")]["status"]["phase"] == "Stopping"


def test_split_protocol_end_to_end():
    kube = new_world()
    events: list = []
    converge(kube, events)
    request_split(kube, "t-0-16", at=4)
    converge(kube, events)
    assert phases(kube) == {"t-0-16": "Split", "t-0-4": "Running", "t-4-16": "Running"}
    assert kube.pod_patches == [], "no pod is patched: the parent stops by itself once its children are ready"
    parent = kube.shards()["t-0-16"]
    assert "t-0-16-driver" not in kube.pods()
    assert ("configmaps", "t-0-16-config") not in kube.objects
    assert parent["status"]["lineage"]["children"] == ["t-0-4", "t-4-16"]
    assert parent["status"]["finalCheckpoint"]["manifest"].endswith("batch-3/manifest.json")
    child = kube.shards()["t-4-16"]
    assert child["spec"]["restoreFrom"] == {"parent": "t-0-16", "manifest": "/data/state/t/shards/t-0-16/drained.json"}
    assert child["status"]["lineage"] == {"parent": "t-0-16"}
    cfg = json.loads(kube.objects[("configmaps", "t-4-16-config")]["data"]["shard.json"])
    assert cfg["restoreFrom"]["parent"] == "t-0-16" and cfg["keyGroups"] == {"start": 4, "end": 16}
    reasons = [e[2] for e in events]
    for r in ("SplitAccepted", "Draining", "Drained", "ChildCreated", "Split"):
        assert r in reasons
    task = kube.objects[("tasks", "t")]["status"]
    assert [s["name"] for s in task["activeShards"]] == ["t-0-4", "t-4-16"]
    # Two more splits: three shards... four here (demo: 3 shards after two splits of which one is a child).
    request_split(kube, "t-4-16")
    converge(kube, events)
    assert phases(kube)["t-4-10"] == "Running" and phases(kube)["t-10-16"] == "Running"
    assert kube.objects[("tasks", "t")]["status"]["shards"] == 3


def test_children_wait_on_standby_while_the_parent_drains():
    kube = new_world()
    events: list = []
    converge(kube, events)
    request_split(kube, "t-0-16")
    batch: dict[str, int] = {}
    for _ in range(4):  # operator passes while the hand-over is still in progress
        reconcile_task(kube, kube, NS, "t", emit=lambda *a: events.append(a))
        for name in list(kube.shards()):
            reconcile_shard(
                kube, kube, NS, name, emit=lambda *a: events.append(a), backoff=PodReplacementBackoff(base=0.0)
            )
        world_step(kube, batch, hand_over=False)
    assert phases(kube) == {"t-0-16": "Draining", "t-0-8": "Pending", "t-8-16": "Pending"}
    assert set(kube.pods()) == {"t-0-16-driver", "t-0-8-driver", "t-8-16-driver"}  # children start early
    for child in ("t-0-8", "t-8-16"):
        ready = next(c for c in kube.shards()[child]["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "False" and ready["reason"] == "Standby", ready
        assert "parent t-0-16" in ready["message"]
    assert kube.shards()["t-0-16"]["status"]["lineage"]["children"] == ["t-0-8", "t-8-16"]
    assert kube.pod_patches == [], "the parent's pod is not asked to drain"
    task = kube.objects[("tasks", "t")]["status"]
    assert task["phase"] == "Splitting"
    assert [s["name"] for s in task["activeShards"]] == ["t-0-16"]  # the parent owns the range until hand-over
    assert owner_ranges(kube) == [KeyGroupRange(0, 16)]
    converge(kube, events)
    assert phases(kube) == {"t-0-16": "Split", "t-0-8": "Running", "t-8-16": "Running"}


def test_a_taken_child_name_holds_the_split_before_the_drain():
    kube = new_world()
    events: list = []
    converge(kube, events)
    kube._new(
        "taskshards",
        {
            "apiVersion": "taskshard.io/v1alpha1",
            "kind": "TaskShard",
            "metadata": {"name": "t-0-8"},
            "spec": {"taskRef": {"name": "other"}, "keyGroups": {"start": 0, "end": 8}},
        },
    )
    request_split(kube, "t-0-16")
    converge(kube, events)
    assert phases(kube)["t-0-16"] == "SplitRequested"  # not drained: it keeps processing its range
    pod = kube.pods()["t-0-16-driver"]
    assert "running" in pod["status"]["containerStatuses"][0]["state"], "the parent's pod keeps running"
    assert "t-8-16" not in kube.shards(), "no child is created while the other's name is taken"
    degraded = next(c for c in kube.shards()["t-0-16"]["status"]["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "ChildNameTaken" and "t-0-8" in degraded["message"]


def test_crash_at_every_mutation_of_a_split_completes_without_duplicates():
    """Kill the operator after the n-th API write of the split, for every n; a fresh operator completes it."""
    reference = new_world()
    converge(reference, [])
    request_split(reference, "t-0-16")
    start = reference.mutations
    converge(reference, [])
    total = reference.mutations - start
    assert total > 5
    for n in range(1, total + 1):
        kube = new_world()
        converge(kube, [])
        request_split(kube, "t-0-16")
        kube.crash_after = kube.mutations + n
        with pytest.raises(Crash, match="operator killed"):
            converge(kube, [])
        converge(kube, [], backoff=PodReplacementBackoff(base=0.0))  # the restarted operator, with fresh memory
        assert phases(kube) == {"t-0-16": "Split", "t-0-8": "Running", "t-8-16": "Running"}, f"crash at {n}"
        assert count_creations(kube, "taskshards") == {"t-0-16": 1, "t-0-8": 1, "t-8-16": 1}
        assert set(kube.pods()) == {"t-0-8-driver", "t-8-16-driver"}


@pytest.mark.parametrize(
    ("split", "phase_before", "needle"),
    [
        ({"requested": True, "at": 16}, "Running", "spec.split.at: 16 is not strictly inside spec.keyGroups [0, 16)"),
        ({"requested": True, "at": 0}, "Running", "spec.split.at: 0 is not strictly inside"),
    ],
)
def test_bad_requests_change_nothing(split, phase_before, needle):
    kube = new_world()
    events: list = []
    converge(kube, events)
    pods_before = copy.deepcopy(kube.pods())
    kube.patch_custom("taskshards", NS, "t-0-16", {"spec": {"split": split}})
    converge(kube, events)
    shard = kube.shards()["t-0-16"]
    assert shard["status"]["phase"] == phase_before and "split" not in shard["status"]
    rejected = next(c for c in shard["status"]["conditions"] if c["type"] == "SplitRejected")
    assert rejected["status"] == "True" and needle in rejected["message"]
    assert set(kube.shards()) == {"t-0-16"} and kube.pods() == pods_before
    assert any(e[1] == "Warning" and e[2] == "SplitRejected" and needle in e[3] for e in events)


def test_one_group_and_not_running_are_refused():
    kube = new_world({**SPEC, "maxKeyGroups": 2, "initialShards": 2})
    events: list = []
    converge(kube, events)
    request_split(kube, "t-0-1")
    converge(kube, events)
    msg = next(c for c in kube.shards()["t-0-1"]["status"]["conditions"] if c["type"] == "SplitRejected")["message"]
    assert "holds one key group" in msg and kube.shards()["t-0-1"]["status"]["phase"] == "Running"
    # A split parent (not Running) refuses a new request.
    kube = new_world()
    converge(kube, events)
    request_split(kube, "t-0-16")
    converge(kube, events)
    request_split(kube, "t-0-16", at=3)
    converge(kube, events)
    parent = kube.shards()["t-0-16"]
    msg = next(c for c in parent["status"]["conditions"] if c["type"] == "SplitRejected")["message"]
    assert "is in phase Split" in msg and set(kube.shards()) == {"t-0-16", "t-0-8", "t-8-16"}


def test_deleted_pod_is_replaced_with_restart_count():
    kube = new_world()
    converge(kube, [])
    kube.delete_pod(NS, "t-0-16-driver")
    converge(kube, [])
    shard = kube.shards()["t-0-16"]
    assert shard["status"]["phase"] == "Running" and shard["status"]["restarts"] == 1
    assert kube.pods()["t-0-16-driver"]["metadata"]["annotations"][naming.ANNOTATION_RESTARTS_BASE] == "1"


def test_failed_pod_is_replaced_after_backoff():
    kube = new_world()
    converge(kube, [])
    pod = kube.objects[("pods", "t-0-16-driver")]
    pod["status"] = {
        "phase": "Failed",
        "containerStatuses": [
            {
                "name": "driver",
                "restartCount": 2,
                "state": {
                    "terminated": {
                        "exitCode": 1,
                        "reason": "Error",
                        "message": json.dumps({"event": "failed", "shard": "t-0-16", "error": "query failed"}),
                    }
                },
            }
        ],
    }
    backoff = PodReplacementBackoff(base=3600.0)
    events: list = []
    reconcile_shard(kube, kube, NS, "t-0-16", emit=lambda *a: events.append(a), backoff=backoff)
    shard = kube.shards()["t-0-16"]
    assert shard["status"]["phase"] == "Failed" and "query failed" in json.dumps(shard["status"]["conditions"])
    assert "lastCheckpoint" not in shard["status"], "a failure report names no committed batch"
    assert "t-0-16-driver" not in kube.pods()
    # first replacement: now
    reconcile_shard(kube, kube, NS, "t-0-16", emit=lambda *a: events.append(a), backoff=backoff)
    assert "t-0-16-driver" in kube.pods()
    kube.delete_pod(NS, "t-0-16-driver")
    reconcile_shard(kube, kube, NS, "t-0-16", emit=lambda *a: events.append(a), backoff=backoff)  # second: waits
    assert "t-0-16-driver" not in kube.pods()
    cond = next(c for c in kube.shards()["t-0-16"]["status"]["conditions"] if c["type"] == "Progressing")
    assert cond["reason"] == "BackOff"
    # The back-off is the template's: the user's fix rolls to the failed shard and its pod starts at once.
    kube.patch_custom("tasks", NS, "t", {"spec": {"spark": {"image": "img:2"}}})
    reconcile_task(kube, kube, NS, "t", emit=lambda *a: events.append(a))
    reconcile_shard(kube, kube, NS, "t-0-16", emit=lambda *a: events.append(a), backoff=backoff)
    assert kube.pods()["t-0-16-driver"]["spec"]["containers"][0]["image"] == "img:2"
    assert kube.shards()["t-0-16"]["status"]["phase"] == "Failed", "Failed until the new pod commits"


def test_template_change_rolls_one_shard_at_a_time():
    kube = new_world({**SPEC, "initialShards": 2})
    converge(kube, [])
    kube.objects[("tasks", "t")]["spec"]["spark"]["image"] = "img:2"
    seen_restarting: list[set[str]] = []
    batch: dict[str, int] = {}
    for _ in range(30):
        reconcile_task(kube, kube, NS, "t", emit=lambda *a: None)
        for name in list(kube.shards()):
            reconcile_shard(kube, kube, NS, name, emit=lambda *a: None, backoff=PodReplacementBackoff(base=0.0))
        not_running = {n for n, p in phases(kube).items() if p != "Running"}
        seen_restarting.append(not_running)
        world_step(kube, batch)
    assert all(len(s) <= 1 for s in seen_restarting)
    assert {p["spec"]["containers"][0]["image"] for p in kube.pods().values()} == {"img:2"}
    assert any(seen_restarting)


def test_invalid_task_spec_becomes_a_condition():
    kube = new_world({**SPEC, "processor": {"builtin": "sum"}})
    events: list = []
    converge(kube, events)
    task = kube.objects[("tasks", "t")]["status"]
    assert task["phase"] == "Failed"
    ready = next(c for c in task["conditions"] if c["type"] == "Ready")
    assert "spec.processor" in ready["message"] and "field" in ready["message"]
    assert not kube.shards()
    assert any(e[1] == "Warning" and e[2] == "InvalidSpec" for e in events)


def test_task_deletion_stops_pods_then_applies_retention():
    import kopf  # noqa: PLC0415

    from taskshard_operator.reconcile_task import delete_task  # noqa: PLC0415

    kube = new_world({**SPEC, "checkpointRetention": "Delete"})
    converge(kube, [])
    body = kube.objects[("tasks", "t")]
    events: list = []
    with pytest.raises(kopf.TemporaryError, match="shard pods"):
        delete_task(kube, NS, "t", body, emit=lambda *a: events.append(a))
    assert not kube.pods()  # deleted (the fake removes them at once)
    with pytest.raises(kopf.TemporaryError, match="removing the checkpoints"):
        delete_task(kube, NS, "t", body, emit=lambda *a: events.append(a))
    cleanup = kube.objects[("pods", "t-cleanup")]
    assert "/data/state/t" in cleanup["spec"]["containers"][0]["command"][2]
    cleanup["status"] = {"phase": "Succeeded"}
    delete_task(kube, NS, "t", body, emit=lambda *a: events.append(a))
    assert ("pods", "t-cleanup") not in kube.objects
    assert events[-1][2] == "CheckpointsDeleted"
    # Retain: nothing is removed.
    kube = new_world()
    converge(kube, [])
    with pytest.raises(kopf.TemporaryError):
        delete_task(kube, NS, "t", kube.objects[("tasks", "t")], emit=lambda *a: None)
    delete_task(kube, NS, "t", kube.objects[("tasks", "t")], emit=lambda *a: events.append(a))
    assert events[-1][2] == "CheckpointsRetained" and not kube.pods()


# ---------------------------------------------------------------- runtime errors and missing Secrets on the status
TOPIC_MISSING = {
    "event": "failed",
    "shard": "t-0-16",
    "reason": "SourceTopicMissing",
    "field": "source.kafka.topic",
    "error": "source.kafka.topic: topic 'orders' does not exist on 127.0.0.1:9092 (create it or fix the name)",
}


def crash_loop(kube: FakeKube, message: dict | str | None, *, restarts: int = 3, exit_code: int = 3) -> None:
    """The driver container crash-loops in place (restartPolicy OnFailure): waiting, last state terminated."""
    terminated = {"exitCode": exit_code, "reason": "Error"}
    if message is not None:
        terminated["message"] = message if isinstance(message, str) else json.dumps(message)
    kube.objects[("pods", "t-0-16-driver")]["status"] = {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "driver",
                "restartCount": restarts,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting"}},
                "lastState": {"terminated": terminated},
            }
        ],
    }


def waiting(kube: FakeKube, reason: str, message: str) -> None:
    kube.objects[("pods", "t-0-16-driver")]["status"] = {
        "phase": "Pending",
        "containerStatuses": [
            {"name": "driver", "restartCount": 0, "state": {"waiting": {"reason": reason, "message": message}}}
        ],
    }


def shard_conditions(kube: FakeKube) -> dict[str, dict]:
    from taskshard_operator.models.shard import TaskShardStatus  # noqa: PLC0415

    status = kube.shards()["t-0-16"]["status"]
    TaskShardStatus.from_k8s(status)  # what the CRD schema accepts (condition reason pattern, lengths)
    return {c["type"]: c for c in status["conditions"]}


def one_pass(kube: FakeKube, events: list) -> None:
    reconcile_shard(kube, kube, NS, "t-0-16", emit=lambda *a: events.append(a), backoff=PodReplacementBackoff(base=0.0))


def warnings(events: list) -> list[tuple[str, str]]:
    return [(e[2], e[3]) for e in events if e[1] == "Warning"]


def test_crash_loop_shows_the_runtime_error_once_per_error():
    kube = new_world()
    converge(kube, [])
    crash_loop(kube, TOPIC_MISSING)
    events: list = []
    one_pass(kube, events)
    conds = shard_conditions(kube)
    expected = (
        "driver pod t-0-16-driver is CrashLoopBackOff (restarts 3), last exit code 3: source.kafka.topic: topic "
        "'orders' does not exist on 127.0.0.1:9092 (create it or fix the name)"
    )
    assert conds["Degraded"]["status"] == "True" and conds["Degraded"]["reason"] == "SourceTopicMissing"
    assert conds["Degraded"]["message"] == expected
    assert conds["Ready"]["status"] == "False" and conds["Ready"]["reason"] == "SourceTopicMissing"
    assert kube.shards()["t-0-16"]["status"]["phase"] == "Failed"
    assert warnings(events) == [("SourceTopicMissing", expected)]
    # Resyncs and further restarts with the same error: status follows, no new event.
    one_pass(kube, events)
    crash_loop(kube, TOPIC_MISSING, restarts=4)
    one_pass(kube, events)
    assert "(restarts 4)" in shard_conditions(kube)["Degraded"]["message"]
    assert len(warnings(events)) == 1
    # Another error: a new event with its reason.
    crash_loop(kube, {**TOPIC_MISSING, "reason": "StorageAccessDenied", "field": "storage.s3", "error": "403"})
    one_pass(kube, events)
    assert shard_conditions(kube)["Degraded"]["message"].endswith("last exit code 3: storage.s3: 403")
    assert [w[0] for w in warnings(events)] == ["SourceTopicMissing", "StorageAccessDenied"]

    # Restarted: still Failed and Degraded (no flapping to Running with each restart) until it ran STABLE_SECONDS.
    def running_since(seconds_ago: float) -> dict:
        started = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")
        state = {"running": {"startedAt": started}}
        return {"phase": "Running", "containerStatuses": [{"name": "driver", "restartCount": 5, "state": state}]}

    kube.objects[("pods", "t-0-16-driver")]["status"] = {**running_since(5), "conditions": []}
    kube.objects[("pods", "t-0-16-driver")]["status"]["containerStatuses"][0]["ready"] = True
    one_pass(kube, events)
    conds = shard_conditions(kube)
    assert kube.shards()["t-0-16"]["status"]["phase"] == "Failed"
    assert conds["Degraded"]["status"] == "True" and conds["Degraded"]["message"].endswith("storage.s3: 403")
    assert conds["Ready"]["status"] == "False" and conds["Ready"]["reason"] == "Recovering"
    reconcile_task(kube, kube, NS, "t", emit=lambda *a: None)
    task_ready = {c["type"]: c for c in kube.objects[("tasks", "t")]["status"]["conditions"]}["Ready"]
    assert task_ready["status"] == "False", "a Task whose only shard keeps failing is not Ready"
    # Recovered: Healthy again; the same error later is announced again.
    kube.objects[("pods", "t-0-16-driver")]["status"] = running_since(120)
    kube.objects[("pods", "t-0-16-driver")]["status"]["containerStatuses"][0]["ready"] = True
    one_pass(kube, events)
    assert shard_conditions(kube)["Degraded"]["status"] == "False"
    assert kube.shards()["t-0-16"]["status"]["phase"] == "Running"
    crash_loop(kube, TOPIC_MISSING, restarts=6)
    one_pass(kube, events)
    assert [w[0] for w in warnings(events)] == ["SourceTopicMissing", "StorageAccessDenied", "SourceTopicMissing"]


def test_crash_loop_with_an_older_message_or_none():
    kube = new_world()
    converge(kube, [])
    long_error = "query failed: " + "x" * 5000
    crash_loop(kube, {"event": "failed", "shard": "t-0-16", "error": long_error}, exit_code=1)
    events: list = []
    one_pass(kube, events)
    degraded = shard_conditions(kube)["Degraded"]
    assert degraded["reason"] == "CrashLoopBackOff"  # no reason in the message: the pod's
    assert "last exit code 1: query failed: xxx" in degraded["message"] and degraded["message"].endswith("...")
    assert 1000 <= len(degraded["message"]) < 1100
    one_pass(kube, events)
    assert [w[0] for w in warnings(events)] == ["PodFailed"]
    # A reason that is no valid condition reason falls back; a message without an error (or no JSON) as before.
    crash_loop(kube, {**TOPIC_MISSING, "reason": "not a reason!"})
    one_pass(kube, events)
    assert shard_conditions(kube)["Degraded"]["reason"] == "CrashLoopBackOff"
    for message in ({"event": "failed", "shard": "t-0-16"}, "Traceback (most recent call last): ...", None):
        crash_loop(kube, message)
        one_pass(kube, events)
        degraded = shard_conditions(kube)["Degraded"]
        assert degraded["reason"] == "CrashLoopBackOff"
        assert degraded["message"].endswith("the kubelet restarts it with back-off, last exit code 3")


def test_failed_pod_shows_the_runtime_error_and_is_replaced():
    kube = new_world()
    converge(kube, [])
    failed = {
        "phase": "Failed",
        "containerStatuses": [
            {
                "name": "driver",
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 3, "reason": "Error", "message": json.dumps(TOPIC_MISSING)}},
            }
        ],
    }
    kube.objects[("pods", "t-0-16-driver")]["status"] = copy.deepcopy(failed)
    events: list = []
    one_pass(kube, events)
    conds = shard_conditions(kube)
    assert conds["Degraded"]["reason"] == "SourceTopicMissing" and conds["Ready"]["reason"] == "SourceTopicMissing"
    assert conds["Degraded"]["message"].startswith(
        "pod t-0-16-driver failed, last exit code 3: source.kafka.topic: topic 'orders' does not exist"
    )
    assert conds["Degraded"]["message"].endswith("; replacing it (last-state restart)")
    assert "t-0-16-driver" not in kube.pods()
    assert [w[0] for w in warnings(events)] == ["SourceTopicMissing"]
    one_pass(kube, events)  # the replacement
    kube.objects[("pods", "t-0-16-driver")]["status"] = copy.deepcopy(failed)
    one_pass(kube, events)  # ends the same way: replaced again, no second event
    assert "t-0-16-driver" not in kube.pods()
    assert [w[0] for w in warnings(events)] == ["SourceTopicMissing"]


def test_a_refused_template_is_held_with_its_reason_until_the_template_changes():
    """A runtime that refuses its template (exit 0, event ``refused``, e.g. StateSchemaIncompatible) is not restarted
    into a crash loop: the pod stays, the shard says why, once; a new template replaces the pod."""
    kube = new_world()
    converge(kube, [])
    kube.objects[("tasks", "t")]["spec"]["spark"]["image"] = "img:2"
    converge(kube, [])
    assert kube.pods()["t-0-16-driver"]["spec"]["containers"][0]["image"] == "img:2"
    refusal = {
        "event": "refused",
        "shard": "t-0-16",
        "error": "state column 'count': int cannot be read as string",
        "reason": "StateSchemaIncompatible",
        "field": "processor.python",
    }
    kube.objects[("pods", "t-0-16-driver")]["status"] = {
        "phase": "Succeeded",
        "containerStatuses": [
            {
                "name": "driver",
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": json.dumps(refusal)}},
            }
        ],
    }
    events: list = []
    for _ in range(3):
        one_pass(kube, events)
        reconcile_task(kube, kube, NS, "t", emit=lambda *a: events.append(a))
    conds = shard_conditions(kube)
    assert kube.shards()["t-0-16"]["status"]["phase"] == "Failed"
    assert conds["Degraded"]["reason"] == "StateSchemaIncompatible" and conds["Ready"]["status"] == "False"
    assert "state column 'count'" in conds["Degraded"]["message"]
    assert "t-0-16-driver" in kube.pods(), "the refused pod is kept: restarting it would refuse again"
    assert [w[0] for w in warnings(events)].count("StateSchemaIncompatible") == 1
    # The fix: a new template goes to the refused shard and replaces its pod.
    kube.objects[("tasks", "t")]["spec"]["spark"]["image"] = "img:3"
    converge(kube, [])
    assert kube.pods()["t-0-16-driver"]["spec"]["containers"][0]["image"] == "img:3"
    assert phases(kube) == {"t-0-16": "Failed"}, "healthy only once the new pod has run a while"
    kube.objects[("pods", "t-0-16-driver")]["status"]["containerStatuses"][0]["state"] = {
        "running": {"startedAt": "2020-01-01T00:00:00Z"}
    }
    one_pass(kube, events)
    assert phases(kube) == {"t-0-16": "Running"}


S3_SPEC = {**SPEC, "storage": {"s3": {"bucket": "bkt", "credentialsSecret": "taskshard-s3"}}}


@pytest.mark.parametrize(
    "kubelet",
    [
        'secret "taskshard-s3" not found',
        "couldn't find key AWS_SECRET_ACCESS_KEY in Secret ns/taskshard-s3",
        "env AWS_ACCESS_KEY_ID: secret 'taskshard-s3' not found",  # localkube
    ],
)
def test_missing_credentials_secret_is_named(kubelet):
    kube = new_world(S3_SPEC)
    converge(kube, [])
    env = {e["name"]: e for e in kube.pods()["t-0-16-driver"]["spec"]["containers"][0]["env"]}
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "taskshard-s3"
    waiting(kube, "CreateContainerConfigError", kubelet)
    events: list = []
    one_pass(kube, events)
    one_pass(kube, events)
    conds = shard_conditions(kube)
    for cond in (conds["Ready"], conds["Degraded"]):
        assert cond["reason"] == "SecretMissing"
        assert "Secret 'taskshard-s3' (spec.storage.s3.credentialsSecret)" in cond["message"]
        assert kubelet in cond["message"]
    assert conds["Degraded"]["status"] == "True"
    assert [w[0] for w in warnings(events)] == ["SecretMissing"]
    # The Secret appears: the pod runs, the shard is healthy.
    kube.objects[("pods", "t-0-16-driver")]["status"] = {
        "phase": "Running",
        "containerStatuses": [{"name": "driver", "restartCount": 0, "state": {"running": {}}, "ready": True}],
    }
    one_pass(kube, events)
    conds = shard_conditions(kube)
    assert conds["Ready"]["status"] == "True" and conds["Degraded"]["reason"] == "Healthy"


def test_other_config_errors_are_not_blamed_on_the_secret():
    kube = new_world(S3_SPEC)
    converge(kube, [])
    waiting(kube, "CreateContainerConfigError", 'secret "taskshard-s3-other" not found')
    events: list = []
    one_pass(kube, events)
    ready = shard_conditions(kube)["Ready"]
    assert ready["reason"] == "PodStarting"
    assert ready["message"] == (
        'driver pod t-0-16-driver is Pending (CreateContainerConfigError: secret "taskshard-s3-other" not found)'
    )
    assert not warnings(events)
    # Without a credentials Secret in the spec nothing is called SecretMissing either.
    kube = new_world()
    converge(kube, [])
    waiting(kube, "CreateContainerConfigError", 'secret "taskshard-s3" not found')
    one_pass(kube, events)
    assert shard_conditions(kube)["Ready"]["reason"] == "PodStarting"


def test_suspend_stops_every_shard_and_resume_continues_with_a_waiting_split():
    """spec.suspend: true deletes every pod (gracefully: the runtime stops with a savepoint) and the shards show
    Suspended, still owning their ranges; a split requested meanwhile waits visibly; false resumes each shard
    (a fresh pod, not counted as a restart) and the waiting split then runs."""
    kube = new_world({**SPEC, "initialShards": 2})
    events: list = []
    converge(kube, events)
    kube.patch_custom("tasks", NS, "t", {"spec": {"suspend": True}})
    converge(kube, events)
    assert phases(kube) == {"t-0-8": "Suspended", "t-8-16": "Suspended"}
    assert kube.pods() == {}
    task = kube.objects[("tasks", "t")]["status"]
    conds = {c["type"]: c for c in task["conditions"]}
    assert task["phase"] == "Suspended" and conds["Ready"]["reason"] == "Suspended"
    assert "2 of 2 shards stopped" in conds["Ready"]["message"] and conds["Tiled"]["status"] == "True"

    request_split(kube, "t-0-8")
    converge(kube, events)
    assert set(kube.shards()) == {"t-0-8", "t-8-16"}, "no split while suspended"
    waiting = {c["type"]: c for c in kube.shards()["t-0-8"]["status"]["conditions"]}["SplitRejected"]
    assert waiting["status"] == "False" and waiting["reason"] == "SplitWaiting" and "suspend" in waiting["message"]
    assert len([e for e in events if e[2] == "SplitWaiting"]) == 1

    restarts = {n: s["status"].get("restarts", 0) for n, s in kube.shards().items()}
    kube.patch_custom("tasks", NS, "t", {"spec": {"suspend": False}})
    converge(kube, events)
    assert phases(kube) == {"t-0-8": "Split", "t-0-4": "Running", "t-4-8": "Running", "t-8-16": "Running"}
    assert kube.shards()["t-8-16"]["status"].get("restarts", 0) == restarts["t-8-16"], "a resume is no restart"
    assert kube.objects[("tasks", "t")]["status"]["phase"] == "Running"
    assert [e[2] for e in events].count("Resuming") == 2


def test_suspend_during_a_split_lets_it_finish_then_suspends_the_children():
    """A split in progress only moves forward: suspending mid-split finishes it and suspends the children."""
    kube = new_world()
    events: list = []
    converge(kube, events)
    request_split(kube, "t-0-16")
    reconcile_shard(kube, kube, NS, "t-0-16", emit=lambda *a: events.append(a), backoff=PodReplacementBackoff(base=0.0))
    assert phases(kube)["t-0-16"] == "SplitRequested"
    kube.patch_custom("tasks", NS, "t", {"spec": {"suspend": True}})
    converge(kube, events)
    assert phases(kube) == {"t-0-16": "Split", "t-0-8": "Suspended", "t-8-16": "Suspended"}
    assert kube.pods() == {}


# ---------------------------------------------------------------- the user's fix reaches a failing shard (#53)
PROCESSOR_FAILED = {
    "event": "failed",
    "shard": "t-0-16",
    "reason": "ProcessorFailed",
    "field": "processor.python",
    "error": "batch 3: Poison.process raised ValueError: poison record k7 (key group 5)",
}
POISON = {"processor": {"python": "procs:Poison", "parameters": {"failKey": "k7", "failValue": -1.0}}}
SINK_DENIED = {**TOPIC_MISSING, "reason": "StorageAccessDenied", "field": "sink.directory.path", "error": "denied"}
FIXES = {
    # case: (the Task before, how the pod fails, the user's fix as a merge patch of the Task's spec)
    "processor parameters": (
        POISON,
        PROCESSOR_FAILED,
        {"processor": {"parameters": {"failKey": None, "failValue": None}}},
    ),
    "processor.python": (POISON, PROCESSOR_FAILED, {"processor": {"python": "procs:Fixed"}}),
    "image": ({}, PROCESSOR_FAILED, {"spark": {"image": "img:2"}}),
    "image that cannot be pulled": ({}, "ImagePullBackOff", {"spark": {"image": "img:2"}}),
    "spark.conf": ({}, PROCESSOR_FAILED, {"spark": {"conf": {"spark.sql.shuffle.partitions": "4"}}}),
    "resources": ({}, "OOMKilled", {"spark": {"resources": {"requests": {"memory": "4Gi"}}}}),
    "env": ({}, "CreateContainerConfigError", {"spark": {"env": [{"name": "FIXED", "value": "1"}]}}),
    "source": ({}, TOPIC_MISSING, {"source": {"journal": {"path": "/data/journal/other"}}}),
    "sink": ({}, SINK_DENIED, {"sink": {"directory": {"path": "/data/out/other"}}}),
}


def break_pod(kube: FakeKube, how: dict | str) -> None:
    """The driver pod fails as ``how`` says: a runtime failure (its termination message) in a crash loop, an
    OOM kill in a crash loop, or a container that cannot start (the kubelet's waiting reason)."""
    if isinstance(how, dict):
        crash_loop(kube, how)
    elif how == "OOMKilled":
        crash_loop(kube, None, exit_code=137)
    else:
        waiting(kube, how, f"{how}: the kubelet cannot start the container")


def pod_hash(kube: FakeKube) -> str | None:
    pod = kube.pods().get("t-0-16-driver")
    return pod["metadata"]["annotations"][naming.ANNOTATION_TEMPLATE_HASH] if pod else None


def running_for(kube: FakeKube, seconds: float) -> None:
    started = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    kube.objects[("pods", "t-0-16-driver")]["status"] = {
        "phase": "Running",
        "containerStatuses": [{"name": "driver", "restartCount": 0, "state": {"running": {"startedAt": started}}}],
    }


def task_condition(kube: FakeKube, type_: str) -> dict:
    return {c["type"]: c for c in kube.objects[("tasks", "t")]["status"]["conditions"]}[type_]


def roll_passes(kube: FakeKube, backoff: PodReplacementBackoff, events: list, n: int = 6) -> list[str]:
    """``n`` rounds of a Task pass, a shard pass and the world's step; the shard's phase after each."""
    seen = []
    for _ in range(n):
        reconcile_task(kube, kube, NS, "t", emit=lambda *a: events.append(a))
        reconcile_shard(kube, kube, NS, "t-0-16", emit=lambda *a: events.append(a), backoff=backoff)
        world_step(kube, {})
        seen.append(phases(kube)["t-0-16"])
    return seen


@pytest.mark.parametrize("case", list(FIXES))
def test_the_users_fix_rolls_to_the_failing_shard_at_once_and_it_stays_failed_until_it_commits(case):
    """#53: whatever the user fixes in the Task (processor parameters or code, image, Spark conf, resources, env,
    source, sink), the shard that fails on the old template gets the new one at once: no wait for its crash-loop
    back-off or for the operator's replacement back-off of the old template. It stays Failed (Recovering) until
    the new pod commits, then runs; the Task's roll ends."""
    before, how, fix = FIXES[case]
    spec = copy.deepcopy(SPEC)
    spec.update(copy.deepcopy(before))
    kube = new_world(spec)
    converge(kube, [])
    old = pod_hash(kube)
    break_pod(kube, how)
    events: list = []
    one_pass(kube, events)
    failed = phases(kube)["t-0-16"]
    assert failed == ("Failed" if isinstance(how, dict) or how == "OOMKilled" else "Running"), failed
    backoff = PodReplacementBackoff(base=3600.0)  # the old template's replacements would wait an hour
    uid = kube.shards()["t-0-16"]["metadata"]["uid"]
    backoff.record(uid, old)
    backoff.record(uid, old)

    kube.patch_custom("tasks", NS, "t", {"spec": fix})
    seen = roll_passes(kube, backoff, events)
    new = kube.objects[("tasks", "t")]["status"]["templateHash"]
    assert new != old and pod_hash(kube) == new, "the fix reached the failing shard's pod at once"
    if failed == "Failed":
        assert set(seen) == {"Failed"}, f"a replaced failing shard stays Failed until it commits: {seen}"
        assert task_condition(kube, "Ready")["status"] == "False"
    running_for(kube, 120)  # the new pod ran (and committed): healthy
    roll_passes(kube, backoff, events, n=2)
    assert phases(kube)["t-0-16"] == "Running"
    assert task_condition(kube, "Progressing")["reason"] == "Stable"
    assert task_condition(kube, "Ready")["status"] == "True"
    assert not [e for e in events if e[2] == "RollHeld"]


def test_a_fix_that_fails_too_holds_the_roll_there_without_looping_and_the_next_fix_goes_there_first():
    """A fix that fails on the failing shard again stops the roll at it: the Task says so (Progressing=False,
    reason RollHeld, one Warning event), the shard stays Failed with its pod restarting in place under the kubelet's
    back-off (never replaced again by the operator, never re-annotated), and no other shard gets that template.
    The next fix goes to it first."""
    kube = new_world({**SPEC, **copy.deepcopy(POISON), "initialShards": 2})
    converge(kube, [])
    low, high = "t-0-8", "t-8-16"

    def crash(shard: str, restarts: int) -> None:
        kube.objects[("pods", f"{shard}-driver")]["status"] = {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "driver",
                    "restartCount": restarts,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
                    "lastState": {
                        "terminated": {"exitCode": 1, "message": json.dumps({**PROCESSOR_FAILED, "shard": shard})}
                    },
                }
            ],
        }

    def hashes() -> dict[str, str]:
        return {n: p["metadata"]["annotations"][naming.ANNOTATION_TEMPLATE_HASH] for n, p in kube.pods().items()}

    def passes(n: int, events: list) -> None:
        for _ in range(n):
            reconcile_task(kube, kube, NS, "t", emit=lambda *a: events.append(a))
            for name in (low, high):
                reconcile_shard(kube, kube, NS, name, emit=lambda *a: events.append(a), backoff=PodReplacementBackoff())
            world_step(kube, {})

    old = hashes()[f"{low}-driver"]
    events: list = []
    crash(high, 3)
    passes(1, events)
    kube.patch_custom("tasks", NS, "t", {"spec": {"processor": {"parameters": {"failValue": -2.0}}}})  # still fails
    passes(3, events)
    first = kube.objects[("tasks", "t")]["status"]["templateHash"]
    assert hashes() == {f"{low}-driver": old, f"{high}-driver": first}, "the failing shard, not first, rolled first"
    assert [e[3].split()[2] for e in events if e[2] == "RollingShard"] == [high], "announced, though the Task changed"
    crash(high, 1)  # the new pod fails as well
    passes(1, events)
    held_pod = kube.pods()[f"{high}-driver"]["metadata"]["uid"]
    passes(5, events)
    progressing = task_condition(kube, "Progressing")
    assert progressing["status"] == "False" and progressing["reason"] == "RollHeld", progressing
    assert high in progressing["message"] and "ProcessorFailed" in progressing["message"]
    assert [e[2] for e in events if e[2] == "RollHeld"] == ["RollHeld"], "one Warning event"
    assert hashes()[f"{low}-driver"] == old, "no other shard gets a template that fails"
    assert kube.pods()[f"{high}-driver"]["metadata"]["uid"] == held_pod, "the held pod is not replaced again"
    assert phases(kube)[high] == "Failed"
    assert kube.shards()[low]["metadata"]["annotations"][naming.ANNOTATION_TEMPLATE_HASH] == old

    kube.patch_custom("tasks", NS, "t", {"spec": {"processor": {"parameters": {"failKey": None, "failValue": None}}}})
    passes(3, events)
    fixed = kube.objects[("tasks", "t")]["status"]["templateHash"]
    assert hashes() == {f"{low}-driver": old, f"{high}-driver": fixed}, "the next fix goes to the held shard first"
    high_pod = kube.objects[("pods", f"{high}-driver")]
    started = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=120)).strftime("%Y-%m-%dT%H:%M:%SZ")
    high_pod["status"]["containerStatuses"][0]["state"] = {"running": {"startedAt": started}}
    passes(4, events)
    assert set(hashes().values()) == {fixed}, "then the rest of the roll"
    assert phases(kube) == {low: "Running", high: "Running"}
