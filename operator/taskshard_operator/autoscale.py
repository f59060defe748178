"""Autoscaling a Task (``spec.autoscale``): how many shards it should have, decided by a pure function over its
shards' lag, with its memory in ``status.autoscale`` (the Task pass acts on it).

The signal is each active shard's ``status.live.lagSeconds``: the seconds it needs to work off its lag at the pace
it consumed its source over the last minute (``spark_runtime.metrics``; 999999 while it has lag and made no
progress). The worst shard counts: a Task keeps up only if every shard does. The count the autoscaler wants,
``status.autoscale.desiredShards``, takes the place of ``spec.shards``: :mod:`taskshard_operator.scaling` reaches
it by splitting the busiest shard (by load when it has a load map) or merging the coldest adjacent pair, one
hand-over at a time. :func:`decide_autoscale` applies these rules, in this order, on every Task pass:

1. **Bounds.** The first decision adopts the active shards (the initial shards, or the count ``spec.shards``
   reached before). The count it wants is kept within ``[minShards, maxShards]`` (reasons BelowMinShards,
   AboveMaxShards: at once, without waiting for a signal).
2. **One change at a time.** While the active shards are not yet as many as it wants, or the Task is not quiet
   (a split or merge in progress, a shard not Running and emitting, a roll, a suspension: ``busy``), it holds
   (ScalingInProgress, Waiting) and its windows start over: stabilization only counts quiet time. The worst lag
   is still read and shown on every pass. A step the scaler cannot take, because every candidate's pass refused
   it (:data:`~taskshard_operator.scaling.SCALING_STUCK`), is given up (:func:`give_up`): the count it wants goes
   back to the active shards (ScalingStuck, naming the refusals, a Warning event), and ``cooldownSeconds`` pass
   before it changes the count again. It never waits on a refused step.
3. **No signal** from some active shard: hold (NoSignal), naming each such shard and why. A shard has no signal
   while no scrape of its current pod reports ``lagSeconds``, while its last scrape is stale (three scrape
   intervals without an answer: the pod stopped answering), and while it shows NoProgress (its batch in flight has
   not committed within ``spec.noProgressSeconds``: its figures are not news). The autoscaler never decides on part
   of the Task: a shard it cannot see might be the hot one, and a hung shard is not cold.
4. **Hot**: the worst ``lagSeconds`` is above ``targetLagSeconds``. Once it has been above for
   ``stabilizationSeconds`` without a break and is not below what it was when the window began (the lag keeps
   growing), one more shard (LagAboveTarget, a Normal event AutoscalingUp), unless the Task has ``maxShards``
   already (AtMaxShards). A lag above the target that fell over the window is being worked off: the window starts
   over from there (CatchingUp), so a backlog left by a rate step does not add shards the new rate does not need.
   Scaling up does not wait for the cooldown: lag grows by the second.
5. **Cold**: the worst ``lagSeconds`` is at most :data:`COLD_LAG_FRACTION` of the target and, when the autoscaler
   itself grew the Task to its current count, the Task's rate is at most :data:`COLD_RATE_FRACTION` of the rate it
   had then (``status.autoscale.scaleUpRates``: one fewer shard fell behind at that rate, so it must have dropped
   well below it). Once cold for ``stabilizationSeconds`` without a break, and ``cooldownSeconds`` after the last
   change the autoscaler made, one shard fewer (LoadBelowTarget, a Normal event AutoscalingDown), unless the Task
   has ``minShards`` (AtMinShards). Stabilizing and CoolingDown say how long is left.
6. Otherwise the lag is within the target (LagWithinTarget): both windows start over.

A decision is one shard up or down; the next one follows the same rules once the Task is quiet again. Times are
Unix seconds; the state round-trips through ``status.autoscale`` (RFC 3339), so an operator restart keeps the
windows and the cooldown.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from taskshard_operator.models.task import AutoscaleSpec
from taskshard_operator.status import rfc3339

__all__ = [
    "COLD_LAG_FRACTION",
    "COLD_RATE_FRACTION",
    "Autoscale",
    "AutoscaleState",
    "decide_autoscale",
    "give_up",
]

COLD_LAG_FRACTION = 0.25
"""A Task is cold only when its worst shard's lagSeconds is at most this fraction of targetLagSeconds."""
COLD_RATE_FRACTION = 0.6
"""... and, for a count the autoscaler grew it to, its rate is at most this fraction of the rate it had then."""

