"""The autoscale policy (:mod:`taskshard_operator.autoscale`) as a pure function over recorded metrics: each rule,
the memory's round trip through ``status.autoscale``, the spec's validation (pydantic and the CRD's CEL rules), a
rate step driven through a fluid model of a Task, and the Task pass in the in-memory world."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from pydantic import ValidationError

from spark_runtime.live import LAG_SECONDS_STALLED, LiveStats
from taskshard_operator import autoscale as au
from taskshard_operator import naming
from taskshard_operator.autoscale import AutoscaleState, decide_autoscale
from taskshard_operator.live import Scraped
from taskshard_operator.models.crd import build_crds
from taskshard_operator.models.task import AutoscaleSpec, TaskSpec
from taskshard_operator.planner import owners
from taskshard_operator.views import shard_views

from .fake_cluster import converge, new_world
from .operator_spec import NS, SPEC

pytestmark = pytest.mark.unit

POLICY = AutoscaleSpec(
    min_shards=1, max_shards=4, target_lag_seconds=30, stabilization_seconds=60, cooldown_seconds=300
)
T0 = 1_800_000_000.0


def decide(active=2, lags=None, *, rate=100.0, busy=None, state=None, now=T0, policy=POLICY):
    return decide_autoscale(
        policy,
        active=active,
        lags={"a": 5, "b": 5} if lags is None else lags,
        rate=rate,
        busy=busy,
        state=state or AutoscaleState(desired=active),
        now=now,
    )


# ---------------------------------------------------------------- the rules


def test_the_bounds_apply_at_once():
    below = decide(1, {"a": 0}, state=AutoscaleState(), policy=POLICY.model_copy(update={"min_shards": 2}))
    assert (below.desired, below.reason, below.changed) == (2, au.BELOW_MIN, True)
    assert "outside [minShards 2, maxShards 4]" in below.message
    above = decide(4, state=AutoscaleState(desired=4), policy=POLICY.model_copy(update={"max_shards": 3}))
    assert (above.desired, above.reason, above.changed) == (3, au.ABOVE_MAX, True)


def test_the_first_decision_adopts_the_initial_shards():
    creating = decide(0, {}, busy="4 initial shards are still to be created", state=AutoscaleState())
    assert (creating.reason, creating.state.desired, creating.changed) == (au.WAITING, None, False)
    adopted = decide(4, {"a": 0}, state=creating.state)
    assert (adopted.desired, adopted.changed) == (4, False), "minShards 1 does not merge the initial shards at once"


def test_one_change_at_a_time_and_only_on_a_quiet_task():
    waiting = decide(2, state=AutoscaleState(desired=3, hot_since=T0 - 500))
    assert (waiting.desired, waiting.reason, waiting.changed) == (3, au.SCALING_IN_PROGRESS, False)
    assert waiting.state.hot_since is None, "the windows start over"
    busy = decide(2, {"a": 900, "b": 0}, busy="t-0-8 (Draining) splits", state=AutoscaleState(2, hot_since=T0 - 500))
    assert (busy.desired, busy.reason) == (2, au.WAITING) and busy.state.hot_since is None
    assert "t-0-8 (Draining) splits" in busy.message


def test_no_signal_holds():
    held = decide(2, {"a": None, "b": None})
    assert (held.desired, held.reason, held.worst_lag) == (2, au.NO_SIGNAL, None)


def test_lag_above_target_grows_the_task_after_the_stabilization():
    first = decide(2, {"a": 45, "b": 3})
    assert (first.desired, first.reason, first.state.hot_since, first.wake_in) == (2, au.STABILIZING, T0, 60)
    assert "the worst lag is 45 s (a), above targetLagSeconds 30" in first.message
    still = decide(2, {"a": 50, "b": 3}, state=first.state, now=T0 + 59)
    assert (still.desired, still.reason) == (2, au.STABILIZING)
    grown = decide(2, {"a": 55, "b": 3}, rate=420.0, state=still.state, now=T0 + 60)
    assert (grown.desired, grown.reason, grown.changed, grown.worst_lag) == (3, au.LAG_ABOVE_TARGET, True, 55)
    assert grown.state.scale_up_rates == ((3, 420.0),) and grown.state.last_scale == T0 + 60
    assert grown.message.startswith("2 -> 3 shards: the worst lag is 55 s (a)")


def test_a_break_in_the_lag_starts_the_window_over():
    hot = decide(2, {"a": 45, "b": 3})
    calm = decide(2, {"a": 20, "b": 3}, state=hot.state, now=T0 + 30)
    assert (calm.reason, calm.state.hot_since) == (au.LAG_WITHIN_TARGET, None)
    again = decide(2, {"a": 45, "b": 3}, state=calm.state, now=T0 + 61)
    assert (again.desired, again.reason, again.state.hot_since) == (2, au.STABILIZING, T0 + 61)


def test_a_stalled_shard_is_hot_and_max_shards_is_the_ceiling():
    stalled = decide(4, {"a": LAG_SECONDS_STALLED}, state=AutoscaleState(4, hot_since=T0 - 600))
    assert (stalled.desired, stalled.reason) == (4, au.AT_MAX)
    assert "no progress" in stalled.message and "maxShards 4 reached" in stalled.message


def test_a_cold_task_shrinks_after_stabilization_and_cooldown():
    state = AutoscaleState(desired=3, last_scale=T0 - 100, scale_up_rates=((2, 200.0), (3, 400.0)))
    cold = decide(3, {"a": 2, "b": 7, "c": 0}, rate=200.0, state=state)
    assert (cold.desired, cold.reason, cold.state.cold_since) == (3, au.STABILIZING, T0)
    assert "the rate 200.0/s is at most 0.6 of 400.0/s" in cold.message
    cooling = decide(3, {"a": 2, "b": 7, "c": 0}, rate=200.0, state=cold.state, now=T0 + 60)
    assert (cooling.desired, cooling.reason, cooling.wake_in) == (3, au.COOLING_DOWN, 140.0)
    shrunk = decide(3, {"a": 2, "b": 7, "c": 0}, rate=200.0, state=cooling.state, now=T0 + 200)
    assert (shrunk.desired, shrunk.reason, shrunk.changed) == (2, au.LOAD_BELOW_TARGET, True)
    assert shrunk.state.scale_up_rates == ((2, 200.0),), "the rate of the count it left is forgotten"


def test_a_task_grown_by_the_autoscaler_is_not_cold_until_its_rate_dropped():
    state = AutoscaleState(desired=3, scale_up_rates=((3, 400.0),))
    busy_enough = decide(3, {"a": 2, "b": 2, "c": 2}, rate=300.0, state=state, now=T0 + 1000)
    assert (busy_enough.desired, busy_enough.reason) == (3, au.LAG_WITHIN_TARGET)
    assert "above 0.6 of 400.0/s" in busy_enough.message
    assert decide(3, {"a": 8, "b": 2, "c": 2}, rate=0.0, state=state).reason == au.LAG_WITHIN_TARGET, (
        "a lag above a quarter of the target is not cold"
    )


def test_min_shards_is_the_floor():
    at_min = decide(1, {"a": 0}, state=AutoscaleState(1, cold_since=T0 - 999))
    assert (at_min.desired, at_min.reason) == (1, au.AT_MIN)


def test_the_memory_round_trips_through_the_status():
    a = decide(3, {"a": 0, "b": 0, "c": 0}, rate=10.0, state=AutoscaleState(3, scale_up_rates=((3, 400.0),)))
    shown = a.status(None)
    assert shown["desiredShards"] == 3 and shown["scaleUpRates"] == [{"shards": 3, "rate": 400.0}]
    assert AutoscaleState.from_status(shown) == a.state
    again = decide(3, {"a": 0, "b": 0, "c": 0}, rate=10.0, state=AutoscaleState.from_status(shown), now=T0 + 5)
    later = again.status(shown)
    assert later["lastTransitionTime"] == shown["lastTransitionTime"], "same reason and count: the time is kept"
    assert later["coldSince"] == shown["coldSince"]


# ---------------------------------------------------------------- the spec


def test_the_spec_is_validated_naming_fields_and_values():
    with pytest.raises(ValidationError, match=r"spec.autoscale.minShards: 5 must be at most spec.autoscale.maxShards"):
        AutoscaleSpec(min_shards=5, max_shards=2)
    spec = {**SPEC, "maxKeyGroups": 16}
    with pytest.raises(ValidationError, match=r"spec.autoscale.maxShards: 17 must be at most spec.maxKeyGroups \(16\)"):
        TaskSpec.from_k8s({**spec, "autoscale": {"maxShards": 17}})
    with pytest.raises(ValidationError, match="spec.shards and spec.autoscale exclude each other"):
        TaskSpec.from_k8s({**spec, "shards": 2, "autoscale": {"maxShards": 4}})
    parsed = TaskSpec.from_k8s({**spec, "autoscale": {"maxShards": 4}}).autoscale
    assert parsed is not None
    assert (parsed.min_shards, parsed.target_lag_seconds, parsed.stabilization_seconds, parsed.cooldown_seconds) == (
        1,
        60,
        60,
        300,
    )
    schema = build_crds()["taskshard.io_tasks.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = {r["rule"] for r in schema["properties"]["spec"]["x-kubernetes-validations"]}
    assert "!has(self.autoscale) || !has(self.shards)" in rules
    assert "!has(self.autoscale) || self.autoscale.maxShards <= self.maxKeyGroups" in rules
    auto = schema["properties"]["spec"]["properties"]["autoscale"]
    assert auto["x-kubernetes-validations"][0]["rule"] == "self.minShards <= self.maxShards"
    assert "autoscale" in schema["properties"]["status"]["properties"]


# ---------------------------------------------------------------- a rate step through a fluid model


@dataclass
class FluidTask:
    """A Task whose shards each work off ``capacity`` rows/s of the rate, the load spread evenly; a split or merge
    takes ``handover`` seconds (the Task is busy meanwhile). Its lag is the backlog over the Task's capacity."""

    capacity: float = 120.0
    handover: float = 90.0
    active: int = 1
    backlog: float = 0.0
    busy_until: float = 0.0
    pending: int | None = None
    history: list[tuple[float, float, int, int, int]] = field(default_factory=list)

    def step(self, now: float, rate: float, dt: float, desired: int) -> None:
        if self.pending is not None and now >= self.busy_until:
            self.active, self.pending = self.pending, None
        if self.pending is None and desired != self.active:
            self.busy_until, self.pending = now + self.handover, desired
        served = self.capacity * self.active
        self.backlog = max(0.0, self.backlog + (rate - served) * dt)

    def lag_seconds(self) -> int:
        return round(self.backlog / (self.capacity * self.active))


