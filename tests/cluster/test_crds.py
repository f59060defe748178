"""The Task and TaskShard CRDs on a real kube-apiserver: schemas, CEL rules, immutability, split requests.

The CRDs are applied once per module (server-side apply, idempotent) and left installed for later modules.
No operator runs here: these tests exercise only the apiserver's validation of what users and the operator write.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid

import pytest
import yaml

from taskshard_operator.models import Task, TaskShard
from tests.unit.manifest_cases import (
    BAD_CASES,
    CRDS_DIR,
    GOOD_CASES,
    base_shard,
    base_task,
    example_files,
    journal_source,
    kafka_source,
    merge_patch,
)

pytestmark = pytest.mark.cluster

CRD_NAMES = ("tasks.taskshard.io", "taskshards.taskshard.io")


@pytest.fixture(scope="module")
def crds(kube_cluster):
    """Install (or update) the CRDs and wait until the apiserver serves them."""
    result = kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS_DIR))
    assert "Warning" not in result.stderr, result.stderr
    kube_cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in CRD_NAMES))
    return kube_cluster


@pytest.fixture(scope="module")
def crd_namespace(crds):
    """One namespace for the module's many small checks (each object gets a unique name)."""
    name = f"crds-{uuid.uuid4().hex[:6]}"
    crds.kubectl("create", "namespace", name)
    yield name
    crds.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def k(crds, crd_namespace):
    """kubectl bound to the module namespace."""

    def run(*args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        return crds.kubectl(*args, input=input, check=check, namespace=crd_namespace)

    return run


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _create(k, obj: dict) -> dict:
    k("create", "-f", "-", input=json.dumps(obj))
    kind = "task" if obj["kind"] == "Task" else "taskshard"
    return json.loads(k("get", kind, obj["metadata"]["name"], "-o", "json").stdout)


def _patch(k, kind: str, name: str, patch: dict, check: bool = False) -> subprocess.CompletedProcess:
    return k("patch", kind, name, "--type", "merge", "-p", json.dumps(patch), check=check)


def test_crds_are_established_with_names_and_columns(crds):
    for name in CRD_NAMES:
        crd = json.loads(crds.kubectl("get", "crd", name, "-o", "json").stdout)
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions.get("Established") == "True" and conditions.get("NamesAccepted") == "True", conditions
    resources = crds.kubectl("api-resources", "--api-group=taskshard.io", "-o", "wide").stdout
    assert "tsk" in resources and "tss" in resources


def test_crd_apply_is_idempotent(crds):
    again = crds.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS_DIR))
    assert "serverside-applied" in again.stdout


@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.name)
def test_examples_pass_server_dry_run(k, path):
    result = k("apply", "--dry-run=server", "-f", str(path))
    assert "created (server dry run)" in result.stdout, result.stdout + result.stderr


def test_examples_apply_and_come_back_as_valid_models(k):
    for path in example_files():
        k("apply", "-f", str(path))
    listed = json.loads(k("get", "tasks", "-o", "json").stdout)["items"]
    names = {t["metadata"]["name"] for t in listed}
    for path in example_files():
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert raw["metadata"]["name"] in names
    for obj in listed:
        task = Task.from_k8s({**obj, "metadata": obj["metadata"]})
        assert task.spec.max_key_groups >= 1
    table = k("get", "tsk").stdout
    assert table.split("\n")[0].split() == ["NAME", "SHARDS", "DESIRED", "PHASE", "READY", "RATE", "LAG", "AGE"]


def test_server_defaults_match_the_models(k):
    raw = base_task(_unique("defaults"))
    for key in ("initialShards", "keyField", "checkpointRetention"):
        raw["spec"].pop(key)
    raw["spec"]["spark"].pop("triggerInterval")
    stored = _create(k, raw)
    assert Task.from_k8s(stored).spec == Task.from_k8s(raw).spec  # apiserver defaults == model defaults
    assert stored["spec"]["initialShards"] == 1 and stored["spec"]["keyField"] == "key"


@pytest.mark.parametrize("case", BAD_CASES, ids=lambda c: c.id)
def test_bad_manifest_is_rejected_naming_the_field(k, case):
    manifest = case.manifest(name=_unique(case.id.lower())[:60])
    result = k("apply", "--dry-run=server", "-f", "-", input=json.dumps(manifest), check=False)
    assert result.returncode != 0, f"{case.id} was accepted: {result.stdout}"
    assert case.field in result.stderr, result.stderr
    if case.message:  # a CEL messageExpression: the same text as the models' error
        assert case.message in result.stderr, result.stderr


