"""Environment problems reach the TaskShard's status: the operator and a real shard pod, no Spark job needed.

- storage on an S3 endpoint nobody listens on: the runtime's preflight fails before anything is processed,
  exits 3 with a termination message naming ``storage.s3.endpoint``; the TaskShard's Degraded condition carries
  the reason ``StorageUnreachable`` and the error, with a Warning event, while the kubelet retries the pod;
- credentials from a Secret: the pod's environment takes ``AWS_*`` from the Secret by reference (the values
  are in no ConfigMap); a Secret that does not exist is named on the status (reason ``SecretMissing``).
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.cluster.operator_fixtures import apply, operator_crds, operator_process, task_manifest  # noqa: F401
from tests.waiting import get_json, wait_for

pytestmark = pytest.mark.cluster


def s3_task(name: str, data_dir, endpoint: str, secret: str) -> dict:
    manifest = task_manifest(name, data_dir)
    manifest["spec"]["storage"] = {
        "s3": {"bucket": "taskshard-state", "prefix": "e2e", "endpoint": endpoint, "credentialsSecret": secret},
        "volume": {"hostPath": str(data_dir), "mountPath": "/data"},
    }
    return manifest


def degraded(kubectl, shard: str) -> dict:
    st = get_json(kubectl, "taskshard", shard).get("status") or {}
    return next((c for c in st.get("conditions") or [] if c["type"] == "Degraded"), {})


def test_unreachable_bucket_and_missing_secret_show_on_the_shard_status(kubectl, operator_process, tmp_path):  # noqa: F811
    from testinfra.common import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s3-creds"},
        "stringData": {"AWS_ACCESS_KEY_ID": "AKTEST", "AWS_SECRET_ACCESS_KEY": "sekrit-value"},
    }
    kubectl("apply", "-f", "-", input=yaml.safe_dump(secret))
    apply(kubectl, s3_task("unreach", tmp_path, endpoint, "s3-creds"))
    apply(kubectl, s3_task("nosecret", tmp_path, endpoint, "no-such-secret"))
    shard = "unreach-0-16"

    def unreachable_shown():
        cond = degraded(kubectl, shard)
        return cond if cond.get("reason") == "StorageUnreachable" and cond.get("status") == "True" else None

    cond = wait_for(unreachable_shown, timeout=180, what=f"{shard} Degraded with reason StorageUnreachable")
    assert "storage.s3.endpoint" in cond["message"] and endpoint.split("//")[1] in cond["message"]
    assert "exit code 3" in cond["message"]
    events = get_json(kubectl, "events", "--field-selector", f"involvedObject.name={shard}")["items"]
    assert any(e["type"] == "Warning" and e["reason"] == "StorageUnreachable" for e in events)
    # The credentials reach the pod by reference only.
    pod = get_json(kubectl, "pods", "-l", "taskshard.io/shard=" + shard)["items"][0]
    env = {e["name"]: e for e in pod["spec"]["containers"][0].get("env") or []}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "s3-creds",
        "key": "AWS_SECRET_ACCESS_KEY",
        "optional": False,
    }
    configmaps = get_json(kubectl, "configmaps")["items"]
    assert "sekrit-value" not in json.dumps(configmaps)

    def missing_secret_shown():
        cond = degraded(kubectl, "nosecret-0-16")
        return cond if cond.get("reason") == "SecretMissing" else None

    cond = wait_for(missing_secret_shown, timeout=120, what="nosecret-0-16 Degraded with reason SecretMissing")
    assert "no-such-secret" in cond["message"] and "spec.storage.s3.credentialsSecret" in cond["message"]


def test_overlapping_shards_are_refused_not_run(kubectl, operator_process, tmp_path):  # noqa: F811
    """Tiling is enforced on the real apiserver and operator: editing initialShards of a live Task is refused
    with the field named, and a TaskShard made by hand (no labels, only a taskRef) over owned key groups gets no
    pod; it says RangeOverlap and the Task says Tiled=False naming the overlap."""
    from testinfra.common import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"  # the pods fail fast at their preflight: no Spark job needed
    task = s3_task("tiles", tmp_path, endpoint, "no-secret-needed")
    task["spec"]["initialShards"] = 2
    task["spec"]["storage"]["s3"].pop("credentialsSecret")
    apply(kubectl, task)
    wait_for(
        lambda: (
            {s["metadata"]["name"] for s in get_json(kubectl, "taskshards")["items"]} >= {"tiles-0-8", "tiles-8-16"}
        ),
        timeout=120,
        what="the two initial shards",
    )
    edit = kubectl("patch", "task", "tiles", "--type", "merge", "-p", '{"spec":{"initialShards":4}}', check=False)
    assert edit.returncode != 0 and "spec.initialShards" in edit.stderr and "split" in edit.stderr, edit.stderr
    stray = {
        "apiVersion": "taskshard.io/v1alpha1",
        "kind": "TaskShard",
        "metadata": {"name": "stray"},
        "spec": {"taskRef": {"name": "tiles"}, "keyGroups": {"start": 4, "end": 12}},
    }
    kubectl("apply", "-f", "-", input=yaml.safe_dump(stray))

    def refused():
        cond = degraded(kubectl, "stray")
        return cond if cond.get("reason") == "RangeOverlap" else None

    cond = wait_for(refused, timeout=120, what="the stray TaskShard refused with RangeOverlap")
    assert "tiles-0-8 [0, 8)" in cond["message"] and "tiles-8-16 [8, 16)" in cond["message"]

    def tiled_false():
        conds = (get_json(kubectl, "task", "tiles").get("status") or {}).get("conditions") or []
        tiled = next((c for c in conds if c["type"] == "Tiled"), {})
        return tiled if tiled.get("status") == "False" else None

    assert "overlap" in wait_for(tiled_false, timeout=120, what="Tiled=False on the Task")["message"]
    pods = {p["metadata"]["name"] for p in get_json(kubectl, "pods")["items"]}
    assert "stray-driver" not in pods and {"tiles-0-8-driver", "tiles-8-16-driver"} <= pods
    assert {s["metadata"]["name"] for s in get_json(kubectl, "taskshards")["items"]} == {
        "tiles-0-8",
        "tiles-8-16",
        "stray",
    }, "the refused edit created nothing"
    kubectl("delete", "taskshard", "stray")
    kubectl("delete", "task", "tiles", "--wait=false")


def test_a_63_character_task_name_runs_and_a_64_character_one_is_refused(kubectl, operator_process, tmp_path):  # noqa: F811
    """Names stay within Kubernetes' limits for any valid Task name: a 63-character Task gets its shards (hashed
    names of at most 47 characters), their ConfigMaps, pods and labels; a 64-character name, or one with a dot,
    is refused by the apiserver naming metadata.name and the limit or the value."""
    from testinfra.common import free_port

    long_name = "long" + "n" * 58 + "e"
    assert len(long_name) == 63
    task = s3_task(long_name, tmp_path, f"http://127.0.0.1:{free_port()}", "unused")
    task["spec"]["initialShards"] = 2
    task["spec"]["storage"]["s3"].pop("credentialsSecret")
    for bad, says in ((long_name + "x", "may not be more than 63"), ("orders.v2", '"orders.v2"')):
        refused = kubectl("apply", "-f", "-", input=yaml.safe_dump({**task, "metadata": {"name": bad}}), check=False)
        assert refused.returncode != 0 and "metadata.name" in refused.stderr and says in refused.stderr, refused.stderr
    apply(kubectl, task)
    selector = f"taskshard.io/task={long_name}"

    def pods_and_phases():
        shards = get_json(kubectl, "taskshards", "-l", selector)["items"]
        pods = get_json(kubectl, "pods", "-l", selector)["items"]
        if len(shards) == 2 and len(pods) == 2 and all((s.get("status") or {}).get("phase") for s in shards):
            return shards, pods
        return None

    shards, pods = wait_for(pods_and_phases, timeout=120, what="two shards with phases and two driver pods")
    names = [s["metadata"]["name"] for s in shards]
    assert all(len(n) <= 47 for n in names), names
    assert sorted(r for n in names for r in ("0-8", "8-16") if n.endswith(f"-{r}")) == ["0-8", "8-16"], names
    assert {p["metadata"]["labels"]["taskshard.io/shard"] for p in pods} == set(names)
    configmaps = get_json(kubectl, "configmaps", "-l", selector)["items"]
    assert len(configmaps) == 2
    kubectl("delete", "task", long_name, "--wait=false")


def test_a_task_is_deleted_promptly_with_the_production_resync(kubectl, operator_process, tmp_path):  # noqa: F811
    """Nothing the operator runs per Task (its resync daemon waits minutes between passes) holds the Task's
    finalizer: with the production defaults, deleting a Task finishes within a minute."""
    from testinfra.common import free_port

    operator_process.stop()
    operator_process.start(resync_seconds=None)
    task = s3_task("gone", tmp_path, f"http://127.0.0.1:{free_port()}", "unused")
    task["spec"]["storage"]["s3"].pop("credentialsSecret")
    apply(kubectl, task)
    wait_for(
        lambda: (get_json(kubectl, "task", "gone").get("status") or {}).get("shards") == 1,
        timeout=120,
        what="the Task's shard",
    )
    deleted = kubectl("delete", "task", "gone", "--wait=true", "--timeout=60s", check=False)
    assert deleted.returncode == 0, deleted.stderr
    assert kubectl("get", "task", "gone", check=False).returncode != 0