def test_a_four_fold_rate_step_grows_the_task_then_shrinks_it_after_the_cooldown():
    """Rate 100/s, then 400/s for 15 minutes, then 100/s again; each shard works off 120/s. The Task grows one
    shard at a time to the four that keep up, never flaps, and shrinks back to one after the step."""
    policy = AutoscaleSpec(max_shards=6, target_lag_seconds=30, stabilization_seconds=30, cooldown_seconds=300)
    task, state, dt = FluidTask(), AutoscaleState(), 5.0
    counts: list[int] = []
    for i in range(int(3600 / dt)):
        now = T0 + i * dt
        rate = 400.0 if 300 <= i * dt < 1200 else 100.0
        busy = "a hand-over" if now < task.busy_until else None
        lags = {f"s{k}": task.lag_seconds() for k in range(task.active)}
        a = decide_autoscale(policy, active=task.active, lags=lags, rate=rate, busy=busy, state=state, now=now)
        state = a.state
        task.step(now, rate, dt, a.desired)
        counts.append(task.active)
        task.history.append((now, rate, task.lag_seconds(), task.active, a.desired))
    changes = [b for a, b in zip(counts, counts[1:], strict=False) if a != b]
    assert max(counts) == 4, "four shards of 120/s keep up with 400/s; a fifth is never needed"
    assert changes == [2, 3, 4, 3, 2, 1], f"one shard at a time, up then down, no flapping: {changes}"
    at_four = [(now, lag) for now, rate, lag, n, _ in task.history if rate == 400.0 and n == 4]
    assert all(b <= a for (_, a), (_, b) in zip(at_four, at_four[1:], strict=False)), (
        "with four shards the backlog is worked off (CatchingUp) and no fifth shard is asked for"
    )
    after = [lag for now, rate, lag, n, _ in task.history if now - T0 >= 1260]
    assert max(after) <= policy.target_lag_seconds, "within a minute of the step's end the lag is under the target"
    downs = [
        now
        for (now, *_), (_, _, _, n1, _), (_, _, _, n0, _) in zip(
            task.history[1:], task.history[1:], task.history, strict=False
        )
        if n1 < n0
    ]
    assert len(downs) == 3 and all(b - a >= policy.cooldown_seconds for a, b in zip(downs, downs[1:], strict=False))
    assert downs[0] - (T0 + 1200) >= policy.stabilization_seconds