@pytest.mark.parametrize("case", GOOD_CASES, ids=lambda c: c.id)
def test_good_manifest_is_accepted_and_reads_back_as_the_same_model(k, case):
    manifest = case.manifest(name=_unique(case.id.lower())[:60])
    stored = _create(k, manifest)
    assert Task.from_k8s(stored).spec == Task.from_k8s(manifest).spec


def test_task_immutable_fields_cannot_change(k):
    name = _unique("immutable")
    _create(k, base_task(name))
    for patch, field in [
        ({"spec": {"maxKeyGroups": 256}}, "spec.maxKeyGroups"),
        ({"spec": {"keyField": "other"}}, "spec.keyField"),
        ({"spec": {"storage": {"path": "/data/elsewhere"}}}, "spec.storage"),
        ({"spec": {"initialShards": 4}}, "spec.initialShards"),
    ]:
        result = _patch(k, "task", name, patch)
        assert result.returncode != 0 and field in result.stderr and "immutable" in result.stderr, result.stderr
    # The refusal says how to scale instead.
    refusal = _patch(k, "task", name, {"spec": {"initialShards": 3}}).stderr
    assert "spec.split.requested: true" in refusal and "kubectl scale task" in refusal, refusal
    ok = _patch(k, "task", name, {"spec": {"spark": {"image": "taskshard/shard:0.2.0"}}})
    assert ok.returncode == 0, ok.stderr  # template edits are allowed (they roll the shards)


def _refused(k, name: str, patch: dict, field: str, *words: str) -> None:
    result = _patch(k, "task", name, patch)
    assert result.returncode != 0, f"{patch} was accepted"
    assert field in result.stderr and all(w in result.stderr for w in words), result.stderr


def test_partitioned_by_key_and_its_partition_count_are_immutable(k):
    journal = _unique("by-key-journal")
    _create(k, merge_patch(base_task(journal), {"spec": journal_source(partitions=4, partitionedByKey=True)}))
    flip = {"spec": journal_source(partitionedByKey=False)}
    _refused(k, journal, flip, "spec.source.journal.partitionedByKey", "immutable", "create a new Task")
    _refused(k, journal, {"spec": journal_source(partitions=8)}, "spec.source.journal.partitions", "immutable")
    switch = {"spec": kafka_source(partitionedByKey=True, partitions=4)}
    _refused(k, journal, switch, "spec.source", "cannot switch between journal and kafka")
    image = _patch(k, "task", journal, {"spec": {"spark": {"image": "taskshard/shard:0.2.0"}}})
    assert image.returncode == 0, image.stderr  # other edits pass the transition rules

    kafka = _unique("by-key-kafka")
    by_key = {"maxKeyGroups": 256, **kafka_source(partitionedByKey=True, partitions=8)}
    _create(k, merge_patch(base_task(kafka), {"spec": by_key}))
    _refused(k, kafka, {"spec": kafka_source(partitions=16)}, "spec.source.kafka.partitions", "immutable")
    flip = {"spec": kafka_source(partitionedByKey=False, partitions=None)}
    _refused(k, kafka, flip, "spec.source.kafka.partitionedByKey", "immutable")
    stored = json.loads(k("get", "task", kafka, "-o", "json").stdout)["spec"]["source"]["kafka"]
    assert (stored["partitionedByKey"], stored["partitions"]) == (True, 8)

    plain = _unique("plain")
    _create(k, base_task(plain))
    flip = {"spec": journal_source(partitionedByKey=True)}
    _refused(k, plain, flip, "spec.source.journal.partitionedByKey", "immutable")
    switch = {"spec": kafka_source(partitionedByKey=True, partitions=4)}
    _refused(k, plain, switch, "spec.source", "cannot switch between journal and kafka")
    for patch in (journal_source(partitions=3), journal_source(path="/data/journal/other"), kafka_source()):
        result = _patch(k, "task", plain, {"spec": patch})  # without the mode these stay allowed
        assert result.returncode == 0, (patch, result.stderr)
    flip = {"spec": kafka_source(partitionedByKey=True, partitions=4)}
    _refused(k, plain, flip, "spec.source.kafka.partitionedByKey", "immutable")


