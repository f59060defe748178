"""The Python processor API without Spark: the contract enforcement, the built-in twins, state tables."""

from __future__ import annotations

import pandas as pd
import pytest

from spark_runtime.engine.api import processor_state_schema
from spark_runtime.processor import (
    CountProcessor,
    Processor,
    ProcessorError,
    SumProcessor,
    decode_state_table,
    encode_state_table,
    frame_to_state_table,
    load_processor,
    run_processor,
    state_frame,
)

pytestmark = pytest.mark.unit


def state_columns(schema: str) -> list[tuple[str, str]]:
    return processor_state_schema(type("P", (Processor,), {"state_schema": schema})()).pairs


def events(*pairs, field="amount"):
    return pd.DataFrame(
        {
            "key": [k for k, _ in pairs],
            field: [float(v) for _, v in pairs],
            "partition": [0] * len(pairs),
            "offset": list(range(len(pairs))),
        }
    )


def test_count_processor_folds_into_existing_state():
    cols = state_columns(CountProcessor.state_schema)
    state = pd.DataFrame({"key": ["a", "z"], "count": [5, 9]})
    full, out = run_processor(CountProcessor(), events(("a", 1), ("b", 1), ("a", 1)), state, cols)
    assert dict(zip(full["key"], full["count"], strict=True)) == {"a": 7, "b": 1, "z": 9}
    assert dict(zip(out["key"], out["result"], strict=True)) == {"a": 7, "b": 1}


def test_sum_processor_reads_its_field_from_parameters():
    proc = SumProcessor({"field": "price"})
    assert proc.fields == {"price": "double"}
    cols = state_columns(proc.state_schema)
    full, out = run_processor(proc, events(("a", 2), ("a", 3), field="price"), state_frame(None, cols), cols)
    assert full.set_index("key")["sum"].to_dict() == {"a": 5.0}
    assert out.set_index("key")["result"].to_dict() == {"a": 5.0}


class Deleter(Processor):
    state_schema = "n bigint"
    result_type = "bigint"

    def process(self, events, state):
        keys = events["key"].unique()
        keep = [k for k in keys if k != "gone"]
        return pd.DataFrame({"key": keep, "n": [1] * len(keep)}), pd.DataFrame({"key": keys, "result": 0})


def test_keys_missing_from_new_state_are_deleted_others_untouched():
    cols = state_columns("n bigint")
    state = pd.DataFrame({"key": ["gone", "other"], "n": [3, 4]})
    full, _ = run_processor(Deleter(), events(("gone", 1), ("x", 1)), state, cols)
    assert full.set_index("key")["n"].to_dict() == {"other": 4, "x": 1}


class Bad(Processor):
    state_schema = "n bigint"

    def __init__(self, parameters=None):
        super().__init__(parameters)
        self.mode = self.parameters.get("mode")

    def process(self, events, state):
        if self.mode == "stray":
            return pd.DataFrame({"key": ["not-in-events"], "n": [1]}), None
        if self.mode == "dup":
            return pd.DataFrame({"key": ["a", "a"], "n": [1, 2]}), None
        if self.mode == "cols":
            return pd.DataFrame({"key": ["a"]}), None
        if self.mode == "outputs":
            return None, pd.DataFrame({"k": ["a"]})
        if self.mode == "foreign":
            return None, pd.DataFrame({"key": ["b"], "result": ["x"]})
        return "nope"


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("stray", "not in events"),
        ("dup", "more than once"),
        ("cols", "lacks columns"),
        ("outputs", "outputs lacks columns"),
        ("foreign", "outputs has key 'b', which is not in events"),
        ("tuple", "must return"),
    ],
)
def test_contract_violations_are_named(mode, message):
    with pytest.raises(ProcessorError, match=message):
        run_processor(Bad({"mode": mode}), events(("a", 1)), state_frame(None, [("n", "bigint")]), [("n", "bigint")])


def test_state_table_round_trip():
    cols = state_columns("count bigint, last string, ok boolean, ratio double")
    df = pd.DataFrame({"key": ["a", "b"], "count": [1, 2], "last": ["x", None], "ok": [True, False], "ratio": [0.5, 1]})
    back = state_frame(decode_state_table(encode_state_table(frame_to_state_table(df, cols))), cols)
    pd.testing.assert_frame_equal(back, df.astype({"ratio": "float64"}))
    assert list(state_frame(None, cols).columns) == ["key", "count", "last", "ok", "ratio"]


@pytest.mark.parametrize(
    ("schema", "message"),
    [("", "at least one"), ("n decimal", "type"), ("key bigint", "reserved"), ("a int, a int", "duplicate")],
)
def test_state_schema_errors(schema, message):
    with pytest.raises(ProcessorError, match=message):
        state_columns(schema)


def test_load_processor():
    proc = load_processor("spark_runtime.processor:SumProcessor", {"field": "x"})
    assert isinstance(proc, SumProcessor) and proc.field == "x"
    with pytest.raises(ProcessorError, match="cannot import"):
        load_processor("no_such_module_xyz:P")
    with pytest.raises(ProcessorError, match="no attribute"):
        load_processor("spark_runtime.processor:Nope")
    with pytest.raises(ProcessorError, match="not a class"):
        load_processor("spark_runtime.processor:state_frame")
    with pytest.raises(ProcessorError, match="package.module:ClassName"):
        load_processor("just_a_module")


class Raises(Processor):
    state_schema = "n bigint"

    def process(self, events, state):
        raise ValueError("no such\ncolumn")  # a user's bug; a multi-line message stays one line


def test_a_users_exception_is_named_with_the_key_group_and_found_in_sparks_error_text():
    from spark_runtime.engine.api import ProcessorFailed, call_processor, processor_failure

    with pytest.raises(ProcessorFailed) as failed:
        call_processor(Raises(), events(("a", 1)), state_frame(None, [("n", "bigint")]), ["n"], ["result"], [7, 3])
    text = str(failed.value)
    assert text == "Raises.process raised ValueError: no such column (key groups 3, 7)"
    assert isinstance(failed.value.__cause__, ValueError)
    # What Spark reports for a failed micro-batch: py4j's preamble, the Python worker's traceback, the JVM's frames.
    spark_error = (
        "[STREAM_FAILED] Query [id = 1] terminated with exception: An exception was raised by the Python Proxy. "
        'Return Message: Traceback (most recent call last):\n  File "/x/pyspark/worker.py", line 1, in main\n'
        f"spark_runtime.engine.api.ProcessorFailed: {text}\n\n\tat org.apache.spark.api.python.X(X.scala:1)\n"
    )
    assert processor_failure(spark_error) == text
    assert processor_failure("[STREAM_FAILED] something else: ValueError: x") is None
    with pytest.raises(ProcessorFailed, match=r"new_state has key 'not-in-events'.* \(key group 5\)$"):
        call_processor(Bad({"mode": "stray"}), events(("a", 1)), state_frame(None, [("n", "bigint")]), ["n"], [], [5])