# ---------------------------------------------------------------- the Task pass


def set_live(kube, *, lagSeconds: int, rate: float = 50.0) -> None:  # noqa: N803 - status.live's names
    """Every active shard's pod answers a scrape with this lag and rate (the live store's entry, as the scraper
    leaves it; the shard pass mirrors it into status.live)."""
    for i, v in enumerate(owners(shard_views(kube, NS, "t"))):
        pod = kube.objects.get(("pods", naming.pod_name(v.name)))
        if pod is None:
            continue
        ip = pod.setdefault("status", {}).setdefault("podIP", f"10.0.0.{i + 1}")
        stats = LiveStats(3, None, rate, None, None, None, 0, True, lag_seconds=float(lagSeconds))
        kube.scrapes[v.name] = Scraped(stats, "2026-11-26T00:00:00Z", ip)


def test_in_memory_the_autoscaler_grows_the_task_on_lag_and_merges_it_back_when_cold():
    """The reconcilers against the in-memory API: every shard 100 s behind grows the Task to maxShards by splits,
    one at a time; every shard caught up shrinks it back to minShards by merges; each decision is an event and in
    status.autoscale."""
    policy = {"minShards": 1, "maxShards": 3, "targetLagSeconds": 30, "stabilizationSeconds": 0, "cooldownSeconds": 0}
    kube = new_world({**SPEC, "autoscale": policy})
    events: list = []
    converge(kube, events, passes=40)
    assert len(owners(shard_views(kube, NS, "t"))) == 1
    for _ in range(3):
        set_live(kube, lagSeconds=100)
        converge(kube, events, passes=80)
    active = owners(shard_views(kube, NS, "t"))
    assert len(active) == 3, [v.name for v in active]
    reasons = [e[2] for e in events]
    assert reasons.count("AutoscalingUp") == 2 and reasons.count("ScalingUp") == 2
    shown = kube.objects[("tasks", "t")]["status"]
    assert shown["autoscale"]["desiredShards"] == 3 and shown["autoscale"]["reason"] == au.AT_MAX
    assert shown["scaling"]["message"].startswith("3 active shards, as the autoscaler's status.autoscale.desiredShards")
    for _ in range(3):
        set_live(kube, lagSeconds=0, rate=0.0)
        converge(kube, events, passes=120)
    active = owners(shard_views(kube, NS, "t"))
    assert len(active) == 1 and active[0].merge_parents
    reasons = [e[2] for e in events]
    assert reasons.count("AutoscalingDown") == 2 and reasons.count("ScalingDown") == 2
    assert kube.objects[("tasks", "t")]["status"]["autoscale"]["reason"] == au.AT_MIN