def _shard(k, start: int = 0, end: int = 64, **spec) -> str:
    obj = base_shard(_unique(f"orders-{start}-{end}"), start, end)
    obj["spec"].update(spec)
    _create(k, obj)
    return obj["metadata"]["name"]


@pytest.mark.parametrize(
    "patch",
    [
        {"spec": {"keyGroups": {"end": 32}}},
        {"spec": {"keyGroups": {"start": 1}}},
        {"spec": {"keyGroups": {"start": 0, "end": 128}}},
    ],
    ids=["shrink", "move-start", "grow"],
)
def test_changing_a_shards_key_groups_is_rejected(k, patch):
    name = _shard(k)
    result = _patch(k, "taskshard", name, patch)
    assert result.returncode != 0
    assert "spec.keyGroups" in result.stderr and "immutable" in result.stderr, result.stderr
    stored = json.loads(k("get", "taskshard", name, "-o", "json").stdout)
    assert stored["spec"]["keyGroups"] == {"start": 0, "end": 64}


def test_changing_task_ref_or_restore_from_is_rejected(k):
    name = _shard(k)
    result = _patch(k, "taskshard", name, {"spec": {"taskRef": {"name": "other"}}})
    assert result.returncode != 0 and "spec.taskRef" in result.stderr, result.stderr
    restore = {"parent": "orders-0-128", "manifest": "/data/state/m.json"}
    result = _patch(k, "taskshard", name, {"spec": {"restoreFrom": restore}})
    assert result.returncode != 0 and "spec.restoreFrom" in result.stderr, result.stderr
    child = _shard(k, 64, 128, restoreFrom=restore)
    result = _patch(k, "taskshard", child, {"spec": {"restoreFrom": {"manifest": "/data/other.json"}}})
    assert result.returncode != 0 and "spec.restoreFrom" in result.stderr, result.stderr


def test_valid_split_requests_are_accepted(k):
    name = _shard(k)
    assert _patch(k, "taskshard", name, {"spec": {"split": {"requested": True}}}).returncode == 0
    stored = json.loads(k("get", "taskshard", name, "-o", "json").stdout)
    assert stored["spec"]["split"] == {"requested": True}
    assert TaskShard.from_k8s(stored).spec.split.requested
    explicit = _shard(k)
    assert _patch(k, "taskshard", explicit, {"spec": {"split": {"requested": True, "at": 1}}}).returncode == 0
    edge = _shard(k)
    assert _patch(k, "taskshard", edge, {"spec": {"split": {"requested": True, "at": 63}}}).returncode == 0


@pytest.mark.parametrize(
    ("start", "end", "split", "field"),
    [
        (5, 6, {"requested": True}, "spec.split.requested"),
        (5, 6, {"requested": True, "at": 5}, "spec.split.at"),
        (0, 64, {"requested": True, "at": 64}, "spec.split.at"),
        (0, 64, {"requested": True, "at": 0}, "spec.split.at"),
        (16, 32, {"requested": True, "at": 40}, "spec.split.at"),
    ],
    ids=["one-group", "one-group-explicit", "at-end", "at-start", "outside"],
)
def test_invalid_split_requests_are_rejected(k, start, end, split, field):
    name = _shard(k, start, end)
    result = _patch(k, "taskshard", name, {"spec": {"split": split}})
    assert result.returncode != 0 and field in result.stderr, result.stderr
    stored = json.loads(k("get", "taskshard", name, "-o", "json").stdout)
    assert "split" not in stored["spec"]


EDITOR = textwrap.dedent("""
    import json, os, sys, yaml
    path = sys.argv[-1]
    text = open(path).read()
    with open(os.environ["EDIT_LOG"], "a") as log:  # kubectl puts the apiserver's errors in comments
        log.write("".join(line + "\\n" for line in text.splitlines() if line.startswith("#")))
    doc = yaml.safe_load(text)
    doc["spec"]["split"] = json.loads(os.environ["SPLIT"])
    open(path, "w").write(yaml.safe_dump(doc))
""")


