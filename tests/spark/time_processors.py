"""The example time processors, as Spark's Python workers import them in the spark tier
(``tests.spark.time_processors:SessionWindow``): the example package is put on the path first."""

from __future__ import annotations

import sys
from pathlib import Path

_EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples" / "processors")
if _EXAMPLES not in sys.path:
    sys.path.insert(0, _EXAMPLES)

from taskshard_examples.sessions import SessionWindow, reference_sessions  # noqa: E402
from taskshard_examples.silence import SilenceAlert  # noqa: E402

__all__ = ["SessionWindow", "SilenceAlert", "reference_sessions"]


class LastSeen(SilenceAlert):
    """:class:`SilenceAlert`'s state without its timers (a processor that declares timers later)."""

    timers = None

    def process(self, events, state):  # type: ignore[no-untyped-def]
        new_state, outputs = super().process(events, state)
        return new_state.drop(columns=["timer"]), outputs
