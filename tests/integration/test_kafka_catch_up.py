"""Catch-up hand-overs on a real Kafka broker with state on MinIO: successors follow their running parents' committed
offsets without emitting (our Kafka data source caps each micro-batch at them and marks what lies before the
parents' final offsets as held), then take over exactly at the final offsets. Input is produced the whole time.

- subscribe mode, a split: both children restore the parent's pre-copy and catch up (``catch-up.json``, request
  notes of mode ``catch-up``), the parent drains by itself once both are ready, the children go live;
- ``partitionedByKey``, a merge of two running parents (each reads its own partition) into one shard;
- SIGKILLs of subprocess runners on one split: the parent while its children catch up (restarted, it hands over
  once), a child while catching up (restarted, it resumes its catch-up) and a child right after it took over
  (restarted, it continues).

Every test checks the per-key results against a plain-Python reference and, from runtime truth (each shard's
committed offset log and the batch ids its output records carry), that no record's result is emitted by two
shards: each batch of a parent up to its final batch emitted exactly the keys of its records, nothing after it;
each batch of a successor emitted exactly the keys of its records at or after the parents' final offsets (none
for a batch ending at or before them, only those past the fence for the batch that straddles them).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from spark_runtime.checkpoint import read_offsets
from spark_runtime.layout import ShardPaths
from spark_runtime.protocol import HandoverMode, parse_note_name
from spark_runtime.sources import make_source
from tests.jvm import integration_jvm_conf

from .test_kafka_handovers import merge_from
from .test_kafka_s3_shards import Reference, Running, Setup, _nested_source, _own, check_results, make_events

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PARENT, LEFT, RIGHT = "kt-0-16", "kt-0-8", "kt-8-16"


# ---------------------------------------------------------------- helpers


class Producer(threading.Thread):
    """Produces ``chunk`` events every ``pause`` seconds until :meth:`finish` (input arriving the whole time), and
    adds them to ``ref``."""

    def __init__(self, setup: Setup, ref: Reference, seed: int, chunk: int = 30, pause: float = 0.25) -> None:
        super().__init__(name="producer", daemon=True)
        self.setup, self.ref, self.rng = setup, ref, random.Random(seed)
        self.chunk, self.pause = chunk, pause
        self.sent = 0
        self.error: BaseException | None = None
        self._done = threading.Event()

    def run(self) -> None:
        try:
            while not self._done.wait(self.pause):
                events = make_events(self.chunk, self.rng)
                self.setup.broker.produce(self.setup.topic_in, events)
                self.ref.add(events)
                self.sent += len(events)
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def finish(self) -> int:
        """Stop producing (idempotent); returns how many events it produced."""
        self._done.set()
        if self.ident is None:  # never started
            return self.sent
        self.join(60)
        assert not self.is_alive(), "the producer did not stop"
        if self.error is not None:
            raise self.error
        return self.sent


class ShardProc:
    """A shard runtime in its own process group (like a pod: SIGKILL of the group kills its JVM too), run as
    ``python -m spark_runtime run --config`` against Kafka and MinIO (as ``_run_cli`` of test_kafka_s3_shards does,
    without waiting for it)."""

    def __init__(self, config: Any, tmp_path: Path, jars: list[Path]) -> None:
        self.shard = config.shard
        path = tmp_path / f"{config.shard}.json"
        path.write_text(json.dumps(config.to_json_dict()))
        self.log_path = tmp_path / f"{config.shard}.log"
        env = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "TASKSHARD_EXTRA_JARS": os.pathsep.join(str(j) for j in jars),
        }
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "spark_runtime", "run", "--config", str(path)],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _gone(self) -> None:
        """Kill what is left of the group (the JVM) and wait until it is gone: nothing of it writes afterwards."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.proc.wait(60)  # reaped: a zombie would still count as a member of the group
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)

    def kill(self) -> int:
        """SIGKILL the group (a lost node, an OOM kill); returns the exit code."""
        self._gone()
        return self.proc.wait(60)

    def tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


