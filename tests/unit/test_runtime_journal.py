"""The journal reader without a JVM: line-aligned positions, byte limits, the drain freeze, pieces, dead-letter
ownership and file names, Arrow output; and the producer that feeds it."""

from __future__ import annotations

import io
import json

import pytest

pytest.importorskip("pyspark")  # the reader subclasses pyspark's DataSourceStreamReader (no JVM needed)

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes  # noqa: E402

from spark_runtime.keygroups import key_group  # noqa: E402
from spark_runtime.produce import append_events, append_lines, generate_events, main, partition_for  # noqa: E402
from spark_runtime.records import RecordSpec  # noqa: E402
from spark_runtime.sources.journal import (  # noqa: E402
    JournalSource,
    JournalStreamReader,
    capped_end,
    complete_end,
    plan_pieces,
)

pytestmark = pytest.mark.unit


def test_complete_end_ignores_a_partial_last_line():
    data = b'{"a":1}\n{"b":2}\n{"c":'
    fh = io.BytesIO(data)
    assert complete_end(fh, 0, len(data)) == 16
    assert complete_end(fh, 16, len(data)) == 16  # nothing complete after 16
    assert complete_end(io.BytesIO(b"x" * 200_000 + b"\n"), 0, 200_001) == 200_001  # scans back over blocks


def test_capped_end_and_pieces_are_line_aligned():
    lines = [b"x" * n + b"\n" for n in (5, 50, 3, 200, 7, 9)]
    data = b"".join(lines)
    fh = io.BytesIO(data)
    assert capped_end(fh, 0, len(data), 60) == 6 + 51  # the last line end within 60 bytes
    assert capped_end(fh, 61, len(data), 10) == 61 + 201  # a long first line still progresses
    pieces = plan_pieces(fh, 0, len(data), 64)
    assert pieces[0][0] == 0 and pieces[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:], strict=False))
    assert all(e == len(data) or data[e - 1 : e] == b"\n" for _, e in pieces)


@pytest.fixture
def make_reader(tmp_path):
    def make(partitions=2, start=0, end=16, fields=None, **options):
        opts = {
            "path": str(tmp_path / "journal"),
            "partitions": str(partitions),
            "recordspec": RecordSpec.build("key", fields or {}).to_json(),
            "shard": f"t-{start}-{end}",
            "maxkeygroups": "16",
            "rangestart": str(start),
            "rangeend": str(end),
            "deadletterdir": str(tmp_path / f"dl-{start}-{end}"),
            "drainmarker": str(tmp_path / "drain-requested"),
            **{k.lower(): v for k, v in options.items()},
        }
        return JournalStreamReader(opts)

    return make


def read_all(reader, start, end):
    rows = []
    for piece in reader.partitions(start, end):
        for batch in reader.read(piece):
            rows.extend(batch.to_pylist())
    return rows


def test_offsets_reads_and_resume(tmp_path, make_reader):
    journal = tmp_path / "journal"
    append_lines(journal, 0, ['{"key": "a"}', '{"key": 7}'])
    append_lines(journal, 1, ['{"key": "b"}'])
    with open(journal / "p1.jsonl", "ab") as fh:
        fh.write(b'{"key": "partial')
    r = make_reader()
    start = r.initialOffset()
    assert start == {"p0.jsonl": 0, "p1.jsonl": 0}
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == {"p0.jsonl": 24, "p1.jsonl": 13}
    rows = read_all(r, start, end)
    assert sorted((x["key"], x["partition"], x["offset"]) for x in rows) == [("7", 0, 13), ("a", 0, 0), ("b", 1, 0)]
    # Resuming from the end reads only new lines; the partial line completes.
    with open(journal / "p1.jsonl", "ab") as fh:
        fh.write(b'"}\n')
    end2 = r.latestOffset(end, ReadAllAvailable())
    assert [x["key"] for x in read_all(r, end, end2)] == ["partial"]


def test_start_positions_and_drain_marker_freeze(tmp_path, make_reader):
    journal = tmp_path / "journal"
    append_lines(journal, 0, ['{"key": "a"}'] * 3)
    r = make_reader(startpositions=json.dumps({"p0.jsonl": 13, "p1.jsonl": 0}))
    start = r.initialOffset()
    assert start == {"p0.jsonl": 13, "p1.jsonl": 0}
    (tmp_path / "drain-requested").write_text("now")
    assert r.latestOffset(start, ReadAllAvailable()) == start, "draining: no new data admitted"


