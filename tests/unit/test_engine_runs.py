"""The runs layout without Spark: lookups, tombstones, TTL, compaction and hash collisions against a dict model."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_runtime.engine import runs as R
from spark_runtime.engine.run_cache import RunCache
from spark_runtime.engine.schema import StateSchema
from spark_runtime.engine.state_layout import KeyGroupRuns, RunsMeta, StateVars

pytestmark = pytest.mark.unit

SCHEMA = StateSchema.parse("n bigint, tag string")


class Store:
    """A key group's two state variables as dicts (what the state store holds for one grouping key)."""

    def __init__(self) -> None:
        self.meta: str | None = None
        self.runs: dict[str, bytes] = {}
        self.reads = 0

    def vars(self) -> StateVars:
        def get_run(run_id: str) -> bytes:
            self.reads += 1
            return self.runs[run_id]

        return StateVars(
            get_meta=lambda: self.meta,
            set_meta=lambda text: setattr(self, "meta", text),
            get_run=get_run,
            put_run=lambda run_id, data: self.runs.__setitem__(run_id, data),
            remove_run=lambda run_id: self.runs.pop(run_id),
        )


def state_table(rows: dict[str, tuple[int, str]]) -> pa.Table:
    keys = list(rows)
    return pa.table(
        {
            "key": pa.array(keys, pa.string()),
            "_kg": pa.array([7] * len(keys), pa.int32()),
            "n": pa.array([rows[k][0] for k in keys], pa.int64()),
            "tag": pa.array([rows[k][1] for k in keys], pa.string()),
        }
    )


def apply_batch(store: Store, cache: RunCache, model: dict, upserts: dict, deletes: set, schema=SCHEMA) -> None:
    """One batch: read the touched keys, then write their new rows and tombstones (as the processor path does)."""
    touched = list(upserts) + [k for k in deletes if k not in upserts]
    state = KeyGroupRuns(store.vars(), cache, schema)
    found = state.read(touched)
    have = set(found.rows.column("key").to_pylist())
    assert have == {k for k in touched if k in model}
    for k, n, tag in zip(*(found.rows.column(c).to_pylist() for c in ("key", "n", "tag")), strict=True):
        assert model[k] == (n, tag)
    deleted = [k for k in found.held if k in deletes and k not in upserts]
    state.write(state_table(upserts), deleted)
    model.update(upserts)
    for k in deletes:
        if k not in upserts:
            model.pop(k, None)


def everything(store: Store, cache: RunCache) -> dict:
    table = KeyGroupRuns(store.vars(), cache, SCHEMA).all_rows()
    return {k: (n, t) for k, n, t in zip(*(table.column(c).to_pylist() for c in ("key", "n", "tag")), strict=True)}


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 40), max_size=12), st.lists(st.integers(0, 40), max_size=5)), max_size=25
    )
)
def test_runs_match_a_dict_over_any_batches(tmp_path_factory, batches):
    store, cache, model = Store(), RunCache(str(tmp_path_factory.mktemp("cache"))), {}
    for i, (ups, dels) in enumerate(batches):
        upserts = {f"k{u}": (i * 100 + u, f"t{i}") for u in ups}
        apply_batch(store, cache, model, upserts, {f"k{d}" for d in dels})
        assert everything(store, cache) == model
        meta = RunsMeta.from_json(store.meta) if store.meta else RunsMeta()
        assert set(store.runs) == {rid for rid, _, _ in meta.runs}, "the map holds exactly the runs of meta"
        assert len(meta.runs) <= R.MAX_RUNS


def test_collisions_are_resolved_by_key(monkeypatch, tmp_path):
    """A hash that maps many keys to one value: lookups, merges and tombstones stay exact."""
    monkeypatch.setattr(R, "key_hashes", lambda keys: np.array([len(k) % 3 for k in keys], dtype=np.uint64))
    store, cache, model = Store(), RunCache(str(tmp_path)), {}
    rng = random.Random(7)
    for i in range(30):
        ups = {f"key-{rng.randrange(60)}": (i, "x") for _ in range(rng.randrange(1, 8))}
        dels = {f"key-{rng.randrange(60)}" for _ in range(rng.randrange(0, 4))}
        apply_batch(store, cache, model, ups, dels)
    assert everything(store, cache) == model


def test_a_batch_reads_and_writes_what_it_touches(tmp_path):
    """With 20,000 keys stored, a batch of 10 keys writes a run of 10 rows, and its lookup reads no run bytes from
    the store when the cache has them (only meta)."""
    store, cache, model = Store(), RunCache(str(tmp_path)), {}
    apply_batch(store, cache, model, {f"k{i}": (i, "a") for i in range(20_000)}, set())
    before = store.reads
    state = KeyGroupRuns(store.vars(), cache, SCHEMA)
    found = state.read([f"k{i}" for i in range(10)])
    stats = state.write(state_table({k: (1, "b") for k in found.rows.column("key").to_pylist()}), [])
    assert stats.rows == 10 and not stats.compacted
    assert store.reads == before
    # A cold worker (new cache directory) fetches each run once, then never again.
    cold = RunCache(str(tmp_path / "cold"))
    KeyGroupRuns(store.vars(), cold, SCHEMA).read(["k1"])
    KeyGroupRuns(store.vars(), cold, SCHEMA).read(["k2"])
    assert cold.fetched == len(RunsMeta.from_json(store.meta).runs)