ABOVE_MAX = "AboveMaxShards"
CATCHING_UP = "CatchingUp"
AT_MAX = "AtMaxShards"
AT_MIN = "AtMinShards"
BELOW_MIN = "BelowMinShards"
COOLING_DOWN = "CoolingDown"
LAG_ABOVE_TARGET = "LagAboveTarget"
LAG_WITHIN_TARGET = "LagWithinTarget"
LOAD_BELOW_TARGET = "LoadBelowTarget"
NO_SIGNAL = "NoSignal"
SCALING_IN_PROGRESS = "ScalingInProgress"
SCALING_STUCK = "ScalingStuck"
STABILIZING = "Stabilizing"
WAITING = "Waiting"


@dataclass(frozen=True)
class AutoscaleState:
    """The autoscaler's memory (``status.autoscale``)."""

    desired: int | None = None
    hot_since: float | None = None
    hot_lag: int | None = None
    """The worst lagSeconds when the hot window began."""
    cold_since: float | None = None
    last_scale: float | None = None
    scale_up_rates: tuple[tuple[int, float], ...] = ()
    """``(shards, rate)``: the Task's rate when the autoscaler decided to grow it to ``shards``."""

    @classmethod
    def from_status(cls, shown: Mapping[str, Any] | None) -> AutoscaleState:
        shown = shown or {}
        rates = tuple(
            (int(r["shards"]), float(r["rate"]))
            for r in shown.get("scaleUpRates") or []
            if r.get("shards") is not None and r.get("rate") is not None
        )
        desired = shown.get("desiredShards")
        return cls(
            desired=int(desired) if desired is not None else None,
            hot_since=_seconds(shown.get("hotSince")),
            hot_lag=shown.get("lagAtHotSince"),
            cold_since=_seconds(shown.get("coldSince")),
            last_scale=_seconds(shown.get("lastScaleTime")),
            scale_up_rates=rates,
        )

    def rate_at(self, shards: int) -> float | None:
        return next((rate for n, rate in self.scale_up_rates if n == shards), None)


@dataclass(frozen=True)
class Autoscale:
    """A decision: the count wanted, the new memory, and why."""

    desired: int
    state: AutoscaleState
    reason: str
    message: str
    worst_lag: int | None = None
    changed: bool = field(default=False)
    """The count wanted changed (announced with an event)."""
    wake_in: float | None = None
    """Seconds until a window or the cooldown ends: the Task pass looks again then (None: no time to wait for)."""

    def status(self, shown: Mapping[str, Any] | None) -> dict[str, Any]:
        """``status.autoscale`` (a merge patch: a key it no longer has is set to None). ``lastTransitionTime``
        changes with the reason or the count wanted."""
        shown = shown or {}
        s = self.state
        new: dict[str, Any] = {
            "desiredShards": self.desired,
            "reason": self.reason,
            "message": self.message,
            "worstLagSeconds": self.worst_lag,
            "hotSince": _stamp(s.hot_since),
            "lagAtHotSince": s.hot_lag,
            "coldSince": _stamp(s.cold_since),
            "lastScaleTime": _stamp(s.last_scale),
            "scaleUpRates": [{"shards": n, "rate": round(r, 1)} for n, r in s.scale_up_rates] or None,
        }
        same = shown.get("reason") == self.reason and shown.get("desiredShards") == self.desired
        new["lastTransitionTime"] = (shown.get("lastTransitionTime") if same else None) or rfc3339()
        new.update({k: None for k in shown if k not in new})
        return new