def _kubectl_edit(crds, namespace: str, name: str, split: dict, tmp_path) -> tuple[subprocess.CompletedProcess, str]:
    """Run a real ``kubectl edit`` whose editor sets spec.split (what a user does by hand).

    Returns kubectl's result and the comment lines the editor saw (on a rejected edit kubectl reopens the
    editor with the apiserver's error message in comments; the same edit again makes it give up).
    """
    editor, log = tmp_path / "editor.py", tmp_path / f"edit-{name}.log"
    editor.write_text(EDITOR)
    log.write_text("")
    env = crds.env() if callable(crds.env) else dict(crds.env)
    env.update(
        KUBE_EDITOR=f"{sys.executable} {editor}",
        SPLIT=json.dumps(split),
        EDIT_LOG=str(log),
        KUBECONFIG=str(crds.kubeconfig),
        TMPDIR=str(tmp_path),  # kubectl keeps a copy of a rejected edit in its temp dir
    )
    cmd = [crds.binaries.kubectl, "--namespace", namespace, "edit", "taskshard", name]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    return result, log.read_text()


def test_kubectl_edit_split_request(k, crds, crd_namespace, tmp_path):
    name = _shard(k, 0, 64)
    result, _ = _kubectl_edit(crds, crd_namespace, name, {"requested": True, "at": 16}, tmp_path)
    assert result.returncode == 0, result.stderr
    stored = json.loads(k("get", "taskshard", name, "-o", "json").stdout)
    assert stored["spec"]["split"] == {"requested": True, "at": 16}
    one = _shard(k, 7, 8)
    result, comments = _kubectl_edit(crds, crd_namespace, one, {"requested": True}, tmp_path)
    assert result.returncode != 0 and "is invalid" in result.stderr
    assert "spec.split.requested" in comments and "cannot be split" in comments, comments
    assert "split" not in json.loads(k("get", "taskshard", one, "-o", "json").stdout)["spec"]


def test_status_subresource_and_printer_columns(k):
    name = _shard(k, 0, 64)
    k("label", "taskshard", name, "taskshard.io/key-groups=0-64", "--overwrite")
    status = {
        "status": {
            "phase": "Running",
            "observedGeneration": 1,
            "lastCheckpoint": {"batchId": 7, "time": "2026-11-22T03:04:05Z"},
            "live": {
                "batchId": 7,
                "rate": 812.5,
                "lag": 2310,
                "lagUnit": "bytes",
                "observedAt": "2026-11-22T03:04:06Z",
            },  # noqa: E501
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "BatchesCommitting",
                    "lastTransitionTime": "2026-11-22T03:04:05Z",
                }
            ],
        }
    }
    k("patch", "taskshard", name, "--subresource=status", "--type", "merge", "-p", json.dumps(status))
    stored = json.loads(k("get", "taskshard", name, "-o", "json").stdout)
    parsed = TaskShard.from_k8s(stored)
    assert parsed.status.phase == "Running" and parsed.status.last_checkpoint.batch_id == 7
    # A spec update cannot write status (status subresource).
    _patch(k, "taskshard", name, {"status": {"phase": "Split"}}, check=True)
    assert json.loads(k("get", "taskshard", name, "-o", "json").stdout)["status"]["phase"] == "Running"
    header, row = k("get", "tss", name).stdout.strip().split("\n")
    assert header.split() == ["NAME", "TASK", "RANGE", "PHASE", "READY", "RATE", "LAG", "LAST", "BATCH", "AGE"]
    assert row.split()[1:8] == ["orders-count", "0-64", "Running", "True", "812.5", "2310", "7"]
    assert parsed.status.live is not None and parsed.status.live.lag_unit == "bytes"


@pytest.mark.parametrize(
    ("status", "field"),
    [
        ({"phase": "Exploded"}, "status.phase"),
        ({"split": {"at": 64}}, "status.split.at"),
        ({"lineage": {"parent": "someone-else"}}, "status.lineage.parent"),
        ({"lineage": {"children": ["a", "b", "c"]}}, "status.lineage.children"),
    ],
    ids=["unknown-phase", "split-outside", "lineage-parent-mismatch", "three-children"],
)
def test_bad_status_writes_are_rejected(k, status, field):
    restore = {"parent": "orders-count-0-128", "manifest": "/data/state/m.json"}
    name = _shard(k, 0, 64, restoreFrom=restore)
    patch = json.dumps({"status": status})
    result = k("patch", "taskshard", name, "--subresource=status", "--type", "merge", "-p", patch, check=False)
    assert result.returncode != 0 and field in result.stderr, result.stderr
