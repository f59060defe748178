"""A bucket's state in Spark's state store: a list of runs (``meta``) and the runs' bytes (``runs``).

Per bucket of key groups (the grouping key of the shard's ``transformWithStateInPandas``; every run row keeps its
own key group in ``_kg``) two state variables hold the truth:

``meta`` (ValueState, one JSON string)
    ``{"next": <next run seq>, "runs": [[run id, seq, rows], ...]}``, oldest run first.
``runs`` (MapState ``run id -> bytes``)
    Each run of ``meta`` as an Arrow IPC file (:class:`spark_runtime.engine.runs.Run`), and nothing else.

A batch reads ``meta`` (one round trip to the JVM), the runs it has no local copy of (one round trip each, through
:class:`~spark_runtime.engine.run_cache.RunCache`), writes one new run (one round trip; the state store's changelog
grows by that run alone), and after a compaction the merged run and the removal of the runs it replaces; then
``meta``. Both variables commit or roll back with the batch, like all of Spark's state, so a retried batch reads
exactly what the failed attempt read.

:class:`KeyGroupRuns` works on callbacks (:class:`StateVars`), so its logic is tested without Spark; the Spark side
(:mod:`spark_runtime.engine.stateful`) passes the two state variables' methods.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from spark_runtime.engine.run_cache import RunCache
from spark_runtime.engine.runs import Found, Run, build_run, compaction_span, lookup, merge_runs
from spark_runtime.engine.schema import StateSchema

__all__ = ["KeyGroupRuns", "RunsMeta", "StateVars", "WriteStats"]


@dataclass(frozen=True)
class RunsMeta:
    """The ``meta`` value: the next run's seq and the runs ``(id, seq, rows)``, oldest first."""

    next_seq: int = 1
    runs: tuple[tuple[str, int, int], ...] = ()

    def to_json(self) -> str:
        return json.dumps({"next": self.next_seq, "runs": [list(r) for r in self.runs]}, separators=(",", ":"))

    @staticmethod
    def from_json(text: str | None) -> RunsMeta:
        if not text:
            return RunsMeta()
        data = json.loads(text)
        return RunsMeta(int(data["next"]), tuple((str(i), int(s), int(n)) for i, s, n in data["runs"]))


@dataclass(frozen=True)
class StateVars:
    """The state store calls of one key group (the current grouping key's)."""

    get_meta: Callable[[], str | None]
    set_meta: Callable[[str], None]
    get_run: Callable[[str], bytes]
    put_run: Callable[[str, bytes], None]
    remove_run: Callable[[str], None]


@dataclass(frozen=True)
class WriteStats:
    """What one write stored in the state store: the rows and bytes of the run it put (the new run, or the merged run
    that replaced it and the runs before it), whether it compacted, and the runs the key group keeps."""

    rows: int
    bytes: int
    compacted: bool = False
    runs: int = 0


class KeyGroupRuns:
    """One key group's state for one batch: :meth:`read` the touched keys, then :meth:`write` their new rows once."""

    def __init__(self, vars: StateVars, cache: RunCache, schema: StateSchema, *, ttl: bool = False) -> None:
        self.vars = vars
        self.cache = cache
        self.schema = schema
        self.ttl = ttl
        self.run_schema = schema.run_schema(ttl=ttl)
        self.meta = RunsMeta.from_json(vars.get_meta())
        self._runs: list[Run] | None = None

    def _conform(self, table: Any) -> Any:
        return self.schema.conform(table, self.run_schema)

    def runs(self) -> list[Run]:
        """The key group's runs, newest first."""
        if self._runs is None:
            loaded = []
            for run_id, _, _ in reversed(self.meta.runs):
                loaded.append(self.cache.get(run_id, lambda rid=run_id: self.vars.get_run(rid)))
            self._runs = loaded
        return self._runs

    def read(self, keys: Sequence[str], *, now_ms: int | None = None) -> Found:
        """The live state rows (in the run schema) of ``keys`` and the keys any run holds."""
        return lookup(self.runs(), keys, self._conform, now_ms=now_ms)

    def all_rows(self, *, now_ms: int | None = None) -> Any:
        """Every live state row of the key group (a merge of all runs; for seeding and tests)."""
        runs = self.runs()
        if not runs:
            return self.run_schema.empty_table()
        return merge_runs(runs, self.run_schema, oldest=True, now_ms=now_ms, conform=self._conform).table

    def write(
        self, state: Any, deleted: Sequence[str], *, expires: Any = None, now_ms: int | None = None
    ) -> WriteStats:
        """Store the new rows of the touched keys (``state``: ``key`` + state columns) and tombstones for ``deleted``
        (keys whose state is removed and that some run holds), as one new run; then compact (see
        :func:`~spark_runtime.engine.runs.compaction_span`) and write ``meta``."""
        if state.num_rows == 0 and not deleted:
            return WriteStats(0, 0, runs=len(self.meta.runs))
        seq = self.meta.next_seq
        run = build_run(state, list(deleted), self.run_schema, seq, expires=expires)
        entries = list(self.meta.runs) + [("", seq, run.rows)]
        span = compaction_span([n for _, _, n in entries])
        if span > 1:  # the new run and the span - 1 newest stored ones become one
            run = merge_runs(
                [run] + self.runs()[: span - 1],
                self.run_schema,
                oldest=span == len(entries),
                now_ms=now_ms,
                conform=self._conform,
            )
            replaced = [rid for rid, _, _ in entries[-span:-1]]
            for rid in replaced:
                self.vars.remove_run(rid)
            self.cache.forget(replaced)
        new_id = _run_id(seq)
        entries = entries[: len(entries) - span] + [(new_id, seq, run.rows)]
        data = run.to_bytes()
        self.vars.put_run(new_id, data)
        self.cache.put(new_id, run, data)
        self.meta = RunsMeta(seq + 1, tuple(entries))
        self.vars.set_meta(self.meta.to_json())
        self._runs = None
        return WriteStats(run.rows, len(data), span > 1, len(entries))


def _run_id(seq: int) -> str:
    return f"{seq:010d}-{secrets.token_hex(6)}"