def decide_autoscale(
    policy: AutoscaleSpec,
    *,
    active: int,
    lags: Mapping[str, int | None],
    rate: float,
    busy: str | None,
    state: AutoscaleState,
    now: float,
    unknown: Mapping[str, str] | None = None,
) -> Autoscale:
    """Decide how many shards the Task should have (see the module docstring for the rules).

    ``active`` is the number of active shards; ``lags`` their ``status.live.lagSeconds`` (None: not reported);
    ``unknown`` the active shards whose signal cannot be trusted now, with why (stale, NoProgress);
    ``rate`` the Task's input rows per second (``status.live.rate``); ``busy`` why no split or merge could start
    now (None: the Task is quiet); ``state`` the last decision's memory; ``now`` Unix seconds."""
    lo, hi = policy.min_shards, policy.max_shards
    if active == 0 and state.desired is None:
        rest = replace(state, hot_since=None, hot_lag=None, cold_since=None)
        return Autoscale(lo, rest, WAITING, "no active shard yet: the first decision adopts the initial shards")
    wanted = state.desired if state.desired is not None else active  # the first decision adopts the count
    bounded = min(max(wanted, lo), hi)
    rest = replace(state, desired=bounded, hot_since=None, hot_lag=None, cold_since=None)
    if bounded != wanted:
        reason = BELOW_MIN if bounded > wanted else ABOVE_MAX
        bound = "minShards" if bounded > wanted else "maxShards"
        message = f"{wanted} shards is outside [minShards {lo}, maxShards {hi}]: wants {bounded} ({bound})"
        return Autoscale(bounded, rest, reason, message, changed=True)
    blind = {name: why for name, why in (unknown or {}).items()}
    blind.update({name: "reports no lagSeconds yet" for name, lag in lags.items() if lag is None and name not in blind})
    measured = {name: lag for name, lag in lags.items() if lag is not None and name not in blind}
    worst_name = max(measured, key=lambda n: (measured[n], n)) if measured else None
    worst = measured[worst_name] if worst_name is not None else None
    seen = f"the worst lag is {_lag(worst)} ({worst_name})" if worst is not None else "no lag reported yet"
    if active != bounded:
        message = (
            f"wants {bounded} shards, {active} active: one split or merge at a time until they are as many ({seen})"
        )
        return Autoscale(bounded, rest, SCALING_IN_PROGRESS, message, worst)
    if busy:
        return Autoscale(bounded, rest, WAITING, f"{active} shards; waiting (the windows start over): {busy}", worst)
    if blind or worst is None or worst_name is None:
        return Autoscale(bounded, rest, NO_SIGNAL, _no_signal(active, blind), worst)
    target = policy.target_lag_seconds
    if worst > target:
        return _hot(policy, active, rate, state, now, f"{seen}, above targetLagSeconds {target}", worst)
    cold_lag = target * COLD_LAG_FRACTION
    grown_at = state.rate_at(active)
    if worst <= cold_lag and (grown_at is None or rate <= grown_at * COLD_RATE_FRACTION):
        why = f"{seen}, at most {cold_lag:g} s ({COLD_LAG_FRACTION:g} of targetLagSeconds {target})"
        if grown_at is not None:
            why += f", and the rate {rate:.1f}/s is at most {COLD_RATE_FRACTION:g} of {grown_at:.1f}/s, the rate that "
            why += f"needed a {active}th shard"
        return _cold(policy, active, state, now, why, worst)
    why = f"{seen}, within targetLagSeconds {target}"
    if worst <= cold_lag and grown_at is not None:
        why += f" (the rate {rate:.1f}/s is above {COLD_RATE_FRACTION:g} of {grown_at:.1f}/s, which needed {active})"
    return Autoscale(bounded, rest, LAG_WITHIN_TARGET, f"{active} shards; {why}", worst)


def _no_signal(active: int, blind: Mapping[str, str], limit: int = 10) -> str:
    """NoSignal's message: the shards without a signal and why (at most ``limit`` named)."""
    if not blind:
        return f"{active} shards; no active shard reports status.live.lagSeconds yet"
    names = sorted(blind)
    shown = "; ".join(f"{n} {blind[n]}" for n in names[:limit])
    more = f"; and {len(names) - limit} more" if len(names) > limit else ""
    return f"{active} shards; holds until every active shard reports a fresh lag: {shown}{more}"


