"""Load- and state-aware split points: the pure chooser over a load (or state) map, the load window the operator
keeps from its scrapes, and the split decision with ``spec.split.by: load`` or ``by: state`` (the point and the
expected shares in status.split, or a refusal that says what is missing)."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from spark_runtime.keygroups import KeyGroupRange, key_group
from spark_runtime.live import LiveStats, key_group_buckets
from taskshard_operator import status as st
from taskshard_operator.live import LiveStore, LoadHistory, Scraped, parse_scrape
from taskshard_operator.models.shard import ShardPhase, SplitBy, TaskShardSpec
from taskshard_operator.planner import SplitAccepted, SplitRefused, plan_split
from taskshard_operator.split_points import imbalance, load_split_point

from .fake_observed import PARENT, World, condition, decide
from .test_operator_live import SCRAPE, _running_shard

pytestmark = pytest.mark.unit

R16 = KeyGroupRange(0, 16)


def per_key_group(rows: list[float], start: int = 0) -> dict[tuple[int, int], float]:
    return {(start + i, start + i + 1): n for i, n in enumerate(rows)}


def test_an_even_load_splits_at_the_midpoint():
    point = load_split_point(R16, per_key_group([10.0] * 16))
    assert point is not None and point.at == 8 and point.shares == (0.5, 0.5) and point.rows == 160


def test_a_skewed_load_moves_the_point_to_where_the_rows_divide_in_half():
    rows = [100.0, 100.0] + [10.0] * 14  # 340 rows, two hot key groups at the low end
    point = load_split_point(R16, per_key_group(rows))
    assert point is not None and point.at == 2, point
    assert point.shares == pytest.approx((200 / 340, 140 / 340))
    midpoint_low = sum(rows[:8])
    assert imbalance(*point.shares) < imbalance(midpoint_low, 340 - midpoint_low)


def test_a_hot_key_group_cannot_be_divided_and_ties_go_to_the_midpoint():
    point = load_split_point(R16, per_key_group([0.0] * 4 + [1000.0] + [0.0] * 11))
    assert point is not None and max(point.shares) == 1.0, "one side gets it all, whatever the point"
    assert point.at == 8, "every point is as good: the midpoint"
    tie = load_split_point(KeyGroupRange(0, 4), per_key_group([1.0, 0.0, 0.0, 1.0]))
    assert tie is not None and tie.at == 2, "equal candidates 1, 2, 3: the one nearest the midpoint"


def test_wide_buckets_are_spread_evenly_over_their_key_groups():
    r = KeyGroupRange(0, 128)
    buckets = {b: 0.0 for b in key_group_buckets(0, 128)}
    buckets[(0, 2)] = 300.0  # two key groups, 150 each
    buckets[(126, 128)] = 300.0
    point = load_split_point(r, buckets)
    assert point is not None and point.shares == (0.5, 0.5) and 2 <= point.at <= 126


def test_no_rows_or_one_key_group_has_no_load_point():
    assert load_split_point(R16, {}) is None
    assert load_split_point(R16, per_key_group([0.0] * 16)) is None
    assert load_split_point(KeyGroupRange(3, 4), {(3, 4): 10.0}) is None
    assert load_split_point(KeyGroupRange(8, 16), per_key_group([5.0] * 8)) is None, "rows of another range"


def test_on_zipf_keys_the_load_point_beats_the_midpoint():
    rng = random.Random(7)
    weights = [1 / (k + 1) ** 1.1 for k in range(2000)]
    keys = rng.choices([f"k{k}" for k in range(2000)], weights=weights, k=50_000)
    rows = [0.0] * 128
    for key in keys:
        rows[key_group(key, 128)] += 1
    r = KeyGroupRange(0, 128)
    point = load_split_point(r, per_key_group(rows))
    assert point is not None
    low = sum(rows[: point.at])
    mid = sum(rows[:64])
    assert imbalance(low, len(keys) - low) <= imbalance(mid, len(keys) - mid)
    assert point.shares[0] == pytest.approx(low / len(keys))


def test_imbalance():
    assert imbalance(50, 50) == 0 and imbalance(0, 10) == 1 and imbalance(0, 0) == 0
    assert imbalance(45, 55) == pytest.approx(10 / 55)


# ---------------------------------------------------------------- the window the operator keeps


def test_the_load_window_is_the_growth_since_its_oldest_sample():
    history = LoadHistory(window=300)
    load, seconds = history.add(0.0, "ip-1", {"0-8": 100.0, "8-16": 50.0})
    assert load == {(0, 8): 100.0, (8, 16): 50.0} and seconds == 0.0, "one scrape: everything since the start"
    load, seconds = history.add(100.0, "ip-1", {"0-8": 200.0, "8-16": 60.0})
    assert load == {(0, 8): 200.0, (8, 16): 60.0} and seconds == 0.0, (
        "the pod's first scrape is younger than the window: its rows before that scrape count too"
    )
    load, seconds = history.add(400.0, "ip-1", {"0-8": 500.0, "8-16": 70.0})
    assert load == {(0, 8): 300.0, (8, 16): 10.0} and seconds == 300.0, "since the sample at the window's start"
    idle = LoadHistory(window=300)
    idle.add(0.0, "ip-1", {"0-8": 100.0})  # the pod's first scrape came after it had processed its input
    assert idle.add(2.0, "ip-1", {"0-8": 100.0}) == ({(0, 8): 100.0}, 0.0), "not 'no rows in the last 2 s'"
    load, seconds = history.add(401.0, "ip-2", {"0-8": 5.0})
    assert load == {(0, 8): 5.0} and seconds == 0.0, "a new pod's counters start over"


def test_the_store_keeps_the_window_only_for_shards_with_a_load_map():
    store = LiveStore(load_window=60)
    stats = LiveStats(1, None, 0.0, None, None, None, 0, True, key_group_rows={"0-8": 10.0})
    store.put("ns", "s", Scraped(stats, "t", "ip"), now=0.0)
    store.put("ns", "s", Scraped(LiveStats(2, None, 0.0, None, None, None, 0, True, {"0-8": 25.0}), "t", "ip"), now=30)
    scraped = store.get("ns", "s")
    assert scraped is not None and scraped.load == {(0, 8): 25.0} and scraped.load_seconds == 0, "since it started"
    store.put("ns", "s", Scraped(LiveStats(3, None, 0.0, None, None, None, 0, True, {"0-8": 40.0}), "t", "ip"), now=90)
    scraped = store.get("ns", "s")
    assert scraped is not None and scraped.load == {(0, 8): 15.0} and scraped.load_seconds == 60, "the last minute"
    store.put("ns", "s", Scraped(LiveStats(4, None, 0.0, None, None, None, 0, True), "t", "ip"), now=100)
    assert store.get("ns", "s").load == {}


def test_a_scrape_with_a_load_map_parses_its_buckets():
    text = SCRAPE + (
        "# TYPE taskshard_shard_key_group_rows_total counter\n"
        'taskshard_shard_key_group_rows_total{key_groups="0-8",shard="t-0-16",task="t"} 700.0\n'
        'taskshard_shard_key_group_rows_total{key_groups="8-16",shard="t-0-16",task="t"} 500.0\n'
    )
    stats = parse_scrape(text)
    assert stats is not None and stats.key_group_rows == {"0-8": 700.0, "8-16": 500.0}
    assert parse_scrape(SCRAPE).key_group_rows == {}


# ---------------------------------------------------------------- the decision


def plan(split, load=None, seconds=0.0):
    return plan_split(
        shard=PARENT, key_groups=R16, phase=ShardPhase.RUNNING, split=split, load=load, load_seconds=seconds
    )


def test_by_load_accepts_the_load_point_with_its_shares():
    decision = plan({"requested": True, "by": "load"}, per_key_group([100.0, 100.0] + [10.0] * 14), 300)
    assert isinstance(decision, SplitAccepted) and decision.at == 2 and decision.load is not None
    assert plan({"requested": True}, per_key_group([100.0] * 2 + [10.0] * 14)).at == 8, "midpoint by default"


def test_by_load_without_a_load_map_or_rows_is_refused_saying_what_to_do():
    refused = plan({"requested": True, "by": "load"}, None)
    assert isinstance(refused, SplitRefused) and refused.field == "spec.split.by"
    assert 'spark.taskshard.keyGroupMetrics: "true"' in refused.message and PARENT in refused.message
    empty = plan({"requested": True, "by": "load"}, {}, 300)
    assert isinstance(empty, SplitRefused) and "no input rows in the last 300 s" in empty.message


def test_at_and_by_load_exclude_each_other():
    with pytest.raises(ValidationError, match="exclude each other"):
        TaskShardSpec.model_validate(
            {
                "taskRef": {"name": "t"},
                "keyGroups": {"start": 0, "end": 16},
                "split": {"requested": True, "at": 4, "by": "load"},
            }
        )


def load_stats(rows: dict[str, float]) -> LiveStats:
    return LiveStats(41, None, 20.0, 0, "bytes", 10, 0, True, key_group_rows=rows)


def test_a_running_shard_split_by_load_records_the_point_and_the_shares():
    world = World()
    _running_shard(world)
    world.shards[PARENT]["metadata"]["generation"] = 2
    world.shards[PARENT]["spec"]["split"] = {"requested": True, "by": "load"}
    rows = per_key_group([100.0, 100.0] + [10.0] * 14)
    world.scrapes[PARENT] = Scraped(load_stats({"0-1": 1.0}), "t", "127.42.0.2", load=rows, load_seconds=300)
    decision = decide(world, PARENT)
    assert decision.status["phase"] == "SplitRequested"
    split = decision.status["split"]
    assert split["at"] == 2 and split["by"] == "load" and split["windowRows"] == 340 and split["windowSeconds"] == 300
    assert split["expectedShares"] == [round(200 / 340, 4), round(140 / 340, 4)]
    assert "by load: 59% / 41% of 340 input rows in the last 300 s" in condition(decision, st.PROGRESSING)["message"]


def test_a_load_map_of_another_pod_is_not_used():
    world = World()
    _running_shard(world)
    world.shards[PARENT]["metadata"]["generation"] = 2
    world.shards[PARENT]["spec"]["split"] = {"requested": True, "by": "load"}
    rows = per_key_group([10.0] * 16)
    world.scrapes[PARENT] = Scraped(load_stats({"0-1": 1.0}), "t", "127.42.0.99", load=rows)
    decision = decide(world, PARENT)
    assert "phase" not in decision.status
    assert condition(decision, st.SPLIT_REJECTED)["reason"] == "InvalidSplitRequest"


# ---------------------------------------------------------------- by: state


def plan_by_state(state, batch=7):
    return plan_split(
        shard=PARENT,
        key_groups=R16,
        phase=ShardPhase.RUNNING,
        split={"requested": True, "by": "state"},
        load=per_key_group([10.0] * 16),  # an even load map: by: state must not follow it
        state=state,
        state_batch=batch,
    )


def test_by_state_splits_where_the_state_rows_divide_in_half():
    decision = plan_by_state(per_key_group([0.0] * 12 + [50.0] * 4), batch=9)
    assert isinstance(decision, SplitAccepted) and decision.at == 14 and decision.by == SplitBy.STATE
    assert decision.state_batch == 9 and decision.load is not None and decision.load.shares == (0.5, 0.5)


def test_by_state_without_a_state_map_or_rows_is_refused_saying_what_to_do():
    refused = plan_by_state(None, None)
    assert isinstance(refused, SplitRefused) and refused.field == "spec.split.by"
    assert refused.message.startswith(f"spec.split.by: state: shard {PARENT} has no state map yet")
    assert 'spark.taskshard.keyGroupMetrics: "true"' in refused.message and "stateMapSeconds" in refused.message
    empty = plan_by_state(per_key_group([0.0] * 16))
    assert isinstance(empty, SplitRefused) and "no state rows in its state map" in empty.message


def test_at_and_by_state_exclude_each_other():
    with pytest.raises(ValidationError, match="spec.split.by: state and spec.split.at: 4 exclude each other"):
        TaskShardSpec.model_validate(
            {
                "taskRef": {"name": "t"},
                "keyGroups": {"start": 0, "end": 16},
                "split": {"requested": True, "at": 4, "by": "state"},
            }
        )


def test_a_scrape_with_a_state_map_parses_it_with_its_batch():
    text = SCRAPE + (
        "# TYPE taskshard_shard_key_group_state_rows gauge\n"
        'taskshard_shard_key_group_state_rows{key_groups="0-8",shard="t-0-16",task="t"} 30.0\n'
        'taskshard_shard_key_group_state_rows{key_groups="8-16",shard="t-0-16",task="t"} 10.0\n'
        "# TYPE taskshard_shard_state_map_batch gauge\n"
        'taskshard_shard_state_map_batch{shard="t-0-16",task="t"} 5.0\n'
    )
    stats = parse_scrape(text)
    assert stats is not None and stats.key_group_state_rows == {"0-8": 30.0, "8-16": 10.0}
    assert stats.state_map_batch == 5 and stats.to_status(observed_at="t")["stateMapBatch"] == 5
    scraped = Scraped(stats, "t", "ip")
    assert scraped.state == {(0, 8): 30.0, (8, 16): 10.0} and scraped.state_batch == 5
    plain = parse_scrape(SCRAPE)
    assert plain.state_map_batch is None and Scraped(plain, "t", "ip").state is None
    assert "stateMapBatch" not in plain.to_status(observed_at="t")


def test_a_running_shard_split_by_state_records_the_point_the_shares_and_the_batch():
    world = World()
    _running_shard(world)
    world.shards[PARENT]["metadata"]["generation"] = 2
    world.shards[PARENT]["spec"]["split"] = {"requested": True, "by": "state"}
    state = {f"{kg}-{kg + 1}": (30.0 if kg < 4 else 0.0) for kg in range(16)}
    stats = LiveStats(41, None, 20.0, 0, "bytes", 120, 0, True, key_group_state_rows=state, state_map_batch=40)
    world.scrapes[PARENT] = Scraped(stats, "t", "127.42.0.2")
    decision = decide(world, PARENT)
    assert decision.status["phase"] == "SplitRequested"
    split = decision.status["split"]
    assert split["at"] == 2 and split["by"] == "state" and split["stateRows"] == 120 and split["stateBatch"] == 40
    assert split["expectedShares"] == [0.5, 0.5] and "windowRows" not in split
    assert "by state: 50% / 50% of 120 state rows at batch 40" in condition(decision, st.PROGRESSING)["message"]


def test_a_state_map_of_another_pod_is_not_used():
    world = World()
    _running_shard(world)
    world.shards[PARENT]["metadata"]["generation"] = 2
    world.shards[PARENT]["spec"]["split"] = {"requested": True, "by": "state"}
    stats = LiveStats(41, None, 20.0, 0, "bytes", 10, 0, True, key_group_state_rows={"0-1": 5.0}, state_map_batch=3)
    world.scrapes[PARENT] = Scraped(stats, "t", "127.42.0.99")
    decision = decide(world, PARENT)
    assert "phase" not in decision.status
    assert "no state map yet" in condition(decision, st.SPLIT_REJECTED)["message"]
