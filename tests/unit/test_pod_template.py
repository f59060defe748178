"""spec.spark.podTemplate and spec.spark.volumeMounts: merged into every pod the operator builds (driver, executor
template, cleanup), the operator's own fields refused by name, pods still Pod Security "restricted"."""

from __future__ import annotations

import copy

import pytest

from spark_runtime.keygroups import KeyGroupRange as R
from taskshard_operator import builders
from taskshard_operator.models.pod import OWNED_POD_FIELDS
from taskshard_operator.models.task import TaskSpec

from .pod_security import restricted_violations
from .test_operator_builders import EXECUTORS, S3_STORAGE, SPEC, every_pod

pytestmark = pytest.mark.unit

TEMPLATE = {
    "metadata": {"labels": {"team": "payments"}, "annotations": {"example.com/owner": "ops"}},
    "spec": {
        "nodeSelector": {"pool": "streaming"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "streaming", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {}}
        ],
        "imagePullSecrets": [{"name": "registry"}],
        "priorityClassName": "streaming",
        "volumes": [{"name": "processors", "configMap": {"name": "my-processors"}}],
    },
}
MOUNTS = [{"name": "processors", "mountPath": "/opt/processors", "readOnly": True}]


def customised(template=TEMPLATE, mounts=MOUNTS, **extra) -> dict:
    data = copy.deepcopy(SPEC)
    data.update(extra)
    data["spark"] = {**data["spark"], "podTemplate": copy.deepcopy(template), "volumeMounts": copy.deepcopy(mounts)}
    return data


def test_the_template_lands_on_the_driver_the_executors_and_the_cleanup_pod():
    s = TaskSpec.from_k8s(customised(storage=S3_STORAGE, checkpointRetention="Delete"))
    s = TaskSpec.from_k8s({**s.to_k8s(), "spark": {**s.to_k8s()["spark"], "executors": EXECUTORS}})
    pods = every_pod(s)
    assert set(pods) == {"driver", "executor", "cleanup"}
    for name, pod in pods.items():
        assert restricted_violations(pod) == [], name
        assert pod["metadata"]["labels"]["team"] == "payments", name
        assert pod["metadata"]["annotations"]["example.com/owner"] == "ops", name
        for field in ("nodeSelector", "tolerations", "affinity", "topologySpreadConstraints", "imagePullSecrets"):
            assert pod["spec"][field] == TEMPLATE["spec"][field], (name, field)
        assert pod["spec"]["priorityClassName"] == "streaming"
        assert pod["spec"]["securityContext"] == builders.POD_SECURITY_CONTEXT, name  # still the operator's
    for name in ("driver", "executor"):
        pod = pods[name]
        assert {"name": "processors", "configMap": {"name": "my-processors"}} in pod["spec"]["volumes"], name
        (container,) = pod["spec"]["containers"]
        assert MOUNTS[0] in container["volumeMounts"], name
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"], name
    # The operator's labels and annotations stay: selectors and protocol marks are not the user's.
    assert pods["driver"]["metadata"]["labels"]["taskshard.io/shard"] == "orders-0-64"
    assert "taskshard.io/template-hash" in pods["driver"]["metadata"]["annotations"]
    assert [v["name"] for v in pods["cleanup"]["spec"]["volumes"]] == ["tmp"]  # the cleanup pod mounts no extras


def test_a_template_change_rolls_the_shards_and_none_keeps_the_hash():
    plain = TaskSpec.from_k8s(SPEC)
    assert "podTemplate" not in plain.to_k8s()["spark"]
    assert builders.template_hash(TaskSpec.from_k8s(customised())) != builders.template_hash(plain)
    pod = builders.build_pod(task="orders", shard="orders-0-64", key_groups=R(0, 64), spec=plain, template_hash="h")
    assert "nodeSelector" not in pod["spec"] and "imagePullSecrets" not in pod["spec"]


@pytest.mark.parametrize("field", sorted(OWNED_POD_FIELDS))
def test_a_field_the_operator_owns_is_refused_by_name(field):
    template = {"spec": {field: {"anything": 1}}}
    with pytest.raises(ValueError, match=f"spec.spark.podTemplate.spec.{field} is set by the operator"):
        TaskSpec.from_k8s(customised(template=template, mounts=None))


@pytest.mark.parametrize(
    ("template", "mounts", "message"),
    [
        ({"metadata": {"labels": {"taskshard.io/shard": "x"}}}, None,
         'spec.spark.podTemplate.metadata.labels\\["taskshard.io/shard"\\]: keys under taskshard.io/'),
        ({"metadata": {"annotations": {"taskshard.io/abort-split": "x"}}}, None,
         'spec.spark.podTemplate.metadata.annotations\\["taskshard.io/abort-split"\\]'),
        ({"spec": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}, None,
         'spec.spark.podTemplate.spec.volumes: the name "tmp" is the operator\'s'),
        ({"spec": {"volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]}}, None,
         '"a" is named twice'),
        (TEMPLATE, [{"name": "nope", "mountPath": "/x"}], 'spec.spark.volumeMounts: "nope": every mount names'),
        (TEMPLATE, [{"name": "processors", "mountPath": "/etc/taskshard"}],
         'spec.spark.volumeMounts: the path "/etc/taskshard" is the operator\'s'),
        (TEMPLATE, [{"name": "processors", "mountPath": "/data"}],
         'spec.spark.volumeMounts: "/data": the storage volume\'s mount path'),
    ],
)  # fmt: skip
def test_bad_customisation_names_the_field_and_the_value(template, mounts, message):
    with pytest.raises(ValueError, match=message):
        TaskSpec.from_k8s(customised(template=template, mounts=mounts))
