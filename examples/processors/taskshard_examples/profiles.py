"""A spending profile per customer: the shape of most keyed aggregations a processor writes."""

from __future__ import annotations

from typing import Any

import pandas as pd

from spark_runtime.engine import Processor

DAY = 86_400.0


class SpendProfile(Processor):
    """Per key (a customer): ``orders`` (count), ``spent`` (sum of ``amount``) and ``largest`` (max ``amount``).

    Parameters: ``field`` (the amount's field, default ``amount``) and ``forgetAfterDays`` (state TTL, default 30;
    a customer who orders again after that starts a new profile).
    Results: three columns, ``orders bigint, spent double, largest double``.
    """

    state_schema = "orders bigint, spent double, largest double"
    result_schema = "orders bigint, spent double, largest double"

    def __init__(self, parameters: dict[str, Any] | None = None) -> None:
        super().__init__(parameters)
        self.field = str(self.parameters.get("field", "amount"))
        self.fields = {self.field: "double"}
        self.state_ttl_seconds = float(self.parameters.get("forgetAfterDays", 30)) * DAY

    def process(self, events: pd.DataFrame, state: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        batch = events.groupby("key", sort=False)[self.field].agg(["size", "sum", "max"])
        prev = state.set_index("key").reindex(batch.index)
        orders = prev["orders"].fillna(0).to_numpy(dtype="int64") + batch["size"].to_numpy(dtype="int64")
        spent = prev["spent"].fillna(0.0).to_numpy() + batch["sum"].to_numpy()
        largest = prev["largest"].fillna(float("-inf")).combine(batch["max"], max).to_numpy()
        new = pd.DataFrame({"key": batch.index.to_numpy(), "orders": orders, "spent": spent, "largest": largest})
        return new, new
