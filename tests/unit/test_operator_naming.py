"""Naming: one module decides every name and label the operator writes."""

from __future__ import annotations

import re

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


LONGEST_TASK = "t" + "x" * 61 + "9"  # 63 characters: the longest valid Task name
DNS_LABEL = re.compile(naming.TASK_NAME_PATTERN)


@pytest.mark.parametrize("task", [LONGEST_TASK, "a" * 30 + "-" + "b" * 32, "orders"])
@pytest.mark.parametrize(
    "r", [KeyGroupRange(0, 1), KeyGroupRange(0, MAX_KEY_GROUPS_LIMIT), KeyGroupRange(32766, 32767)], ids=str
)
def test_every_derived_name_fits_kubernetes_limits(task, r):
    """For any valid Task name, the shard name (an executor pod prefix: 47), the pod, ConfigMap and Service names
    and every label value fit; the name keeps the range readable at its end."""
    shard = naming.shard_name(task, r)
    assert len(shard) <= naming.SHARD_NAME_LIMIT and DNS_LABEL.match(shard), shard
    assert shard.endswith(f"-{r.label()}")
    assert len(naming.driver_service_name(shard)) <= 63 and DNS_LABEL.match(naming.driver_service_name(shard))
    assert len(naming.pod_name(shard)) <= 63 and len(naming.configmap_name(shard)) <= 253
    assert all(len(v) <= 63 for v in naming.shard_labels(task, shard, r).values())


def test_long_task_names_stay_unique_and_deterministic():
    ranges = [KeyGroupRange(a, a + 1) for a in range(0, 512)] + [KeyGroupRange(0, 512), KeyGroupRange(0, 256)]
    names = [naming.shard_name(LONGEST_TASK, r) for r in ranges]
    assert len(set(names)) == len(names)
    assert names == [naming.shard_name(LONGEST_TASK, r) for r in ranges]
    other = "t" + "x" * 61 + "8"  # same prefix, another task: other digests
    assert naming.shard_name(other, KeyGroupRange(0, 1)) != naming.shard_name(LONGEST_TASK, KeyGroupRange(0, 1))