def give_up(decided: Autoscale, *, active: int, why: str, now: float) -> Autoscale:
    """The step ``decided`` wants cannot be taken (``why``: the scaler's ScalingStuck message, naming each refused
    shard): want the ``active`` shards again, start the windows over, and count the cooldown from ``now`` so the
    same step is not asked for again at once."""
    state = replace(decided.state, desired=active, hot_since=None, hot_lag=None, cold_since=None, last_scale=now)
    message = (
        f"gave up {active} -> {decided.desired} shards: {why}; wants {active} again, and changes the count no sooner "
        "than cooldownSeconds from now"
    )
    return Autoscale(active, state, SCALING_STUCK, message, decided.worst_lag, changed=True)


def _hot(
    policy: AutoscaleSpec, active: int, rate: float, state: AutoscaleState, now: float, why: str, worst: int
) -> Autoscale:
    since = state.hot_since if state.hot_since is not None else now
    began = state.hot_lag if state.hot_since is not None and state.hot_lag is not None else worst
    held = replace(state, desired=active, hot_since=since, hot_lag=began, cold_since=None)
    if active >= policy.max_shards:
        return Autoscale(active, held, AT_MAX, f"{active} shards; {why}; maxShards {policy.max_shards} reached", worst)
    left = policy.stabilization_seconds - (now - since)
    if left <= 0 and worst < began:
        restart = replace(held, hot_since=now, hot_lag=worst)
        message = (
            f"{active} shards; {why}, down from {_lag(began)} at {_stamp(since)}: being worked off, the window "
            "starts over"
        )
        return Autoscale(active, restart, CATCHING_UP, message, worst, wake_in=max(policy.stabilization_seconds, 1))
    if left > 0:
        at = _stamp(since + policy.stabilization_seconds)
        message = f"{active} shards; {why} since {_stamp(since)}; one more shard at {at} if it stays so"
        return Autoscale(active, held, STABILIZING, message, worst, wake_in=left)
    grown = (*((n, r) for n, r in state.scale_up_rates if n <= active), (active + 1, rate))
    new = AutoscaleState(desired=active + 1, last_scale=now, scale_up_rates=grown)
    message = (
        f"{active} -> {active + 1} shards: {why} for {now - since:.0f} s (stabilizationSeconds "
        f"{policy.stabilization_seconds}); the Task's rate is {rate:.1f}/s"
    )
    return Autoscale(active + 1, new, LAG_ABOVE_TARGET, message, worst, changed=True)


def _cold(policy: AutoscaleSpec, active: int, state: AutoscaleState, now: float, why: str, worst: int) -> Autoscale:
    since = state.cold_since if state.cold_since is not None else now
    held = replace(state, desired=active, hot_since=None, hot_lag=None, cold_since=since)
    if active <= policy.min_shards:
        return Autoscale(active, held, AT_MIN, f"{active} shards; {why}; minShards {policy.min_shards}", worst)
    left = policy.stabilization_seconds - (now - since)
    if left > 0:
        at = _stamp(since + policy.stabilization_seconds)
        message = f"{active} shards; {why} since {_stamp(since)}; one shard fewer at {at} if it stays so"
        return Autoscale(active, held, STABILIZING, message, worst, wake_in=left)
    cooling = 0.0 if state.last_scale is None else policy.cooldown_seconds - (now - state.last_scale)
    if cooling > 0 and state.last_scale is not None:
        at = _stamp(state.last_scale + policy.cooldown_seconds)
        message = (
            f"{active} shards; {why} since {_stamp(since)}; one shard fewer at {at} (cooldownSeconds "
            f"{policy.cooldown_seconds} after the last change)"
        )
        return Autoscale(active, held, COOLING_DOWN, message, worst, wake_in=cooling)
    kept = tuple((n, r) for n, r in state.scale_up_rates if n < active)
    new = AutoscaleState(desired=active - 1, last_scale=now, scale_up_rates=kept)
    message = f"{active} -> {active - 1} shards: {why} for {now - since:.0f} s"
    return Autoscale(active - 1, new, LOAD_BELOW_TARGET, message, worst, changed=True)


def _lag(seconds: int) -> str:
    from spark_runtime.live import LAG_SECONDS_STALLED

    return "no progress" if seconds >= LAG_SECONDS_STALLED else f"{seconds} s"


def _seconds(stamp: Any) -> float | None:
    if not stamp:
        return None
    try:
        return dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _stamp(seconds: float | None) -> str | None:
    return None if seconds is None else rfc3339(seconds)
