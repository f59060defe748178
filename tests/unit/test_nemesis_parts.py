"""The nemesis's two pure halves: the seeded schedule (the same seed gives the same life; steps adapt to the shards
they find; a printed schedule replays) and the consumer-side verifier (it finds a lost key, a count published
twice and a count above the input, and ignores hidden paths)."""

from __future__ import annotations

import json

import pytest

from tests.nemesis.schedule import KINDS, MAX_SHARDS, Step, generate, parse, render
from tests.nemesis.verifier import verify

pytestmark = pytest.mark.unit

ONE = [("t-0-16", 0, 16)]
TWO = [("t-0-4", 0, 4), ("t-4-16", 4, 16)]


def test_a_seed_is_a_schedule_and_a_printed_schedule_replays():
    assert generate(6, 30) == generate(6, 30)
    assert generate(6, 30) != generate(7, 30)
    steps = generate(6, 200)
    assert {s.kind for s in steps} == set(KINDS), "a long run draws every kind"
    assert sum(s.kind == "prune" for s in steps) == 1
    assert parse(render(steps)) == steps
    with pytest.raises(ValueError, match="'explode' is not a nemesis step kind"):
        parse("split:0.1:0.2,explode:0.3:0.4")


def test_a_step_resolves_against_the_shards_it_finds():
    assert Step("split", 0.9, 0.1).resolve(ONE) == "split t-0-16 at 1", "an edge: the first key group"
    assert Step("split", 0.9, 0.9).resolve(TWO) == "split t-4-16 at 15", "an edge: the last key group"
    assert Step("split", 0.0, 0.5).resolve(TWO) == "split t-0-4 at 2"
    assert Step("merge", 0.99, 0.5).resolve(TWO) == "merge t-0-4 with t-4-16", "the last merges with its left"
    assert Step("merge", 0.5, 0.5).resolve(ONE) == "split t-0-16 at 8", "one shard: a split instead"
    many = [(f"t-{i}-{i + 1}", i, i + 1) for i in range(MAX_SHARDS)]
    assert Step("split", 0.1, 0.5).resolve(many) == "merge t-0-1 with t-1-2", "at the cap: a merge instead"
    assert Step("split-kill", 0.0, 0.5).resolve([("t-0-1", 0, 1)]) == "kill t-0-1", "one key group, one shard"
    assert Step("scale", 0.2, 0.5).resolve(TWO) == "scale to 1" and Step("scale", 0.7, 0.5).resolve(TWO) == "scale to 3"
    assert Step("scale", 0.2, 0.5).resolve(ONE) == "scale to 2", "one shard scales up"
    assert Step("scale", 0.9, 0.5).resolve(many) == f"scale to {MAX_SHARDS - 1}", "at the cap: down"
    assert Step("pause", 0.9, 0.1).resolve(TWO) == "pause t-4-16 at 5", "a pause splits the shard it froze"
    assert Step("pause", 0.1, 0.5).resolve(many) == "merge t-0-1 with t-1-2", "at the cap: a merge instead"
    assert Step("roll", 0.5, 0.5).resolve(TWO) == "roll"


def write(path, lines) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_the_verifier_reads_like_a_consumer_and_finds_lost_and_doubled_keys(tmp_path):
    journal, sink = tmp_path / "journal", tmp_path / "out"
    write(journal / "p0.jsonl", [{"key": "a"}, {"key": "a"}, {"key": "b"}])
    write(journal / "p1.jsonl", [{"key": "a"}])
    write(sink / "shard=t-0-16" / "batch-0.jsonl", [{"key": "a", "result": 2}, {"key": "b", "result": 1}])
    write(sink / "shard=t-0-8" / "batch-3.jsonl", [{"key": "a", "result": 3}])
    write(sink / "shard=t-0-8" / "_pending" / "4" / "batch-4.jsonl", [{"key": "a", "result": 3}])  # hidden
    verdict = verify(journal, sink)
    assert verdict.exact and (verdict.expected_records, verdict.published_records) == (4, 3), verdict.summary()

    write(sink / "shard=t-8-16" / "batch-1.jsonl", [{"key": "a", "result": 3}])  # two owners emitted one count
    assert verify(journal, sink).doubled == {"a": [3]}
    (sink / "shard=t-8-16" / "batch-1.jsonl").unlink()
    write(journal / "p1.jsonl", [{"key": "a"}, {"key": "a"}, {"key": "c"}])
    lost = verify(journal, sink)
    assert lost.lost == {"a": (4, 3), "c": (1, 0)} and not lost.doubled, lost.summary()
    write(sink / "shard=t-0-8" / "batch-5.jsonl", [{"key": "a", "result": 5}, {"key": "z", "result": 1}])
    over = verify(journal, sink)
    assert over.doubled == {"a": [5]} and over.unknown == ["z"], over.summary()


def test_the_verifier_wants_each_malformed_line_as_one_dead_letter(tmp_path):
    journal, sink = tmp_path / "journal", tmp_path / "out"
    good = json.dumps({"key": "a"}) + "\n"
    (journal).mkdir()
    (journal / "p0.jsonl").write_text(good + "{broken\n" + good + '{"key": null}\n' + '{"key": "a"')  # last: unfinished
    write(sink / "shard=t-0-16" / "batch-0.jsonl", [{"key": "a", "result": 2}])
    verdict = verify(journal, sink)
    at = [(0, len(good)), (0, 2 * len(good) + len("{broken\n"))]
    assert verdict.malformed == 2 and verdict.letters_missing == at and not verdict.broken, verdict.summary()
    letters = sink / "_dead_letters"
    write(letters / "shard=t-0-8" / f"p0-0-{at[1][1]}.jsonl", [{"partition": 0, "offset": at[0][1]}])
    write(letters / "shard=t-8-16" / "p0-40-60.jsonl", [{"partition": 0, "offset": at[1][1]}])
    write(letters / "shard=t-8-16" / "late-b3.jsonl", [{"key": "a"}])  # late records are not the source's
    assert verify(journal, sink).exact
    write(letters / "shard=t-0-16" / "p0-0-20.jsonl", [{"partition": 0, "offset": at[0][1]}])  # a parent's, again
    twice = verify(journal, sink)
    assert twice.broken and twice.letters_repeated == [at[0]], twice.summary()