def test_max_bytes_limit_splits_batches(tmp_path, make_reader):
    journal = tmp_path / "journal"
    append_lines(journal, 0, [json.dumps({"key": f"k{i}"}) for i in range(100)])
    r = make_reader(partitions=1, maxbytespertrigger="200")
    assert isinstance(r.getDefaultReadLimit(), ReadMaxBytes)
    pos, seen = r.initialOffset(), []
    while True:
        end = r.latestOffset(pos, r.getDefaultReadLimit())
        if end == pos:
            break
        assert 0 < end["p0.jsonl"] - pos["p0.jsonl"] <= 200
        seen += [x["key"] for x in read_all(r, pos, end)]
        pos = end
    assert seen == [f"k{i}" for i in range(100)]


def test_truncated_journal_is_an_error(tmp_path, make_reader):
    journal = tmp_path / "journal"
    append_lines(journal, 0, ['{"key": "a"}'])
    r = make_reader(partitions=1)
    with pytest.raises(RuntimeError, match="append-only"):
        r.latestOffset({"p0.jsonl": 999}, ReadAllAvailable())


def test_dead_letters_are_written_once_by_their_owner(tmp_path, make_reader):
    journal = tmp_path / "journal"
    bad_keyed = '{"key": "k1", "amount": "x"}'
    append_lines(journal, 0, ['{"key": "ok", "amount": 1}', "{bad", bad_keyed])
    owner_of_keyless = key_group(None, 16)
    owner_of_k1 = key_group("k1", 16)
    readers = [make_reader(partitions=1, start=a, end=b, fields={"amount": "double"}) for a, b in [(0, 8), (8, 16)]]
    for r in readers:
        start = r.initialOffset()
        end = r.latestOffset(start, ReadAllAvailable())
        read_all(r, start, end)
        read_all(r, start, end)  # a replayed piece rewrites the same file
    written = {}
    for (a, b), r in zip([(0, 8), (8, 16)], readers, strict=True):
        files = sorted(r.dead_letter_dir.glob("*.jsonl")) if r.dead_letter_dir.exists() else []
        for f in files:
            assert f.name == f"p0-0-{(journal / 'p0.jsonl').stat().st_size}.jsonl"
            for rec in map(json.loads, f.read_text().splitlines()):
                assert a <= rec["key_group"] < b
                written[rec["reason"]] = (a, b)
    assert set(written) == {"malformed_json", "bad_field_type"}
    assert written["malformed_json"][0] <= owner_of_keyless < written["malformed_json"][1]
    assert written["bad_field_type"][0] <= owner_of_k1 < written["bad_field_type"][1]


def test_journal_source_positions_checks(tmp_path):
    src = JournalSource(tmp_path, 2)
    assert src.owns_offset({"p0.jsonl": 1, "p1.jsonl": 2})
    assert not src.owns_offset({"seed": 1})
    src.validate_positions({"p0.jsonl": 0, "p1.jsonl": 5})
    with pytest.raises(ValueError, match="partitions"):
        src.validate_positions({"p0.jsonl": 0})
    with pytest.raises(ValueError, match="non-negative"):
        src.validate_positions({"p0.jsonl": -1, "p1.jsonl": 0})


def test_producer_partitions_by_key_and_appends_whole_lines(tmp_path):
    counts = append_events(tmp_path, 3, list(generate_events(300, 20, seed=1)))
    assert sum(counts.values()) == 300
    for p in range(3):
        for line in (tmp_path / f"p{p}.jsonl").read_text().splitlines():
            assert partition_for(json.loads(line)["key"], 3) == p
    assert list(generate_events(5, 3, seed=2)) == list(generate_events(5, 3, seed=2))
    assert partition_for(None, 4) == 0 and partition_for("x", 1) == 0


