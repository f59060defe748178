"""ShardConfig: the operator's shard.json shape validates; every bad field is named with its value."""

from __future__ import annotations

import copy
import json

import pytest

from spark_runtime.config import ConfigError, ShardConfig, load_config, parse_config, parse_trigger_interval

pytestmark = pytest.mark.unit


@pytest.fixture
def make_config():
    """Factory: a valid shard.json dict (as the operator builds it), with overrides applied by dotted path."""

    def make(**overrides):
        data = {
            "task": "orders",
            "shard": "orders-0-64",
            "namespace": "default",
            "maxKeyGroups": 128,
            "keyGroups": {"start": 0, "end": 64},
            "keyField": "key",
            "processor": {"builtin": "count"},
            "source": {"journal": {"path": "/data/journal/orders", "partitions": 4}},
            "sink": {"directory": {"path": "/data/output/orders", "format": "jsonl"}},
            "storage": {"path": "/data/state"},
            "restoreFrom": None,
            "spark": {
                "master": "local[*]",
                "conf": {"spark.sql.shuffle.partitions": "4"},
                "triggerInterval": "1 second",
            },
            "terminationMessagePath": "/dev/termination-log",
        }
        for dotted, value in overrides.items():
            node = data
            parts = dotted.split("__")
            for part in parts[:-1]:
                node = node[part]
            if value is _DELETE:
                node.pop(parts[-1], None)
            else:
                node[parts[-1]] = value
        return data

    return make


_DELETE = object()


def problems_of(data) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value.problems


def test_operator_shape_is_valid(make_config):
    cfg = parse_config(make_config())
    assert cfg.range.start == 0 and cfg.range.end == 64
    assert cfg.trigger_ms == 1000
    assert cfg.processor.builtin == "count"
    assert cfg.restore_from is None
    # Round trip: the camelCase JSON form validates to the same config.
    assert parse_config(cfg.to_json_dict()) == cfg


def test_defaults(make_config):
    data = make_config(spark=_DELETE, terminationMessagePath=_DELETE, keyField=_DELETE)
    cfg = parse_config(data)
    assert cfg.spark.master == "local[2]"
    assert cfg.spark.trigger_interval == "1 second"
    assert cfg.termination_message_path == "/dev/termination-log"
    assert cfg.key_field == "key"


def test_drain_request_file_is_gone(make_config):
    """A split's drain is no longer requested through a file (parent and children hand over through storage):
    the field is unknown, hence rejected like any other."""
    assert not hasattr(parse_config(make_config()), "drain_request_file")
    problems = problems_of(make_config(drainRequestFile="/etc/taskshard-drain/requested"))
    assert any(p.startswith("drainRequestFile: unknown field") for p in problems), problems


def test_task_spec_sub_objects_are_accepted_verbatim(make_config):
    cfg = parse_config(
        make_config(
            processor={"python": "my_pkg.mod:Proc", "parameters": {"gap": 30, "emit": ["a"]}},
            storage={"path": "/data/state", "volume": {"hostPath": "/srv/x", "mountPath": "/data"}},
            restoreFrom={"parent": "orders-0-128", "manifest": "/data/state/orders/shards/x/manifest.json"},
        )
    )
    assert cfg.processor.parameters == {"gap": 30, "emit": ["a"]}
    assert cfg.restore_from.parent == "orders-0-128"
    kafka = make_config(source={"kafka": {"bootstrapServers": "k:9092", "topic": "t", "startingOffsets": "latest"}})
    assert parse_config(kafka).source.kafka.topic == "t"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"keyGroups": {"start": 10, "end": 200}}, "keyGroups.end: 200 must be <= maxKeyGroups (128)"),
        ({"keyGroups": {"start": 9, "end": 9}}, "keyGroups: "),
        ({"keyGroups__start": -1}, "keyGroups.start: -1 is invalid"),
        ({"maxKeyGroups": 0}, "maxKeyGroups: 0 is invalid"),
        ({"maxKeyGroups": 40000}, "maxKeyGroups: 40000 is invalid"),
        ({"processor": {"builtin": "avg"}}, 'processor.builtin: "avg" is invalid'),
        ({"processor": {"builtin": "sum"}}, "processor: "),
        ({"processor": {"builtin": "count", "field": "x"}}, "only valid with builtin: sum"),
        ({"processor": {"builtin": "count", "python": "a.b:C"}}, "exactly one of builtin"),
        ({"processor": {"python": "not a ref"}}, 'processor.python: "not a ref" is invalid'),
        ({"source": {}}, "source: "),
        ({"source__journal__partitions": 0}, "source.journal.partitions: 0 is invalid"),
        ({"sink__directory__format": "csv"}, 'sink.directory.format: "csv" is invalid'),
        ({"storage": {"path": "/a", "s3": {"bucket": "bkt"}}}, "exactly one of path or s3"),
        ({"spark__triggerInterval": "fast"}, 'spark.triggerInterval: "fast" is invalid'),
        ({"spark__conf": {"sql.shuffle.partitions": "4"}}, "must start with 'spark.'"),
        ({"task": "Bad_Name"}, 'task: "Bad_Name" is invalid'),
        ({"surprise": 1}, "surprise: unknown field"),
        ({"task": _DELETE}, "task: required field is missing"),
    ],
)
def test_errors_name_field_and_value(make_config, overrides, expected):
    problems = problems_of(make_config(**overrides))
    assert any(expected in p for p in problems), problems