def wait_until(
    predicate: Callable[[], Any],
    what: str,
    timeout: float = 240,
    procs: Iterable[ShardProc] = (),
    running: Iterable[Running] = (),
) -> None:
    """Poll ``predicate`` until it holds; fail at once when one of ``procs`` exited or one of ``running`` failed."""
    procs, running = list(procs), list(running)
    deadline = time.monotonic() + timeout
    while True:
        for p in procs:
            if p.proc.poll() is not None:
                raise AssertionError(f"{p.shard} exited ({p.proc.returncode}) while waiting for {what}:\n{p.tail()}")
        for r in running:
            if r.error is not None:
                raise AssertionError(f"{r.runner.config.shard} failed while waiting for {what}") from r.error
        if predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout}s")
        time.sleep(0.3)


def stop_all(runners: Iterable[Running]) -> None:
    """Teardown: stop every in-process runner still running (a non-final stop), so the next test has the shared
    SparkSession to itself."""
    runners = [r for r in runners if r.thread.is_alive()]
    for r in runners:
        r.runner.request_drain("test teardown", final=False)
    for r in runners:
        r.thread.join(120)


def shard_paths(setup: Setup, shard: str) -> ShardPaths:
    return ShardPaths.of(setup.storage(), setup.task, shard)


def read_current(setup: Setup, f: Any) -> dict | None:
    """A file on MinIO that its runtime overwrites (``catch-up.json``, ``progress.json``) in one GET (None while it
    does not exist): pyarrow's S3 reads (a HEAD, then ranged GETs) can tear when the object is replaced meanwhile."""
    from testinfra.s3 import S3Error

    bucket, key = f.path.split("/", 1)
    try:
        return json.loads(setup.minio.client().get_object(bucket, key))
    except S3Error as e:
        if e.status == 404:
            return None
        raise


def catch_up_state(setup: Setup, shard: str) -> dict | None:
    """``shard``'s ``catch-up.json`` on MinIO (None while it has none)."""
    return read_current(setup, shard_paths(setup, shard).catch_up)


def phase(setup: Setup, shard: str) -> str | None:
    state = catch_up_state(setup, shard)
    return state["phase"] if state else None


def notes(setup: Setup, parent: str, kind: str) -> dict[str, dict]:
    """The ``kind`` notes (``request`` or ``ready``) in ``parent``'s ``handover/``, by successor (latest epoch)."""
    directory = shard_paths(setup, parent).handover_dir
    found: dict[str, tuple[int, dict]] = {}
    for f in directory.iterdir() if directory.exists() else []:
        parsed = parse_note_name(f.name)
        if (
            parsed is not None
            and parsed[0] == kind
            and (parsed[1] not in found or (parsed[2] or 0) >= found[parsed[1]][0])
        ):
            found[parsed[1]] = (parsed[2] or 0, f.read_json())
    return {child: note for child, (_, note) in found.items()}


def committed(setup: Setup, shard: str) -> list[int]:
    commits = shard_paths(setup, shard).checkpoint / "commits"
    return sorted(int(f.name) for f in commits.iterdir() if f.name.isdigit()) if commits.exists() else []


def batch_ends(setup: Setup, config: Any) -> dict[int, dict[int, int]]:
    """Every committed batch of ``config``'s shard: its Kafka end offsets ``{partition: offset}`` from the shard's
    offset log on MinIO (the restore's seed entry skipped), read as the runtime reads them."""
    source = make_source(config.source, config.partitions_to_read)
    checkpoint = shard_paths(setup, config.shard).checkpoint
    ends: dict[int, dict[int, int]] = {}
    for batch in committed(setup, config.shard):
        entries = [e for e in read_offsets(checkpoint, batch) if e is not None and source.owns_offset(e)]
        assert len(entries) == 1, f"{config.shard}: batch {batch} has Kafka offsets {entries}"
        ends[batch] = source.partition_offsets(entries[0])
    return ends


def emitted(output: list[Any], shard: str) -> dict[int, set[str]]:
    """The keys ``shard`` emitted per batch (every record in the output topic, replays included)."""
    out: dict[int, set[str]] = defaultdict(set)
    for r in output:
        if r.value["shard"] == shard:
            out[int(r.value["batch"])].add(r.key)
    return dict(out)