def test_producer_cli(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text('{"key": "a"}\n\n{"key": "b", "n": 1}\n')
    assert main(["--journal", str(tmp_path / "j"), "--partitions", "2", "--file", str(src)]) == 0
    assert json.loads(capsys.readouterr().out)["events"] == 2
    assert main(["--journal", str(tmp_path / "g"), "--generate", "50", "--keys", "5"]) == 0
    assert len((tmp_path / "g" / "p0.jsonl").read_text().splitlines()) == 50
    bad = tmp_path / "bad.jsonl"
    bad.write_text("[1]\n")
    assert main(["--journal", str(tmp_path / "j"), "--file", str(bad)]) == 2


def test_too_large_lines_and_keys_are_dead_letters_and_a_huge_line_is_never_read_whole(tmp_path, make_reader):
    """A line over MAX_RECORD_BYTES (in a piece of its own when longer than the piece size, or among others) and a
    key over MAX_KEY_BYTES are dead letters ``too_large``; the records around them are read; the reader never
    holds the huge line (it reads the piece from past it)."""
    from spark_runtime.records import MAX_KEY_BYTES, MAX_RECORD_BYTES

    journal = tmp_path / "journal"
    huge = json.dumps({"key": "h", "pad": "x" * (3 * MAX_RECORD_BYTES)})
    big = json.dumps({"key": "b", "pad": "y" * (MAX_RECORD_BYTES + 10)})
    long_key = json.dumps({"key": "k" * (MAX_KEY_BYTES + 1)})
    append_lines(journal, 0, ['{"key": "a"}', huge, '{"key": "c"}', big, long_key, '{"key": "d"}'])
    reads: list[int] = []
    real_open = open

    class Counting:
        def __init__(self, fh):
            self.fh = fh

        def __getattr__(self, name):
            return getattr(self.fh, name)

        def read(self, n=-1):
            reads.append(n)
            return self.fh.read(n)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

    import builtins

    r = make_reader(partitions=1, partitionbytes=str(2 * MAX_RECORD_BYTES))
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    builtins.open, saved = (lambda *a, **k: Counting(real_open(*a, **k))), builtins.open
    try:
        rows = read_all(r, start, end)
    finally:
        builtins.open = saved
    assert sorted(x["key"] for x in rows) == ["a", "c", "d"]
    assert max(n for n in reads if n is not None) < 3 * MAX_RECORD_BYTES, "the huge line was read whole"
    dead = [json.loads(line) for f in sorted(r.dead_letter_dir.glob("*.jsonl")) for line in f.read_text().splitlines()]
    assert sorted(d["reason"] for d in dead) == ["too_large"] * 3
    details = sorted(d["detail"] for d in dead)
    assert any(d.startswith(f"line of {len(huge):,} bytes is longer than") for d in details), details
    assert any(d.startswith(f"line of {len(big):,} bytes") for d in details), details
    assert any(d.startswith(f"key of {MAX_KEY_BYTES + 1:,} bytes") for d in details), details
    assert all(len(d["line"]) < 20_000 for d in dead)


def test_a_catch_up_child_holds_records_before_the_final_positions_and_cuts_pieces_there(tmp_path, make_reader):
    from spark_runtime.protocol import HELD_COLUMN, CatchUpPhase, CatchUpState

    journal = tmp_path / "journal"
    lines = [json.dumps({"key": f"k{i}"}) for i in range(6)]
    append_lines(journal, 0, lines[:3] + ["{bad json"] + lines[3:] + ["{also bad"])
    data = (journal / "p0.jsonl").read_bytes()
    fence = data.index(b'{"key": "k3"}')  # F: a line start after the first dead letter
    state_file = tmp_path / "catch-up.json"
    r = make_reader(partitions=1, catchupstate=str(state_file), partitionbytes="1000000")
    assert (HELD_COLUMN, "boolean") in r.columns()

    state_file.write_text(json.dumps(CatchUpState("p", "/m", CatchUpPhase.SHADOW, limit={"p0.jsonl": fence}).to_json()))
    start = r.initialOffset()
    assert r.latestOffset(start, ReadAllAvailable()) == {"p0.jsonl": fence}, "capped at the parent's positions"
    rows = read_all(r, start, {"p0.jsonl": len(data)})
    assert rows and all(x[HELD_COLUMN] for x in rows), "final positions unknown: every record is held"
    assert not list((tmp_path / "dl-0-16").glob("*.jsonl")), "and no dead letter written"

    final = CatchUpState("p", "/m", CatchUpPhase.FINAL, final={"p0.jsonl": fence})
    state_file.write_text(json.dumps(final.to_json()))
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == {"p0.jsonl": len(data)}, "FINAL reads past the fence"
    pieces = r.partitions(start, end)
    assert [(p.start, p.end, p.held) for p in pieces] == [(0, fence, True), (fence, len(data), False)]
    rows = read_all(r, start, end)
    assert {x["key"]: x[HELD_COLUMN] for x in rows} == {f"k{i}": i < 3 for i in range(6)}
    letters = [json.loads(line) for f in (tmp_path / "dl-0-16").glob("*.jsonl") for line in f.read_text().splitlines()]
    assert [d["offset"] for d in letters] == [data.index(b"{also bad")], "only the dead letter past the fence"