def test_compaction_keeps_runs_logarithmic():
    sizes: list[int] = [100_000]
    most = 0
    for _ in range(2_000):
        sizes.append(50)
        span = R.compaction_span(sizes)
        if span > 1:
            sizes = sizes[:-span] + [sum(sizes[-span:])]
        most = max(most, len(sizes))
    assert most <= 10
    assert R.compaction_span([10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 1]) >= 2  # over MAX_RUNS


def test_ttl_expired_rows_are_absent_and_dropped_by_a_full_merge(tmp_path):
    schema = StateSchema.parse("n bigint, tag string")
    target = schema.run_schema(ttl=True)
    run = R.build_run(state_table({"a": (1, "x"), "b": (2, "y")}), [], target, 1, expires=np.array([1_000, 5_000]))
    conform = lambda t: schema.conform(t, target)  # noqa: E731
    found = R.lookup([run], ["a", "b"], conform, now_ms=2_000)
    assert found.rows.column("key").to_pylist() == ["b"]
    assert found.held == {"a", "b"}
    merged = R.merge_runs([run], target, oldest=True, now_ms=2_000, conform=conform)
    assert merged.table.column("key").to_pylist() == ["b"]
    kept = R.merge_runs([run], target, oldest=False, now_ms=2_000, conform=conform)
    assert kept.rows == 2, (
        "a merge above older runs keeps an expired row: dropping it would bring back an older row of its key"
    )


def test_a_run_from_another_hash_scheme_is_rehashed(monkeypatch):
    run = R.build_run(state_table({"a": (1, "x"), "b": (2, "y"), "c": (3, "z")}), [], SCHEMA.run_schema(ttl=False), 3)
    data = run.to_bytes()
    monkeypatch.setattr(R, "HASH_SCHEME", "other/0")
    monkeypatch.setattr(R, "key_hashes", lambda keys: np.array([ord(k[0]) for k in keys], dtype=np.uint64))
    again = R.Run.from_buffer(data)
    assert again.seq == 3
    assert list(again.hashes) == sorted(ord(k) for k in "abc")
    found = R.lookup([again], ["c"], lambda t: SCHEMA.conform(t, SCHEMA.run_schema(ttl=False)))
    assert found.rows.column("n").to_pylist() == [3]


def test_the_run_cache_stays_within_its_budget_and_a_killed_process_leaves_no_copy(tmp_path, monkeypatch):
    """Point 8 of the whole-life issue: a worker trims its directory back to the budget as it writes (a trimmed
    run is fetched again), and a driver's directory left by a killed process (or by this pid's earlier
    incarnation in a container restarted in place) is removed when the next one is created; a live process's
    directory is kept."""
    import os
    import subprocess

    from spark_runtime.engine import run_cache as rc

    store, cache, model = Store(), RunCache(str(tmp_path / "w"), budget_bytes=64 << 10), {}
    for n in range(12):
        apply_batch(store, cache, model, {f"b{n}k{i}": (i, "x" * 8) for i in range(800)}, set())
    files = list((tmp_path / "w").glob("*.arrow"))
    assert files and sum(f.stat().st_size for f in files) <= (64 << 10) + max(f.stat().st_size for f in files)
    state = KeyGroupRuns(store.vars(), cache, SCHEMA)
    assert state.read([f"b0k{i}" for i in range(800)]).rows.num_rows == 800, "a trimmed run is fetched again"

    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no process
    dead = tmp_path / f"{rc.DIR_PREFIX}{gone.pid}-old"
    mine = tmp_path / f"{rc.DIR_PREFIX}{os.getpid()}-earlier"
    live = tmp_path / f"{rc.DIR_PREFIX}1-live"  # pid 1 runs
    for d in (dead, mine, live):
        d.mkdir()
        (d / "r.arrow").write_bytes(b"x")
    monkeypatch.setattr(rc, "_PROCESS_CACHE_DIR", [])
    made = rc.process_cache_dir(str(tmp_path))
    assert os.path.isdir(made) and os.path.basename(made).startswith(f"{rc.DIR_PREFIX}{os.getpid()}-")
    assert not dead.exists() and not mine.exists() and live.exists()
    assert rc.process_cache_dir(str(tmp_path)) == made, "one directory per process"


def test_the_run_cache_budget_follows_the_operators_env_and_a_broken_value_is_refused_by_name():
    """The operator sets $TASKSHARD_RUN_CACHE_BYTES to a quarter of the pod's /tmp size limit; a worker's cache
    uses it (unset: 4 GiB)."""
    from spark_runtime.engine import run_cache as rc

    assert rc.budget_bytes({}) == rc.BUDGET_BYTES == 4 << 30
    assert rc.budget_bytes({"TASKSHARD_RUN_CACHE_BYTES": "536870912"}) == 512 << 20
    for bad in ("", "-1", "0", "2Gi"):
        with pytest.raises(ValueError, match=f"TASKSHARD_RUN_CACHE_BYTES: {bad!r}: must be a positive integer"):
            rc.budget_bytes({"TASKSHARD_RUN_CACHE_BYTES": bad})
