"""Processors of the engine tests (imported by Spark's Python workers as ``tests.spark.engine_processors``)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from spark_runtime.engine import Processor

SCHEMAS = {
    1: "count int, total double",
    2: "count bigint, total double, last double default -1.0",  # widen count, add last
    3: "count bigint, last double default -1.0",  # drop total
    "bad": "count string, total double",
}


class Profile(Processor):
    """Per key: events counted and amounts summed; results ``count`` and ``total`` (two typed columns).
    ``parameters.schema`` picks a state schema of :data:`SCHEMAS` (the same logic runs on each)."""

    fields = {"amount": "double"}
    result_schema = "count bigint, total double"

    def __init__(self, parameters: dict[str, Any] | None = None) -> None:
        super().__init__(parameters)
        version = self.parameters.get("schema", 1)
        self.version = version
        self.state_schema = SCHEMAS[version]

    def process(self, events: pd.DataFrame, state: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        agg = events.groupby("key", sort=False)["amount"].agg(["size", "sum", "last"])
        prev = state.set_index("key").reindex(agg.index)
        count = prev["count"].fillna(0).astype("int64").to_numpy() + agg["size"].to_numpy()
        keys = agg.index.to_numpy()
        new = {"key": keys, "count": count}
        if "total" in state.columns:
            total = prev["total"].fillna(0.0).to_numpy() + agg["sum"].to_numpy()
            new["total"] = total
        else:
            total = agg["sum"].to_numpy() * float("nan")
        if "last" in state.columns or self.version in (2, 3):
            new["last"] = agg["last"].to_numpy()
        return pd.DataFrame(new), pd.DataFrame({"key": keys, "count": count, "total": total})


class Recent(Processor):
    """Counts events per key and forgets a key 2 s after it was last written (state TTL on the batches' clock)."""

    state_schema = "count bigint"
    result_type = "bigint"
    state_ttl_seconds = 2.0

    def process(self, events: pd.DataFrame, state: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        counts = events.groupby("key", sort=False).size()
        prev = state.set_index("key")["count"].reindex(counts.index, fill_value=0)
        total = prev.to_numpy(dtype="int64") + counts.to_numpy(dtype="int64")
        keys = counts.index.to_numpy()
        return pd.DataFrame({"key": keys, "count": total}), pd.DataFrame({"key": keys, "result": total})


class RecentAsText(Recent):
    """:class:`Recent` with its count stored as text: a state schema no shard of :class:`Recent` can evolve to."""

    state_schema = "count string"


class Picky(Processor):
    """Sums amounts per key and raises ``ValueError`` on a negative one (a user's bug, as a user would write it)."""

    fields = {"amount": "double"}
    state_schema = "total double"
    result_type = "double"

    def process(self, events: pd.DataFrame, state: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        negative = events["amount"] < 0
        if negative.any():
            raise ValueError(f"amount must not be negative: {events['amount'][negative].iloc[0]}")
        sums = events.groupby("key", sort=False)["amount"].sum()
        prev = state.set_index("key")["total"].reindex(sums.index, fill_value=0.0)
        total = prev.to_numpy() + sums.to_numpy()
        keys = sums.index.to_numpy()
        return pd.DataFrame({"key": keys, "total": total}), pd.DataFrame({"key": keys, "result": total})


class Gated(Processor):
    """Counts events per key, and hangs while the file ``parameters.gate`` exists (a processor that does not
    return: the hung batch the runtime's ``batch_running_seconds`` and the operator's NoProgress show)."""

    state_schema = "count bigint"
    result_type = "bigint"

    def process(self, events: pd.DataFrame, state: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        import os
        import time

        while os.path.exists(self.parameters["gate"]):
            time.sleep(0.1)  # the hang itself (the test removes the gate to end it), not a synchronisation
        counts = events.groupby("key", sort=False).size()
        prev = state.set_index("key")["count"].reindex(counts.index, fill_value=0)
        total = prev.to_numpy(dtype="int64") + counts.to_numpy(dtype="int64")
        keys = counts.index.to_numpy()
        return pd.DataFrame({"key": keys, "count": total}), pd.DataFrame({"key": keys, "result": total})


class Poison(Processor):
    """Counts events per key, and raises ``ValueError`` on a poison record: an event of key ``parameters.failKey``
    whose ``amount`` is ``parameters.failValue`` (a user's bug that one record triggers; both unset: none). Fixing
    it is a Task edit that sets both to null."""

    fields = {"amount": "double"}
    state_schema = "count bigint"
    result_type = "bigint"

    def process(self, events: pd.DataFrame, state: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        key, value = self.parameters.get("failKey"), self.parameters.get("failValue")
        if key is not None and value is not None:
            poison = (events["key"] == key) & (events["amount"] == float(value))
            if poison.any():
                raise ValueError(f"cannot process key {key!r} with amount {value}")
        counts = events.groupby("key", sort=False).size()
        prev = state.set_index("key")["count"].reindex(counts.index, fill_value=0)
        total = prev.to_numpy(dtype="int64") + counts.to_numpy(dtype="int64")
        keys = counts.index.to_numpy()
        return pd.DataFrame({"key": keys, "count": total}), pd.DataFrame({"key": keys, "result": total})
