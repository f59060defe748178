"""Reserved ``spec.spark.conf`` keys: one table (``spark_runtime.reserved_conf``), three checks that must agree
(the CRD's CEL rules, the Task model, the runtime's config), and a table that covers what the code really sets."""

from __future__ import annotations

import re

import pytest
import yaml
from pydantic import ValidationError

from spark_runtime.config import ConfigError, parse_config
from spark_runtime.keygroups import KeyGroupRange
from spark_runtime.reserved_conf import (
    RESERVED_SPARK_CONF,
    RESERVED_SPARK_CONF_PATTERNS,
    Owner,
    reserved_by,
    reserved_conf_message,
)
from spark_runtime.session import DEFAULT_CONF
from spark_runtime.storage import S3Settings
from taskshard_operator import builders
from taskshard_operator.models.task import TaskSpec

from .manifest_cases import CRDS_DIR, base_task

pytestmark = pytest.mark.unit

RULE = re.compile(r"^!\('([^']+)' in self\)$")
RUNTIME_KEYS = sorted(k for k, r in RESERVED_SPARK_CONF.items() if r.owner is Owner.RUNTIME)
OPERATOR_KEYS = sorted(k for k, r in RESERVED_SPARK_CONF.items() if r.owner is Owner.OPERATOR)


def _conf_rules_on_disk() -> list[dict]:
    """The CEL rules on ``spec.spark.conf`` of the Task CRD as written in crds/ (what the apiserver gets)."""
    crd = yaml.safe_load((CRDS_DIR / "taskshard.io_tasks.yaml").read_text(encoding="utf-8"))
    (version,) = crd["spec"]["versions"]
    conf = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["spark"]["properties"]["conf"]
    return conf["x-kubernetes-validations"]


def _spec(conf: dict[str, str], **spark) -> dict:
    spec = base_task()["spec"]
    spec["spark"] = {**spec["spark"], **spark, "conf": conf}
    return spec


# ---------------------------------------------------------------- the CRD


def test_crd_has_one_forbidding_rule_per_reserved_key_naming_it_and_why():
    rules = {}
    for rule in _conf_rules_on_disk():
        m = RULE.match(rule["rule"])
        if m:
            rules[m.group(1)] = rule
    assert sorted(rules) == sorted(RESERVED_SPARK_CONF), "run python hack/gen_crds.py"
    for key, rule in rules.items():
        assert rule["message"] == reserved_conf_message(key)
        assert rule["message"].startswith(f'spec.spark.conf["{key}"] is reserved: ')
        assert rule["reason"] == "FieldValueForbidden"
    # The other rules on the map: one per reserved pattern, the prefix rule and the web UI's; nothing else.
    patterns = [r for r in _conf_rules_on_disk() if "k.matches(r'" in r["rule"]]
    assert len(patterns) == len(RESERVED_SPARK_CONF_PATTERNS)
    for rule, (pattern, reserved) in zip(patterns, RESERVED_SPARK_CONF_PATTERNS.items(), strict=True):
        assert (
            pattern in rule["rule"]
            and reserved.why in rule["message"]
            and "+ self.filter(" in rule["messageExpression"]
        )
    assert len(_conf_rules_on_disk()) == len(rules) + len(patterns) + 2, "and the prefix and web UI rules"


@pytest.mark.parametrize(
    "key, reserved",
    [
        ("spark.hadoop.fs.s3a.bucket.other-bucket.endpoint", True),
        ("spark.hadoop.fs.s3a.bucket.b.secret.key", True),
        ("spark.hadoop.fs.s3a.session.token", True),
        ("spark.hadoop.fs.s3a.assumed.role.arn", True),
        ("spark.redaction.regex", True),
        ("spark.sql.streaming.checkpointFileManagerClass", True),
        ("spark.sql.streaming.minBatchesToRetain", True),
        ("spark.speculation", True),
        ("spark.speculation.multiplier", True),
        ("spark.hadoop.fs.s3a.bucket.b.connection.timeout", False),
        ("spark.hadoop.fs.s3a.connection.timeout", False),
        ("spark.sql.shuffle.partitions", False),
    ],
)
def test_families_of_keys_are_reserved_by_pattern_naming_the_key(key, reserved):
    spec = _spec({key: "x"})
    if not reserved:
        TaskSpec.from_k8s(spec)
        return
    with pytest.raises(ValidationError, match=re.escape(f'spec.spark.conf["{key}"]')):
        TaskSpec.from_k8s(spec)


def test_reserved_keys_are_safe_in_a_cel_string_literal():
    assert all(key.startswith("spark.") and "'" not in key and "\\" not in key for key in RESERVED_SPARK_CONF)
    assert all(r.why for r in RESERVED_SPARK_CONF.values())


# ---------------------------------------------------------------- the Task model


@pytest.mark.parametrize("key", sorted(RESERVED_SPARK_CONF))
def test_task_model_refuses_each_reserved_key_naming_it_and_the_value(key):
    with pytest.raises(ValidationError) as info:
        TaskSpec.from_k8s(_spec({"spark.sql.shuffle.partitions": "2", key: "v1"}))
    message = str(info.value)
    expected = reserved_conf_message(key, value="v1")
    assert expected in message
    assert f'spec.spark.conf["{key}"]: ' in message and RESERVED_SPARK_CONF[key].why in message
    if RESERVED_SPARK_CONF[key].secret:
        assert '"<redacted>"' in expected and "v1" not in expected
    else:
        assert '"v1"' in expected


