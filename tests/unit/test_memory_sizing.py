"""Memory sizing (taskshard_operator.memory): the heap and RocksDB's bound follow the pod's memory; state's pod
(driver in local mode, executors with executors) bounds RocksDB; a Task's own keys win; too little is refused."""

from __future__ import annotations

import pytest

from spark_runtime.keygroups import KeyGroupRange as R
from taskshard_operator import builders, memory
from taskshard_operator.models.task import TaskSpec

from .test_operator_builders import SPEC

pytestmark = pytest.mark.unit

BOUNDED, MAX_MB = memory.ROCKSDB_BOUNDED, memory.ROCKSDB_MAX_MB


def conf_of(**spark) -> dict[str, str]:
    s = TaskSpec.from_k8s({**SPEC, "spark": {**SPEC["spark"], **spark}})
    config = builders.build_shard_config(
        task="orders", namespace="ns", shard="orders-0-64", key_groups=R(0, 64), spec=s
    )
    return config["spark"]["conf"]


def test_local_mode_sizes_the_driver_heap_and_rocksdb_from_the_limit_else_the_request():
    conf = conf_of(resources={"limits": {"memory": "4Gi"}})
    assert (conf["spark.driver.memory"], conf[BOUNDED], conf[MAX_MB]) == ("2048m", "true", "1024")
    conf = conf_of(resources={"requests": {"memory": "3000Mi"}})
    assert (conf["spark.driver.memory"], conf[MAX_MB]) == ("1500m", "750")
    conf = conf_of(resources={"requests": {"memory": 2147483648}})  # plain bytes
    assert conf["spark.driver.memory"] == "1024m"
    conf = conf_of(resources=None)  # nothing given: Spark's defaults, no bound
    assert not {"spark.driver.memory", BOUNDED, MAX_MB} & set(conf)


def test_with_executors_rocksdb_follows_the_executors_where_the_state_lives():
    conf = conf_of(
        resources={"limits": {"memory": "2Gi"}},
        executors={"instances": 2, "resources": {"limits": {"memory": "6Gi"}}},
    )
    assert conf["spark.driver.memory"] == "1024m"
    assert (conf["spark.executor.memory"], conf["spark.executor.memoryOverhead"]) == ("3072m", "3072m")
    assert conf[MAX_MB] == "1536"
    conf = conf_of(resources={"limits": {"memory": "2Gi"}}, executors={"instances": 2})
    assert not {"spark.executor.memory", BOUNDED, MAX_MB} & set(conf)  # executors' memory unknown: no bound


def test_a_key_the_task_sets_wins_over_the_derived_one():
    conf = conf_of(
        resources={"limits": {"memory": "4Gi"}},
        conf={"spark.driver.memory": "3g", MAX_MB: "200", "spark.sql.shuffle.partitions": "4"},
    )
    assert (conf["spark.driver.memory"], conf[MAX_MB], conf[BOUNDED]) == ("3g", "200", "true")


@pytest.mark.parametrize(
    ("spark", "field"),
    [
        ({"resources": {"limits": {"memory": "512Mi"}}}, "spec.spark.resources: 512Mi: a shard pod"),
        ({"resources": {"requests": {"memory": "900Mi"}}}, "spec.spark.resources: 900Mi: a shard pod"),
        (
            {"executors": {"instances": 1, "resources": {"limits": {"memory": "768Mi"}}}},
            "spec.spark.executors.resources: 768Mi: a shard pod",
        ),
    ],
)
def test_too_little_memory_is_refused_naming_the_field_and_the_value(spark, field):
    with pytest.raises(ValueError, match=field):
        TaskSpec.from_k8s({**SPEC, "spark": {**SPEC["spark"], **spark}})
