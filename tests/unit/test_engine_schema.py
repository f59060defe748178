"""State schemas: parsing with defaults, the evolution rules, and conforming old rows to a new schema."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_runtime.engine.schema import SchemaError, SchemaIncompatible, StateSchema, parse_columns

pytestmark = pytest.mark.unit


def test_parse_with_defaults_round_trips():
    schema = StateSchema.parse(
        "count bigint, label string default 'a, b', ratio double default 0, ok boolean default null"
    )
    assert schema.names == ["count", "label", "ratio", "ok"]
    assert [c.default for c in schema.columns[1:]] == ["a, b", 0.0, None]
    assert StateSchema.parse(schema.ddl()) == schema
    assert StateSchema.from_json(schema.to_json()) == schema


@pytest.mark.parametrize(
    "text, needle",
    [
        ("count", "is not 'name type'"),
        ("count varchar", "has type 'varchar'"),
        ("key string", "reserved"),
        ("_expires bigint", "reserved"),
        ("n bigint, n int", "duplicate"),
        ("n bigint default 'x'", "is not a bigint"),
        ("n int default 3000000000", "is not a int"),
        ("s string default nope", "is not a literal"),
        ("", "at least one column"),
    ],
)
def test_bad_declarations_name_the_part(text, needle):
    with pytest.raises(SchemaError, match=needle):
        StateSchema.parse(text)


def test_allowed_evolutions_keep_state():
    old = StateSchema.parse("count int, last string, gone double")
    new = StateSchema.parse("count bigint, last string, label string default 'none'")
    evolved = new.evolve(old)
    assert evolved.retired == {"gone"}
    # rows written under the old schema read as the new one
    rows = pa.table({"key": ["a"], "count": pa.array([3], pa.int32()), "last": ["x"], "gone": [1.5]})
    target = pa.schema([("key", pa.string()), ("count", pa.int64()), ("last", pa.string()), ("label", pa.string())])
    out = evolved.conform(rows, target)
    assert out.to_pylist() == [{"key": "a", "count": 3, "last": "x", "label": "none"}]


@pytest.mark.parametrize(
    "old, new, column, needle",
    [
        ("n bigint", "n int", "n", "changes type from bigint to int"),
        ("n bigint", "n string", "n", "changes type"),
        ("n bigint", "n bigint, m bigint", "m", "has no default"),
        ("d double", "d float", "d", "changes type"),
    ],
)
def test_incompatible_changes_are_refused_naming_the_column(old, new, column, needle):
    with pytest.raises(SchemaIncompatible, match=needle) as err:
        StateSchema.parse(new).evolve(StateSchema.parse(old))
    assert err.value.column == column


def test_a_dropped_name_stays_retired():
    v1 = StateSchema.parse("n bigint, tag string")
    v2 = StateSchema.parse("n bigint").evolve(v1)
    with pytest.raises(SchemaIncompatible, match="dropped earlier") as err:
        StateSchema.parse("n bigint, tag string default ''").evolve(v2)
    assert err.value.column == "tag"


def test_result_columns_take_no_defaults():
    assert [c.name for c in parse_columns("a bigint, b string", defaults=False)] == ["a", "b"]
    with pytest.raises(SchemaError, match="may not have a default"):
        parse_columns("a bigint default 1", what="result_schema", defaults=False)