def test_the_lag_is_read_while_a_step_is_pending():
    pending = decide(2, {"a": 45, "b": 3}, state=AutoscaleState(desired=3))
    assert (pending.reason, pending.worst_lag) == (au.SCALING_IN_PROGRESS, 45)
    assert "the worst lag is 45 s (a)" in pending.message
    assert decide(2, {"a": 45}, busy="a roll", state=AutoscaleState(desired=2)).worst_lag == 45


def test_a_merge_every_pair_refuses_is_given_up_not_waited_on():
    """The pinned autoscaler: the coldest pair's merge was refused; with no other pair the scaler is stuck, and the
    autoscaler gives the step up (ScalingStuck with the refusal, a Warning, the cooldown from now) instead of
    answering ScalingInProgress forever."""
    from tests.unit.test_operator_reconcile import reconcile_task

    policy = {"minShards": 2, "maxShards": 3, "targetLagSeconds": 30, "stabilizationSeconds": 0, "cooldownSeconds": 600}
    kube = new_world({**SPEC, "initialShards": 2, "autoscale": policy})
    converge(kube, [], passes=40)
    kube.objects[("tasks", "t")]["spec"]["autoscale"]["minShards"] = 1  # now it may merge the two
    left, right = (v.name for v in sorted(owners(shard_views(kube, NS, "t")), key=lambda v: v.key_groups))
    set_live(kube, lagSeconds=0, rate=0.0)
    body = kube.objects[("taskshards", left)]
    body["spec"]["merge"] = {"with": right}
    body["status"]["observedGeneration"] = body["metadata"].get("generation")
    rejected = {"type": "MergeRejected", "status": "True", "reason": "NotAdjacent", "message": "refused for a test"}
    body["status"]["conditions"] = [*body["status"].get("conditions", []), rejected]
    events: list = []
    reconcile_task(kube, kube, NS, "t", emit=lambda *a: events.append(a))
    shown = kube.objects[("tasks", "t")]["status"]
    assert shown["autoscale"]["reason"] == au.SCALING_STUCK and shown["autoscale"]["desiredShards"] == 2
    assert f"{left} with {right}: refused for a test" in shown["autoscale"]["message"]
    assert shown["autoscale"]["lastScaleTime"], "the cooldown counts from the give-up"
    assert shown["scaling"]["reason"] == "DesiredShards"
    assert [e[2] for e in events if e[1] == "Warning"] == [au.SCALING_STUCK]
    # The next pass is cold again but cooling down: no new attempt, no new event.
    events.clear()
    reconcile_task(kube, kube, NS, "t", emit=lambda *a: events.append(a))
    assert kube.objects[("tasks", "t")]["status"]["autoscale"]["reason"] == au.COOLING_DOWN
    assert not [e for e in events if e[1] == "Warning"]