def test_every_problem_is_reported_at_once(make_config):
    problems = problems_of(make_config(maxKeyGroups=0, processor={"builtin": "avg"}, surprise=True))
    assert len(problems) == 3, problems


def test_conf_values_are_strings(make_config):
    cfg = parse_config(make_config(spark__conf={"spark.sql.shuffle.partitions": 4, "spark.ui.enabled": False}))
    assert cfg.spark.conf == {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}


@pytest.mark.parametrize(
    ("text", "ms"), [("500 milliseconds", 500), ("1 second", 1000), ("2 seconds", 2000), ("3 minutes", 180000)]
)
def test_trigger_interval(text, ms):
    assert parse_trigger_interval(text) == ms


def test_load_json_yaml_and_env(tmp_path, make_config):
    data = make_config()
    jpath = tmp_path / "shard.json"
    jpath.write_text(json.dumps(data))
    assert load_config(jpath).shard == "orders-0-64"
    import yaml

    ypath = tmp_path / "shard.yaml"
    ypath.write_text(yaml.safe_dump(data))
    assert load_config(ypath) == load_config(jpath)
    assert load_config(env={"TASKSHARD_CONFIG": str(ypath)}).task == "orders"
    assert load_config(env={"TASKSHARD_CONFIG_JSON": json.dumps(data)}).task == "orders"


def test_load_errors_name_the_file(tmp_path, make_config):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(bad)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps(make_config(maxKeyGroups=0)))
    with pytest.raises(ConfigError) as info:
        load_config(wrong)
    assert str(wrong) in str(info.value) and "maxKeyGroups: 0" in str(info.value)
    with pytest.raises(ConfigError, match="no config given"):
        load_config(env={})


def test_config_module_does_not_import_pyspark():
    import subprocess
    import sys

    code = "import sys, spark_runtime.config; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_frozen(make_config):
    cfg = parse_config(make_config())
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises its ValidationError for frozen models
        cfg.task = "x"  # type: ignore[misc]
    assert isinstance(copy.deepcopy(cfg), ShardConfig)


def test_partitioned_by_key_maps_a_range_to_its_partitions(make_config):
    cfg = parse_config(make_config(source__journal__partitionedByKey=True))
    assert cfg.key_grouping.nested and cfg.key_grouping.partitions == 4
    assert cfg.partitions_to_read == [0, 1], "[0, 64) over 4 blocks of 32"
    kafka = {"bootstrapServers": "b:9092", "topic": "t", "partitionedByKey": True, "partitions": 8}
    cfg = parse_config(make_config(source={"kafka": kafka}, keyGroups={"start": 40, "end": 50}))
    assert cfg.partitions_to_read == [2, 3]
    assert parse_config(make_config()).partitions_to_read is None, "not nested: every partition"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            {"journal": {"path": "/j", "partitions": 3, "partitionedByKey": True}},
            "source.journal.partitionedByKey: maxKeyGroups: 128 is not a multiple of the source's 3 partitions",
        ),
        (
            {"kafka": {"bootstrapServers": "b:9092", "topic": "t", "partitionedByKey": True}},
            "source.kafka.partitions is required with partitionedByKey: true",
        ),
        (
            {"kafka": {"bootstrapServers": "b:9092", "topic": "t", "partitions": 4}},
            "source.kafka.partitions (4) is only used with partitionedByKey: true",
        ),
        (
            {"kafka": {"bootstrapServers": "b:9092", "topic": "t", "partitionedByKey": True, "partitions": 5}},
            "e.g. 125 or 130",
        ),
    ],
)
def test_partitioned_by_key_needs_a_consistent_partition_count(make_config, source, expected):
    problems = problems_of(make_config(source=source))
    assert any(expected in p for p in problems), problems