class Input:
    """The input topic read back: every valid record as ``(partition, offset, key text)`` (the record contract, as
    :class:`Reference` applies it)."""

    def __init__(self, setup: Setup) -> None:
        self.records = []
        for r in setup.broker.consume_all(setup.topic_in):
            v = r.value
            key = v.get("key") if isinstance(v, dict) else None
            if (type(key) is str or type(key) is int) and type(v.get("amount")) in (int, float):
                self.records.append((r.partition, r.offset, str(key)))

    def keys(
        self, config: Any, start: dict[int, int], end: dict[int, int], groups: tuple[int, int] | None = None
    ) -> set[str]:
        """The keys of ``config``'s key groups (or of ``groups``, ``[first, end)``) with a record in
        ``[start[p], end[p])`` of some partition ``p``."""
        grouping = config.key_grouping
        first, last = groups or (config.key_groups.start, config.key_groups.end)
        return {
            key
            for p, o, key in self.records
            if start.get(p, 0) <= o < end.get(p, 0) and first <= grouping.of(key, p) < last
        }


def offsets(setup: Setup, positions: dict[str, Any]) -> dict[int, int]:
    """Kafka positions ``{topic: {"p": offset}}`` as ``{p: offset}``."""
    assert set(positions) == {setup.topic_in}, positions
    return {int(p): int(o) for p, o in positions[setup.topic_in].items()}


def assert_parent_emitted_up_to_its_final_batch(
    setup: Setup, inp: Input, output: list[Any], config: Any, summary: dict
) -> None:
    """The parent emitted nothing in any batch after its final one (those start at its final positions: its
    successors'), and in each batch up to it exactly the keys of that batch's records (the batches its offset log
    still holds: Spark keeps the last ``minBatchesToRetain``)."""
    ends = batch_ends(setup, config)
    out = emitted(output, config.shard)
    final = summary["batchId"]
    assert max(ends) == final and ends[final] == offsets(setup, summary["positions"]), "F is the final batch's"
    past = sorted(b for b in out if b > final)
    assert not past, f"{config.shard} emitted batches {past} after its final batch {final}"
    if -1 not in ends and min(ends) == 0:
        ends[-1] = {}  # a fresh shard of a new topic starts at offset 0
    checked = [b for b in sorted(ends) if b - 1 in ends]
    assert final in checked, f"{config.shard}: its final batch's range is unknown ({sorted(ends)})"
    for batch in checked:
        want = inp.keys(config, ends[batch - 1], ends[batch])
        got = out.get(batch, set())
        assert got == want, f"{config.shard} batch {batch}: emitted {len(got)} keys, its records have {len(want)}"
    print(
        f"{config.shard}: pre-copy of batch {summary['snapshotBatchId']}, final batch {final}, checked {checked[0]}.."
    )


Finals = list[tuple[tuple[int, int], dict[int, int]]]
"""Per parent of a successor: its key groups ``(first, end)`` and its final positions ``{partition: offset}``."""


def assert_emits_only_past(setup: Setup, inp: Input, output: list[Any], config: Any, finals: Finals) -> list[int]:
    """A successor emitted, in each committed batch, exactly the keys of its records at or after ``final`` (its
    parents' final positions): nothing in its restore batch 0 or in a batch ending at or before ``final``, only the
    keys of the records past the fence in the batch that straddles it. Every emitted batch is committed, and the
    batch before its first emitting one is in the offset log (so every emitting batch's range is checked). Returns
    the batches that emitted."""
    ends = batch_ends(setup, config)
    out = emitted(output, config.shard)
    assert out, f"{config.shard} emitted nothing"
    assert 0 not in out, f"{config.shard}: its restore batch 0 emitted"
    batches = sorted(ends)
    assert batches == list(range(batches[0], batches[-1] + 1)), f"{config.shard}: committed batches {batches}"
    assert max(out) <= batches[-1], f"{config.shard}: uncommitted batches emitted: {sorted(set(out) - set(ends))}"
    assert min(out) - 1 in ends, f"{config.shard}: the batch before its first emitting one {min(out)} was purged"
    names = {p for _, f in finals for p in f}
    final = {p: min(f[p] for _, f in finals if p in f) for p in names}  # the lowest: where the cap held batch 0
    if 0 in ends:  # capped at the parents' committed positions: the restore batch ends at or before F
        assert all(o <= final.get(p, 0) for p, o in ends[0].items()), f"{config.shard}: batch 0 {ends[0]}, F {final}"
    for batch in batches[1:]:
        start, end = ends[batch - 1], ends[batch]
        want = set()
        for groups, own in finals:  # each record past its own parent's final position
            past = {p: max(start.get(p, 0), own.get(p, 0)) for p in end}
            want |= inp.keys(config, past, end, groups)
        got = out.get(batch, set())
        assert got == want, (
            f"{config.shard} batch {batch} [{start} -> {end}], final {final}: emitted {len(got)} keys, "
            f"{len(got - want)} of them without a record past the fence; {len(want - got)} keys missing"
        )
    straddling = [
        b
        for b in batches[1:]
        if any(ends[b - 1].get(p, 0) < o for p, o in final.items())
        and any(final.get(p, 0) < o for p, o in ends[b].items())
    ]
    print(f"{config.shard}: batches {batches[0]}..{batches[-1]}, first emitting {min(out)}, straddling F: {straddling}")
    return sorted(out)


