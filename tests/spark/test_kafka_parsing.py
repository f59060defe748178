"""The Kafka source's native parsing (Spark VARIANT functions) against the journal's exact Python parser: the
same record contract, line by line (validity, key text, typed field values), and the dead letters a shard owns.

No broker needed: the parser works on any DataFrame shaped like the Kafka connector's (``key``, ``value``
binary, ``partition``, ``offset``); tests/integration runs it against a real broker."""

from __future__ import annotations

import json

import pytest

from spark_runtime.keygroups import key_group
from spark_runtime.records import MAX_KEY_BYTES, MAX_RECORD_BYTES, RecordSpec, dead_letter_key_group, parse_lines

LINES = [
    '{"key":"a","amount":1,"flag":true,"note":"x","meta":{"z":[1,2]}}',
    '{"key":7,"amount":2.5,"flag":false,"meta":null}',
    '{"key":-3,"amount":1e3,"flag":true}',
    '{"key":99999999999999999999,"amount":1,"flag":true}',
    '{"key":"ü-ключ-😀","amount":-4,"flag":true,"note":null}',
    '{"key":7.5,"amount":1,"flag":true}',
    '{"key":true,"amount":1,"flag":true}',
    '{"key":null,"amount":1,"flag":true}',
    '{"key":{"a":1},"amount":1,"flag":true}',
    '{"amount":1,"flag":true}',
    '{"key":"b","amount":"12","flag":true}',
    '{"key":"b","flag":true}',
    '{"key":"b","amount":1,"flag":"yes"}',
    '{"key":"b","amount":1,"flag":true,"note":5}',
    '{"key":"b","amount":1,"flag":true,"count":9223372036854775808}',
    '{"key":"b","amount":1,"flag":true,"count":-9223372036854775808}',
    "not json",
    "[1,2,3]",
    "42",
    '{"key":"c","amount":NaN,"flag":true}',
    '{"key":"","amount":0,"flag":false}',
    '{"key":"d","amount":1,"flag":true,"count":12}',
    '{"key":"' + "k" * (MAX_KEY_BYTES + 1) + '","amount":1,"flag":true}',  # too_large: owned by its key's group
    '{"key":"e","amount":1,"flag":true,"note":"' + "x" * MAX_RECORD_BYTES + '"}',  # too_large: no key
]
FIELDS = {"amount": "double", "flag": "boolean", "note": "string?", "meta": "json?", "count": "long?"}


@pytest.mark.parametrize("shard_range", [(0, 8), (8, 16)])
def test_native_kafka_parsing_matches_the_python_record_contract(shard_spark, shard_range):
    from pyspark.sql import functions as F

    from spark_runtime.sources.kafka import parse_kafka_records

    spec = RecordSpec.build("key", FIELDS)
    raw = shard_spark.createDataFrame(
        [(None, line.encode(), 0, i) for i, line in enumerate(LINES)],
        "key binary, value binary, partition int, offset bigint",
    )
    flagged, dead_owned = parse_kafka_records(raw, spec, 16, *shard_range)
    got = {r["offset"]: r for r in flagged.withColumn("_dead_owned", dead_owned).collect()}
    assert len(got) == len(LINES)

    expected_valid: dict[int, dict] = {}
    expected_dead: set[int] = set()
    for i, line in enumerate(LINES):
        parsed = parse_lines(line.encode() + b"\n", 0, spec)
        if parsed.keys:
            expected_valid[i] = {"key": parsed.keys[0], **{n: col[0] for n, col in parsed.columns.items()}}
        else:
            (dead,) = parsed.dead
            if shard_range[0] <= dead_letter_key_group(dead, 16) < shard_range[1]:
                expected_dead.add(i)
    assert {i for i, r in got.items() if r["_ok"]} == set(expected_valid), "validity differs from the contract"
    for i, want in expected_valid.items():
        row = got[i]
        assert row["key"] == want["key"] and row["partition"] == 0
        for name in ("amount", "flag", "note", "count"):
            assert row[name] == want[name], (LINES[i], name, row[name], want[name])
        if want["meta"] is not None:
            assert json.loads(row["meta"]) == json.loads(want["meta"])
        else:
            assert row["meta"] is None
    assert {i for i, r in got.items() if r["_dead_owned"]} == expected_dead
    # The native key group of a valid key is the Python twin's.
    kg = flagged.where("_ok").select("key", F.expr("pmod(hash(key), 16)").alias("kg")).collect()
    assert all(r["kg"] == key_group(r["key"], 16) for r in kg)