def test_a_shard_without_a_fresh_signal_holds_never_cold():
    """A Task whose other shards are cold is not cold while one shard reports nothing, answers no scrape any more,
    or shows NoProgress: the autoscaler holds and names it (it used to merge on the shards it could see)."""
    missing = decide(2, {"a": 0, "b": None}, rate=0.0, state=AutoscaleState(desired=2, cold_since=T0 - 10_000))
    assert (missing.desired, missing.reason, missing.state.cold_since) == (2, au.NO_SIGNAL, None)
    assert "b reports no lagSeconds yet" in missing.message
    hung = decide_autoscale(
        POLICY,
        active=2,
        lags={"a": 0, "b": 0},
        rate=0.0,
        busy=None,
        state=AutoscaleState(desired=2, cold_since=T0 - 10_000),
        now=T0,
        unknown={"b": "shows NoProgress (its batch in flight does not commit)"},
    )
    assert (hung.desired, hung.reason) == (2, au.NO_SIGNAL) and "b shows NoProgress" in hung.message


def test_in_memory_a_stale_or_hung_shard_holds_the_autoscaler():
    """Through the Task pass: two cold shards would merge, but a stale scrape (the pod stopped answering) or a
    shard whose batch in flight has run past spec.noProgressSeconds holds the autoscaler (NoSignal, naming the
    shard), and the hung shard and its Task show Ready=False, Degraded=True reason NoProgress."""
    policy = {"minShards": 2, "maxShards": 3, "targetLagSeconds": 30, "stabilizationSeconds": 0, "cooldownSeconds": 0}
    kube = new_world({**SPEC, "initialShards": 2, "autoscale": policy, "noProgressSeconds": 60})
    converge(kube, [], passes=40)
    kube.objects[("tasks", "t")]["spec"]["autoscale"]["minShards"] = 1  # now it may merge the two
    left, right = (v.name for v in sorted(owners(shard_views(kube, NS, "t")), key=lambda v: v.key_groups))
    set_live(kube, lagSeconds=0, rate=0.0)
    kube.scrapes[right] = replace(kube.scrapes[right], stale=True)
    converge(kube, [], passes=20)
    shown = kube.objects[("tasks", "t")]["status"]["autoscale"]
    assert shown["reason"] == au.NO_SIGNAL and f"{right} has not answered a scrape since" in shown["message"]
    assert len(owners(shard_views(kube, NS, "t"))) == 2, "no merge on half the Task"

    scraped = kube.scrapes[right]
    kube.scrapes[right] = replace(scraped, stale=False, stats=replace(scraped.stats, batch_running=75.0))
    converge(kube, [], passes=20)
    conditions = {c["type"]: c for c in kube.objects[("taskshards", right)]["status"]["conditions"]}
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", "NoProgress")
    assert (conditions["Degraded"]["status"], conditions["Degraded"]["reason"]) == ("True", "NoProgress")
    assert "current batch for over 1 min without committing it" in conditions["Degraded"]["message"]
    task = kube.objects[("tasks", "t")]["status"]
    task_conditions = {c["type"]: c for c in task["conditions"]}
    assert (task_conditions["Degraded"]["reason"], task_conditions["Ready"]["reason"]) == (
        "NoProgress",
        "ShardsNoProgress",
    )
    assert task["autoscale"]["reason"] in (au.NO_SIGNAL, au.WAITING) and right in task["autoscale"]["message"]
    assert len(owners(shard_views(kube, NS, "t"))) == 2

    kube.scrapes[right] = replace(scraped, stale=False)  # it committed: healthy again, and the Task may merge
    converge(kube, [], passes=120)
    assert len(owners(shard_views(kube, NS, "t"))) == 1
