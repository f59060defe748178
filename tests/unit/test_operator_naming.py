"""Naming: one module decides every name and label the operator writes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as s

from spark_runtime.keygroups import MAX_KEY_GROUPS_LIMIT, KeyGroupRange
from taskshard_operator import naming

pytestmark = pytest.mark.unit


def test_names_follow_the_contract():
    r = KeyGroupRange(0, 64)
    assert naming.shard_name("orders", r) == "orders-0-64"
    assert naming.pod_name("orders-0-64") == "orders-0-64-driver"
    assert naming.configmap_name("orders-0-64") == "orders-0-64-config"
    assert naming.driver_service_name("orders-0-64") == "orders-0-64-driver-svc"


def test_labels_and_selector():
    labels = naming.shard_labels("orders", "orders-32-64", KeyGroupRange(32, 64))
    assert labels == {
        "taskshard.io/task": "orders",
        "taskshard.io/shard": "orders-32-64",
        "taskshard.io/key-groups": "32-64",
        "taskshard.io/component": "shard",
    }
    assert naming.shard_selector("orders") == "taskshard.io/task=orders,taskshard.io/component=shard"


def test_every_key_is_domain_prefixed():
    keys = [
        naming.LABEL_TASK,
        naming.LABEL_SHARD,
        naming.LABEL_KEY_GROUPS,
        naming.LABEL_COMPONENT,
        naming.ANNOTATION_DRAIN,
        naming.ANNOTATION_TEMPLATE_HASH,
        naming.ANNOTATION_RESTARTS_BASE,
        naming.FINALIZER,
    ]
    assert all(k.startswith("taskshard.io/") for k in keys)
    assert naming.PROGRESS_PREFIX == "taskshard.io"


@given(
    s.integers(0, MAX_KEY_GROUPS_LIMIT - 1).flatmap(
        lambda a: s.tuples(s.just(a), s.integers(a + 1, MAX_KEY_GROUPS_LIMIT))
    )
)
def test_shard_names_are_unique_per_range_and_parse_back(bounds):
    r = KeyGroupRange(*bounds)
    name = naming.shard_name("orders", r)
    assert KeyGroupRange.from_label(name.removeprefix("orders-")) == r


def test_cli_help_runs_without_a_cluster():
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    out = subprocess.run([sys.executable, "-m", "taskshard_operator", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--standalone" in out.stdout and "--all-namespaces" in out.stdout