def own_range(config: Any, final: dict[int, int]) -> Finals:
    """A split child's one parent: the child's own key groups, with the parent's final positions."""
    return [((config.key_groups.start, config.key_groups.end), final)]


def shard_config(
    setup: Setup, shard: str, start: int, end: int, restore: dict | None = None, *, jvm: bool = False, **over: Any
) -> Any:
    """A shard's config: batches of up to 2000 records (fewer batches to catch up); ``jvm``: for a subprocess
    runner (its driver JVM with the test bed's JIT options)."""
    conf = {**(integration_jvm_conf() if jvm else {}), "spark.taskshard.maxRecordsPerTrigger": "2000"}
    return setup.config(shard, start, end, restore, spark={"triggerInterval": "500 milliseconds", "conf": conf}, **over)


# ---------------------------------------------------------------- 1. a catch-up split, both read modes


@pytest.mark.parametrize("nested", [False, True], ids=["subscribe", "partitionedByKey"])
def test_a_split_catches_up_while_the_parent_runs_and_hands_over_exactly(nested, spark, kafka_broker, minio, tmp_path):
    """Subscribe mode: every shard reads the 3 partitions. ``partitionedByKey``: the parent reads both partitions,
    each child only its own (partition p holds key groups [8p, 8p + 8))."""
    setup, ref = Setup(kafka_broker, minio, tmp_path, partitions=2 if nested else 3), Reference()
    over = {"source": _nested_source(setup, 2)} if nested else {}
    first = make_events(900, random.Random(43))
    kafka_broker.produce(setup.topic_in, first)
    ref.add(first)
    parent = Running(shard_config(setup, PARENT, 0, 16, **over), spark)
    runners = [parent]
    producer = Producer(setup, ref, seed=44)
    try:
        parent.wait_for(lambda: parent.runner.last_committed >= 0, "a committed batch")
        producer.start()
        restore = {"parent": PARENT, "manifest": parent.runner.paths.drained.uri()}
        for n, a, b in ((LEFT, 0, 8), (RIGHT, 8, 16)):
            runners.append(Running(shard_config(setup, n, a, b, restore, **over), spark))
        children = runners[1:]
        if nested:
            assert [c.runner.source.read_partitions for c in children] == [[0], [1]]
        for child in children:
            assert child.runner.handover_mode == HandoverMode.CATCH_UP, "a Kafka child catches up"
        for child in children:
            child.wait_for(lambda c=child: catch_up_state(setup, c.runner.config.shard) is not None, "catch-up.json")
        requests = notes(setup, PARENT, "request")
        assert sorted(requests) == [LEFT, RIGHT] and {n["mode"] for n in requests.values()} == {"catch-up"}
        precopy = parent.runner.paths.precopy.read_json()
        for child in children:  # following: capped, the final positions unknown (nobody is ready yet)
            state = catch_up_state(setup, child.runner.config.shard)
            assert (state["parent"], state["manifest"], state["phase"]) == (PARENT, precopy["manifest"], "shadow")
            assert state["limit"] is not None and state["final"] is None, state

        # The parent keeps processing (and emitting) the input that keeps arriving, and drains by itself once both
        # children caught up; they take over.
        parent.wait_for(lambda: not parent.thread.is_alive(), "the parent's own final drain")
        summary = parent.summary
        assert summary is not None and summary["event"] == "drained" and summary["handover"] == "catch-up"
        assert summary["snapshotBatchId"] < summary["batchId"], "the parent kept committing past its pre-copy"
        assert sorted(s["shard"] for s in summary["successors"]) == [LEFT, RIGHT]
        for child in children:
            child.wait_for(lambda c=child: phase(setup, c.runner.config.shard) == "live", "the take-over (live)")
        assert producer.finish() > 0
        end = kafka_broker.end_offsets(setup.topic_in)
        assert sum(end.values()) > sum(offsets(setup, summary["positions"]).values()), "input past the fence"
        for child in children:
            child.wait_caught_up(_own(end, child) if nested else end)
        for child in children:  # both drain at once
            child.runner.request_drain("test", final=True)
        summaries = [child.finish() for child in children]
    finally:
        producer.finish()
        stop_all(runners)
    check_results(setup, ref)
    assert summary["deadLetters"] + sum(s["deadLetters"] for s in summaries) == ref.invalid, (
        "each invalid record counted by one shard"
    )

    # No record's result emitted by two shards: the parent up to F, each child from F on.
    final = offsets(setup, summary["positions"])
    inp, output = Input(setup), setup.output_records()
    assert_parent_emitted_up_to_its_final_batch(setup, inp, output, parent.runner.config, summary)
    for child in children:
        state = catch_up_state(setup, child.runner.config.shard)
        own = offsets(setup, state["final"])  # a nested child's: only its own partition's
        assert state["phase"] == "live" and state["ready"] and own == {p: final[p] for p in own}
        assert sorted(own) == (child.runner.source.read_partitions or sorted(final))
        assert_emits_only_past(setup, inp, output, child.runner.config, own_range(child.runner.config, final))


