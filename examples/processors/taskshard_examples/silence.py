"""A silence alert: a key (a sensor) that sends nothing for a while raises an alert, with no event to trigger it.
A processing-time timer per key does it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from spark_runtime.engine import Processor


class SilenceAlert(Processor):
    """Per key: ``last_seen`` (processing time of its last batch with events, epoch ms) and a processing-time timer
    ``silenceSeconds`` after it. When the timer fires, one alert ``silent_since bigint`` (the ``last_seen``) is
    emitted and the key is forgotten until it sends again.

    Parameters: ``silenceSeconds`` (default 300). Processing time is not deterministic: the alert fires in the
    first batch at or after the deadline (a shard with processing-time timers runs a batch every trigger).
    """

    timers = "processing"
    state_schema = "last_seen bigint"
    result_schema = "silent_since bigint"

    def __init__(self, parameters: dict[str, Any] | None = None) -> None:
        super().__init__(parameters)
        self.silence_ms = int(float(self.parameters.get("silenceSeconds", 300)) * 1000)
        if self.silence_ms <= 0:
            raise ValueError(f"silenceSeconds: {self.parameters.get('silenceSeconds')!r} must be positive")

    def process(self, events: pd.DataFrame, state: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        now = int(self.now_ms or 0)
        keys = pd.unique(events["key"])
        n = len(keys)
        new_state = pd.DataFrame(
            {"key": keys, "last_seen": np.full(n, now, "int64"), "timer": np.full(n, now + self.silence_ms, "int64")}
        )
        return new_state, None

    def on_timer(self, timers: pd.DataFrame, state: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        alerts = pd.DataFrame({"key": state["key"].to_numpy(), "silent_since": state["last_seen"].to_numpy("int64")})
        return None, alerts
