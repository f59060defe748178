"""The API reads behind the tests' ``get_json``: which ``kubectl get`` argument lists they serve, and the list
shape they return (what ``kubectl get -o json`` prints). The cluster tier reads through them against a real
apiserver on every poll."""

from __future__ import annotations

import pytest

from tests.kubeget import as_kubectl_list, rest_path

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("pods",), ("/api/v1/namespaces/ns/pods", [], None)),
        (("pod", "a-driver"), ("/api/v1/namespaces/ns/pods/a-driver", [], "a-driver")),
        (
            ("pods", "-l", "taskshard.io/component=shard"),
            ("/api/v1/namespaces/ns/pods", [("labelSelector", "taskshard.io/component=shard")], None),
        ),
        (
            ("taskshards", "-l", "a=b,c=d"),
            ("/apis/taskshard.io/v1alpha1/namespaces/ns/taskshards", [("labelSelector", "a=b,c=d")], None),
        ),
        (("task", "demo"), ("/apis/taskshard.io/v1alpha1/namespaces/ns/tasks/demo", [], "demo")),
        (
            ("events", "--field-selector", "involvedObject.name=x"),
            ("/api/v1/namespaces/ns/events", [("fieldSelector", "involvedObject.name=x")], None),
        ),
        (("pdb", "p"), ("/apis/policy/v1/namespaces/ns/poddisruptionbudgets/p", [], "p")),
        (
            ("replicasets", "-l", "app=x"),
            ("/apis/apps/v1/namespaces/ns/replicasets", [("labelSelector", "app=x")], None),
        ),
    ],
)
def test_supported_reads_map_to_the_api(args, expected):
    assert rest_path(args, "ns") == expected


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("deployments",),  # a kind it does not know
        ("pods", "-A"),  # a flag it does not know
        ("pods", "a", "b"),  # two names
        ("pod", "a", "-l", "x=y"),  # a name and a selector
        ("pods", "-l"),  # a flag without its value
    ],
)
def test_other_reads_are_left_to_kubectl(args):
    assert rest_path(args, "ns") is None


def test_a_list_reads_as_kubectl_prints_it():
    body = {"apiVersion": "taskshard.io/v1alpha1", "kind": "TaskShardList", "items": [{"metadata": {"name": "a"}}]}
    listed = as_kubectl_list(body)
    assert listed["kind"] == "List"
    assert listed["items"] == [{"apiVersion": "taskshard.io/v1alpha1", "kind": "TaskShard", "metadata": {"name": "a"}}]
