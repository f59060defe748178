"""The journal line parser: valid records become typed columns, bad ones dead letters with reason and offset."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_runtime.keygroups import key_group
from spark_runtime.records import FieldSpec, Reason, RecordSpec, dead_letter_key_group, parse_lines

pytestmark = pytest.mark.unit


def lines(*items) -> bytes:
    return b"".join((i if isinstance(i, bytes) else i.encode()) + b"\n" for i in items)


def test_valid_records_and_offsets():
    data = lines('{"key": "a", "amount": 2}', '{"key": 7, "amount": 1.5}', '{"key": "\u00e9t\u00e9", "amount": -3}')
    out = parse_lines(data, 100, RecordSpec.build("key", {"amount": "double"}))
    assert out.keys == ["a", "7", "\u00e9t\u00e9"]
    assert out.columns["amount"] == [2.0, 1.5, -3.0]
    first_len = len(b'{"key": "a", "amount": 2}') + 1
    second_len = len(b'{"key": 7, "amount": 1.5}') + 1
    assert out.offsets == [100, 100 + first_len, 100 + first_len + second_len]
    assert out.dead == []


@pytest.mark.parametrize(
    ("line", "reason", "has_key"),
    [
        ("{bad", Reason.MALFORMED_JSON, False),
        (b"\xff\xfe{}", Reason.MALFORMED_JSON, False),
        ('{"key": "a", "amount": NaN}', Reason.MALFORMED_JSON, False),
        ("[1, 2]", Reason.NOT_AN_OBJECT, False),
        ("42", Reason.NOT_AN_OBJECT, False),
        ('{"other": 1}', Reason.MISSING_KEY, False),
        ('{"key": null}', Reason.NULL_KEY, False),
        ('{"key": 1.5}', Reason.BAD_KEY_TYPE, False),
        ('{"key": true}', Reason.BAD_KEY_TYPE, False),
        ('{"key": {"a": 1}}', Reason.BAD_KEY_TYPE, False),
        ('{"key": "\\ud800"}', Reason.INVALID_KEY, False),
        ('{"key": "a"}', Reason.MISSING_FIELD, True),
        ('{"key": "a", "amount": null}', Reason.MISSING_FIELD, True),
        ('{"key": "a", "amount": "12"}', Reason.BAD_FIELD_TYPE, True),
        ('{"key": "a", "amount": true}', Reason.BAD_FIELD_TYPE, True),
    ],
)
def test_dead_letter_reasons(line, reason, has_key):
    data = lines('{"key": "ok", "amount": 1}', line, '{"key": "ok2", "amount": 2}')
    out = parse_lines(data, 0, RecordSpec.build("key", {"amount": "double"}))
    assert out.keys == ["ok", "ok2"], "valid records around a bad one are kept"
    assert len(out.dead) == 1
    dead = out.dead[0]
    assert dead.reason == reason
    assert dead.offset == len(b'{"key": "ok", "amount": 1}') + 1
    assert (dead.key is not None) == has_key
    assert dead.detail


def test_field_types_and_optional():
    spec = RecordSpec.build("id", {"n": "long", "s": "string", "b": "boolean", "j": "json", "o": "double?"})
    out = parse_lines(lines('{"id": "x", "n": 5, "s": "t", "b": false, "j": {"z": [1]}}'), 0, spec)
    assert out.keys == ["x"]
    assert out.columns == {"n": [5], "s": ["t"], "b": [False], "j": ['{"z":[1]}'], "o": [None]}
    bad = parse_lines(lines('{"id": "x", "n": 1.0, "s": "t", "b": false, "j": 1}'), 0, spec)
    assert bad.dead[0].reason == Reason.BAD_FIELD_TYPE and "'n'" in bad.dead[0].detail
    huge = parse_lines(lines('{"id": "x", "n": 99999999999999999999, "s": "t", "b": true, "j": 1}'), 0, spec)
    assert huge.dead[0].reason == Reason.BAD_FIELD_TYPE


def test_raw_value_and_blank_lines():
    out = parse_lines(lines('{"key": "a"}', "", "   ", '{"key": "b"}\r'), 0, RecordSpec.build("key", raw_value=True))
    assert out.keys == ["a", "b"]
    assert out.values == ['{"key": "a"}', '{"key": "b"}']


def test_dead_letter_owner_key_group():
    out = parse_lines(lines("{bad", '{"key": "k1", "amount": "x"}'), 0, RecordSpec.build("key", {"amount": "double"}))
    keyless, keyed = out.dead
    assert dead_letter_key_group(keyless, 128) == key_group(None, 128) == 42
    assert dead_letter_key_group(keyed, 128) == key_group("k1", 128)


def test_record_spec_json_round_trip_and_ddl():
    spec = RecordSpec.build("user", {"amount": "double", "note": "string?"}, raw_value=True)
    assert RecordSpec.from_json(spec.to_json()) == spec
    assert spec.ddl() == (
        "`key` string, `partition` int, `offset` bigint, `amount` double, `note` string, `value` string"
    )


def test_record_spec_rejects_bad_declarations():
    with pytest.raises(ValueError, match="unknown"):
        FieldSpec.parse("x", "decimal")
    with pytest.raises(ValueError, match="clashes"):
        RecordSpec.build("key", {"key_group": "long"})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["key", "amount", "x"]), json_values, max_size=3), max_size=20))
def test_every_line_is_a_record_or_a_dead_letter(objects):
    """Property: records + dead letters account for every line; keys follow the key contract."""
    data = lines(*(json.dumps(o) for o in objects))
    out = parse_lines(data, 0, RecordSpec.build("key", {"amount": "double"}))
    assert len(out.keys) + len(out.dead) == len(objects)
    valid = [
        o
        for o in objects
        if (type(o.get("key")) is str or type(o.get("key")) is int)
        and type(o.get("amount")) in (int, float)
        and not (type(o.get("key")) is str and _has_surrogate(o["key"]))
    ]
    assert out.keys == [o["key"] if isinstance(o["key"], str) else str(o["key"]) for o in valid]
    offsets = sorted([*out.offsets, *(d.offset for d in out.dead)])
    assert len(set(offsets)) == len(objects)


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _fast(data: bytes, spec: RecordSpec):
    from spark_runtime.records import parse_lines_arrow

    return parse_lines_arrow(data, 7, spec)


@settings(max_examples=250, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.dictionaries(st.sampled_from(["key", "amount", "n", "x"]), json_values, max_size=4).map(json.dumps),
            st.sampled_from(
                [
                    "{bad",
                    "[1]",
                    "",
                    "  ",
                    '{"key":"a"}{"key":"b"}',
                    '{"key":"a","amount":NaN}',
                    '{"key":"a","x":NaN}',
                    '{"key":"a","x":-Infinity}',
                    b'{"key":"\xc3("}',
                    b'{"key":"a","x":"\xed\xa0\x80"}',
                ]
            ),
            st.fixed_dictionaries({"key": st.text(max_size=6), "amount": st.integers(-5, 5)}).map(json.dumps),
            st.fixed_dictionaries({"key": st.integers(-3, 3), "amount": st.floats(-1, 1)}).map(json.dumps),
        ),
        max_size=12,
    ),
    st.sampled_from([{"amount": "double"}, {"amount": "double?", "n": "long?"}, {}, {"n": "long"}]),
)
def test_arrow_fast_path_agrees_with_the_python_parser(raw_lines, fields):
    """Property: whenever the Arrow fast path accepts a chunk, the exact Python parser finds no dead letter
    and the same keys, offsets and values."""
    spec = RecordSpec.build("key", fields)
    data = lines(*raw_lines)
    fast = _fast(data, spec)
    slow = parse_lines(data, 7, spec)
    if fast is None:
        return
    table, offsets = fast
    assert slow.dead == [] and len(slow.keys) == len(raw_lines)
    assert table.column("key").to_pylist() == slow.keys
    assert offsets.to_pylist() == slow.offsets
    for name, values in slow.columns.items():
        assert table.column(name).to_pylist() == values


def test_arrow_fast_path_takes_clean_chunks_and_integer_keys():
    spec = RecordSpec.build("key", {"amount": "double"})
    table, offsets = _fast(lines('{"key": "a", "amount": 1}', '{"key": "b", "amount": 2.5}'), spec)
    assert table.column("key").to_pylist() == ["a", "b"] and offsets.to_pylist() == [7, 7 + 26]
    table, _ = _fast(lines('{"key": 7, "amount": 1}', '{"key": -3, "amount": 1}'), spec)
    assert table.column("key").to_pylist() == ["7", "-3"]
    assert _fast(lines('{"key": "a", "amount": 1}', "{bad"), spec) is None
    assert _fast(lines('{"key": "a"}'), spec) is None  # missing required field
    assert _fast(lines('{"key": "a", "amount": 1, "x": Infinity}'), spec) is None  # laxness of Arrow's parser
    assert _fast(lines(b'{"key": "\xc3(", "amount": 1}'), spec) is None  # invalid UTF-8
    assert _fast(lines('{"key": "a", "amount": 1}'), RecordSpec.build("key", raw_value=True)) is None