def test_task_model_lists_every_reserved_key_and_accepts_tuning_keys():
    with pytest.raises(ValidationError) as info:
        TaskSpec.from_k8s(_spec({"spark.master": "local[8]", "spark.kubernetes.namespace": "other"}))
    assert 'spec.spark.conf["spark.master"]: "local[8]"' in str(info.value)
    assert 'spec.spark.conf["spark.kubernetes.namespace"]: "other"' in str(info.value)
    tuning = {
        "spark.sql.shuffle.partitions": "8",  # state is exported per key group: any partition count restores
        "spark.hadoop.fs.s3a.connection.timeout": "60s",
        "spark.driver.extraJavaOptions": "-Xss32m",
        "spark.kubernetes.executor.deleteOnTermination": "false",
        "spark.taskshard.partitionBytes": "1048576",
    }
    assert TaskSpec.from_k8s(_spec(tuning)).spark.conf == tuning


# ---------------------------------------------------------------- the table covers what the code sets


def test_the_runtimes_protocol_keys_are_reserved_for_the_runtime():
    state_store = {k for k in DEFAULT_CONF if k.startswith("spark.sql.streaming.stateStore.")}
    assert state_store == {
        "spark.sql.streaming.stateStore.providerClass",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
    }
    everything = S3Settings(endpoint="https://s3.example", region="eu-west-1", access_key="a", secret_key="s")
    from_storage = set(everything.hadoop_conf()) - {  # the runtime's fail-fast defaults stay tunable
        "spark.hadoop.fs.s3a.attempts.maximum",
        "spark.hadoop.fs.s3a.retry.limit",
        "spark.hadoop.fs.s3a.connection.establish.timeout",
        "spark.hadoop.fs.s3a.connection.timeout",
    }
    import tempfile
    from pathlib import Path

    from spark_runtime.kubernetes import POD_IP_ENV, driver_conf

    with tempfile.TemporaryDirectory() as sa:  # a pod with a mounted service-account token
        for name in ("token", "ca.crt"):
            (Path(sa) / name).write_text("x")
        env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443", POD_IP_ENV: "10.1.0.2"}
        in_pod = set(driver_conf("k8s://https://kubernetes.default.svc:443", env, sa_dir=sa)[1])
    # The s3a keys are refused though the runtime never sets them: credentials stay in the environment.
    keys = {"spark.hadoop.fs.s3a.access.key", "spark.hadoop.fs.s3a.secret.key"}
    assert not keys & from_storage
    assert state_store | from_storage | in_pod | {"spark.master"} | keys == set(RUNTIME_KEYS)
    assert "spark.sql.shuffle.partitions" not in RESERVED_SPARK_CONF


def test_every_key_of_build_executor_conf_is_reserved_for_the_operator():
    executors = {"instances": 2, "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2", "memory": "1Gi"}}}
    spec = TaskSpec.from_k8s(_spec({}, executors=executors, imagePullPolicy="Always"))
    conf = builders.build_executor_conf(task="orders", namespace="ns1", shard="orders-0-64", spec=spec)
    by_pattern = {k for k in conf if k not in RESERVED_SPARK_CONF}
    assert by_pattern == {
        "spark.authenticate",
        "spark.authenticate.secret.file",
        "spark.network.crypto.enabled",
        "spark.network.crypto.saslFallback",
        "spark.network.crypto.authEngineVersion",
    }
    assert all(reserved_by(k)[1].owner is Owner.OPERATOR for k in by_pattern)
    assert set(conf) - by_pattern == set(OPERATOR_KEYS)

    shard_conf = builders.build_shard_config(
        task="orders", namespace="ns1", shard="orders-0-64", key_groups=KeyGroupRange(0, 64), spec=spec
    )["spark"]["conf"]
    assert set(OPERATOR_KEYS) <= set(shard_conf)


# ---------------------------------------------------------------- the runtime's config


def _shard_config(conf: dict[str, str]) -> dict:
    spec = TaskSpec.from_k8s(_spec({}))
    config = builders.build_shard_config(
        task="orders", namespace="ns1", shard="orders-0-64", key_groups=KeyGroupRange(0, 64), spec=spec
    )
    config["spark"]["conf"] = conf
    return config


def test_runtime_config_refuses_runtime_keys_naming_each():
    with pytest.raises(ConfigError) as info:
        parse_config(_shard_config({"spark.master": "local[8]", "spark.hadoop.fs.s3a.secret.key": "s3cr3t"}))
    assert info.value.problems == [
        reserved_conf_message("spark.master", path="spark.conf", value="local[8]"),
        'spark.conf["spark.hadoop.fs.s3a.secret.key"]: "<redacted>" is reserved: '
        + RESERVED_SPARK_CONF["spark.hadoop.fs.s3a.secret.key"].why
        + "; remove the key",
    ]
    assert "s3cr3t" not in str(info.value)


def test_runtime_config_accepts_the_keys_the_operator_writes():
    parse_config(_shard_config(dict.fromkeys(OPERATOR_KEYS, "x")))