# ---------------------------------------------------------------- 2. a catch-up merge, both read modes


@pytest.mark.parametrize("nested", [True, False], ids=["partitionedByKey", "subscribe"])
def test_a_catch_up_merge_of_two_running_shards_is_exact(nested, spark, kafka_broker, minio, tmp_path):
    """``partitionedByKey``: each parent reads its own partition. Subscribe mode: both parents read both
    partitions and stop at different offsets of each; each record is emitted past its own parent's fence."""
    setup, ref = Setup(kafka_broker, minio, tmp_path, partitions=2), Reference()
    over = {"source": _nested_source(setup, 2)} if nested else {}  # nested: partition p holds [8p, 8p + 8)
    first = make_events(800, random.Random(47))
    kafka_broker.produce(setup.topic_in, first)
    ref.add(first)
    producer = Producer(setup, ref, seed=48)
    name = "kt-0-16-m1"
    runners: list[Running] = []
    try:
        # One after the other: two Kafka queries starting at once in one SparkSession have failed their first batch
        # (a task that did not deserialize, java.io.OptionalDataException) and were restarted in-process.
        for n, a, b in ((LEFT, 0, 8), (RIGHT, 8, 16)):
            runners.append(Running(shard_config(setup, n, a, b, **over), spark))
            runners[-1].wait_for(lambda p=runners[-1]: p.runner.last_committed >= 0, "a committed batch")
        left, right = runners
        want_read = ([0], [1]) if nested else (None, None)
        assert (left.runner.source.read_partitions, right.runner.source.read_partitions) == want_read
        producer.start()
        config = shard_config(setup, name, 0, 16, mergeFrom=merge_from(setup, left, right), **over)
        merged = Running(config, spark)
        runners.append(merged)
        assert merged.runner.handover_mode == HandoverMode.CATCH_UP, "a Kafka merge catches up"
        merged.wait_for(lambda: catch_up_state(setup, name) is not None, "catch-up.json")
        state = catch_up_state(setup, name)
        assert state["kind"] == "merge" and state["parents"] == [LEFT, RIGHT], state
        for parent in (LEFT, RIGHT):
            request = notes(setup, parent, "request")
            assert list(request) == [name] and request[name]["mode"] == "catch-up", request
        for parent in (left, right):
            parent.wait_for(lambda p=parent: not p.thread.is_alive(), "the parent's own final drain")
        merged.wait_for(lambda: phase(setup, name) == "live", "the take-over (live)")
        producer.finish()
        end = kafka_broker.end_offsets(setup.topic_in)
        merged.wait_caught_up(end)
        merged.finish()
    finally:
        producer.finish()
        stop_all(runners)
    summaries = [left.summary, right.summary]
    for summary in summaries:
        assert summary is not None and summary["event"] == "drained" and summary["handover"] == "catch-up"
        assert summary["successors"] == [{"shard": name, "keyGroups": {"start": 0, "end": 16}}]
        assert summary["snapshotBatchId"] < summary["batchId"], "each parent kept committing past its pre-copy"
    check_results(setup, ref)

    state = catch_up_state(setup, name)
    assert state["kind"] == "merge" and state["phase"] == "live"
    assert state["finals"] == [summaries[0]["positions"], summaries[1]["positions"]]
    finals = [offsets(setup, s["positions"]) for s in summaries]
    if nested:
        assert [sorted(f) for f in finals] == [[0], [1]], "each parent's final position of its own partition"
    else:
        assert [sorted(f) for f in finals] == [[0, 1], [0, 1]], "both parents read both partitions"
    inp, output = Input(setup), setup.output_records()
    for parent, summary in zip((left, right), summaries, strict=True):
        assert_parent_emitted_up_to_its_final_batch(setup, inp, output, parent.runner.config, summary)
    assert_emits_only_past(setup, inp, output, merged.runner.config, list(zip(((0, 8), (8, 16)), finals, strict=True)))


# ---------------------------------------------------------------- 3. SIGKILLs during a catch-up split


def test_a_catch_up_split_stays_exact_when_parent_and_children_are_killed(
    spark, spark_jars, kafka_broker, minio, tmp_path
):
    """The runtimes that get killed run as subprocesses (SIGKILL of the process group, JVM included); their restarts
    run in this process:

    1. the parent is SIGKILLed while its children catch up (right after it answered them with its pre-copy: no
       child can be ready yet, so it cannot have drained); neither its drain summary nor any child output exists;
    2. the right child is SIGKILLed while catching up (its restore batch committed); restarted, it resumes its
       catch-up from its recovery log (same pre-copy, no second restore);
    3. the parent restarts, resumes from its recovery log and hands over once (one ``drained.json``, by its second
       writer epoch); the children go live;
    4. the left child is SIGKILLed right after it took over (its first emitting batch committed); restarted, it
       continues from its recovery log.
    """
    setup, ref = Setup(kafka_broker, minio, tmp_path, partitions=2), Reference()
    first = make_events(900, random.Random(53))
    kafka_broker.produce(setup.topic_in, first)
    ref.add(first)
    restore = {"parent": PARENT, "manifest": shard_paths(setup, PARENT).drained.uri()}
    parent_cfg = shard_config(setup, PARENT, 0, 16, jvm=True)
    left_cfg = shard_config(setup, LEFT, 0, 8, restore, jvm=True)
    right_cfg = shard_config(setup, RIGHT, 8, 16, restore, jvm=True)
    procs: list[ShardProc] = []
    threads: list[Running] = []

    def run(config: Any) -> ShardProc:
        procs.append(ShardProc(config, tmp_path, spark_jars))
        return procs[-1]

    def run_here(config: Any) -> Running:
        threads.append(Running(config, spark))
        return threads[-1]

    def output_of(shard: str) -> list[Any]:
        return [r for r in setup.output_records() if r.value["shard"] == shard]

    producer = Producer(setup, ref, seed=54)
    try:
        parent = run(parent_cfg)
        progress = shard_paths(setup, PARENT).progress
        wait_until(
            lambda: (read_current(setup, progress) or {}).get("batchId", -1) >= 0, "a parent batch", procs=[parent]
        )
        producer.start()
        left, right = run(left_cfg), run(right_cfg)

        # 1. Both children got the pre-copy and catch up: kill the parent.
        wait_until(
            lambda: phase(setup, LEFT) == phase(setup, RIGHT) == "shadow",
            "both children catching up",
            procs=[parent, left, right],
        )
        assert parent.kill() != 0
        assert not shard_paths(setup, PARENT).drained.exists(), "killed before its hand-over"
        requests = notes(setup, PARENT, "request")
        assert sorted(requests) == [LEFT, RIGHT] and {n["mode"] for n in requests.values()} == {"catch-up"}
        precopy = shard_paths(setup, PARENT).precopy.read_json()
        assert precopy["batchId"] >= 0, "a pre-copy of a committed batch"
        states = {shard: catch_up_state(setup, shard) for shard in (LEFT, RIGHT)}
        assert all(s["manifest"] == precopy["manifest"] and s["parent"] == PARENT for s in states.values()), states

        # 2. The right child restored the pre-copy and follows (its parent's last committed positions): kill it.
        wait_until(lambda: 0 in committed(setup, RIGHT), "the right child's restore batch", procs=[left, right])
        assert right.kill() != 0
        assert phase(setup, RIGHT) == "shadow", "killed catching up"
        assert not output_of(LEFT) and not output_of(RIGHT), "nothing emitted while catching up"
        right_again = run_here(right_cfg)

        # 3. The parent restarts and hands over once; both children take over.
        parent_again = run_here(parent_cfg)
        wait_until(lambda: not parent_again.thread.is_alive(), "the parent's drain", procs=[left], running=threads)
        summary = parent_again.summary
        assert summary is not None and summary["event"] == "drained" and summary["handover"] == "catch-up"
        assert summary["writerEpoch"] == 2, "drained by the restarted runtime"
        assert summary["snapshotBatchId"] == precopy["batchId"] < summary["batchId"], "it kept committing"
        assert sorted(s["shard"] for s in summary["successors"]) == [LEFT, RIGHT]
        assert shard_paths(setup, PARENT).drained.read_json() == summary, "one drain summary"
        right_again.wait_for(lambda: phase(setup, RIGHT) == "live", "the right child's take-over")
        assert right_again.runner.progress.batches_from is not None and right_again.runner.progress.batches_from >= 0, (
            "the restarted right child resumed from its recovery log (no second restore)"
        )
        resumed = catch_up_state(setup, RIGHT)
        assert resumed["writer_epoch"] == 2 and resumed["manifest"] == precopy["manifest"], "resumed its catch-up"

        # 4. The left child is killed right after it took over (its first emitting batch committed).
        def took_over() -> bool:
            out = output_of(LEFT)
            return bool(out) and min(r.value["batch"] for r in out) in committed(setup, LEFT)

        wait_until(took_over, "the left child's first emitting batch", procs=[left], running=[right_again])
        assert left.kill() != 0
        killed_at = max(committed(setup, LEFT))
        producer.finish()
        last = make_events(300, random.Random(55))  # more input for the restarted left child
        kafka_broker.produce(setup.topic_in, last)
        ref.add(last)
        end = kafka_broker.end_offsets(setup.topic_in)
        left_again = run_here(left_cfg)
        for child in (left_again, right_again):
            child.wait_caught_up(end)
        assert max(committed(setup, LEFT)) > killed_at, "the restarted left child continued"
        for child in (left_again, right_again):
            child.runner.request_drain("test", final=False)
        for child in (left_again, right_again):
            assert child.finish(final=False)["event"] == "stopped"
        check_results(setup, ref)

        final = offsets(setup, summary["positions"])
        inp, output = Input(setup), setup.output_records()
        assert_parent_emitted_up_to_its_final_batch(setup, inp, output, parent_cfg, summary)
        for config in (left_cfg, right_cfg):
            state = catch_up_state(setup, config.shard)
            assert state["phase"] == "live" and offsets(setup, state["final"]) == final
            assert_emits_only_past(setup, inp, output, config, own_range(config, final))
    finally:
        producer.finish()
        for proc in procs:
            proc.kill()
        stop_all(threads)
