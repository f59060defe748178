"""The built-in autoscaler on a 4x step of the input rate, end to end (the Autoscale target of issue 19).

hack/demo.py's bed (the operator with ``--live-status-seconds 2``) runs a Task with ``spec.autoscale`` over a
4-partition journal partitioned by key (16 key groups); each shard pod reads at most ``--max-bytes`` per
micro-batch, a bound like a shard on its own cores, so a split adds capacity even on 2 cores. The producer appends
``--base`` events/s, ``--factor`` times as many for ``--step`` s, then ``--base`` until the Task is back at
``minShards`` (at most ``--tail`` s). Every 2 s: the rates (producer, ``status.live``), the worst active shard's
``lagSeconds``, the active shards, ``status.autoscale``. Then every key's count is checked against a plain-Python
count of the journal. Writes ``autoscale.{json,png}`` into ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, LoadSampler, options, parse, publish, pyplot, say, target  # noqa: E402
from demo import TASK, Demo  # noqa: E402 - hack/demo.py: the bed, the Task's plumbing, the exact-results check

from spark_runtime.live import LAG_SECONDS_STALLED  # noqa: E402
from spark_runtime.produce import append_events  # noqa: E402

PARTITIONS = 4
KEYS = 400
TITLE = "Autoscaling on a rate step"
COLUMNS = ["measurement", "value", "against"]


class AutoscaleRun(Demo):
    """The demo's bed and plumbing with an autoscaled Task, a paced producer and a sampler."""

    def __init__(self, run_dir: Path, args: argparse.Namespace) -> None:
        super().__init__(run_dir)
        self.args = args
        self.rate = float(args.base)
        self.samples: list[dict[str, Any]] = []
        self.t0 = time.time()
        self._stop_sampler = threading.Event()

    def manifest(self) -> dict[str, Any]:
        """The demo's Task, autoscaled, over 16 key groups nested in key-partitioned partitions (module docstring)."""
        a, m = self.args, super().manifest()
        spec = m["spec"]
        spec["maxKeyGroups"] = 16
        spec["source"]["journal"] |= {"partitions": PARTITIONS, "partitionedByKey": True}
        spec["autoscale"] = {"minShards": 1, "maxShards": a.max_shards, "targetLagSeconds": a.target_lag}
        spec["autoscale"] |= {"stabilizationSeconds": a.stabilization, "cooldownSeconds": a.cooldown}
        spec["spark"]["image"] = "taskshard/shard:0.1.0"
        spec["spark"]["conf"] |= {"spark.taskshard.maxBytesPerTrigger": str(a.max_bytes)}
        spec["spark"]["conf"] |= {"spark.taskshard.keyGroupMetrics": "true", "spark.taskshard.rehearse": "false"}
        return m

    def produce(self) -> None:
        """Append events at ``self.rate`` per second, in slices of 0.25 s (keys k0..k399)."""
        owed = 0.0
        while not self._stop_producer.is_set():
            owed += self.rate * 0.25
            n = int(owed)
            owed -= n
            if n:
                events = [{"key": f"k{(self.produced + i) * 7919 % KEYS}", "n": self.produced + i} for i in range(n)]
                append_events(self.journal, PARTITIONS, events)
                self.produced += n
            self._stop_producer.wait(0.25)

    def sample_loop(self) -> None:
        while not self._stop_sampler.is_set():
            try:
                self.samples.append(self.sample())
            except Exception as exc:  # a slow API server answer: skip this sample
                print(f"    sample failed: {exc}", flush=True)
            self._stop_sampler.wait(2.0)

    def sample(self) -> dict[str, Any]:
        status = self.bed.get_json("task", TASK).get("status") or {}
        live, auto = status.get("live") or {}, status.get("autoscale") or {}
        shards = self.shards()
        owners = [a["name"] for a in status.get("activeShards") or []]  # the operator's owners: no hand-over twice
        lags = [((shards.get(n, {}).get("status") or {}).get("live") or {}).get("lagSeconds") for n in owners]
        measured = [lag for lag in lags if lag is not None]
        return {
            "t": round(time.time() - self.t0, 1), "produced": self.produced, "producerRate": self.rate,
            "taskRate": live.get("rate"), "worstLagSeconds": max(measured) if measured else None,
            "active": int(status.get("shards") or len(owners)), "desired": auto.get("desiredShards"),
            "reason": auto.get("reason"),
        }  # fmt: skip

    def autoscale_events(self) -> list[dict[str, Any]]:
        events = self.bed.get_json("events")["items"]
        chosen = [e for e in events if e.get("reason") in ("AutoscalingUp", "AutoscalingDown")]
        out = [{"time": e.get("eventTime") or e.get("lastTimestamp"), "reason": e["reason"], "message": e["message"]}
               for e in chosen]  # fmt: skip
        return sorted(out, key=lambda e: e["time"] or "")

    def measure(self) -> dict[str, Any]:
        a = self.args
        producer = threading.Thread(target=self.produce, daemon=True)
        sampler = threading.Thread(target=self.sample_loop, daemon=True)
        try:
            self.start()
            self.apply_task(f"count per key, 16 key groups over {PARTITIONS} partitions, autoscaled")
            producer.start()
            self.wait_phases({f"{TASK}-0-16": "Running"})
            self.t0 = time.time()
            sampler.start()
            say(f"steady at {a.base:g} events/s for {a.settle} s")
            time.sleep(a.settle)
            step_start = time.time() - self.t0
            self.rate = a.base * a.factor
            say(f"step: {self.rate:g} events/s for {a.step} s")
            self._watch(a.step)
            step_end = time.time() - self.t0
            self.rate = float(a.base)
            say(f"back to {a.base:g} events/s until the Task is back at minShards (at most {a.tail} s)")
            deadline = time.monotonic() + a.tail
            while time.monotonic() < deadline:
                self._watch(10)
                last = self.samples[-1] if self.samples else {}
                if last.get("active") == 1 and last.get("reason") == "AtMinShards":
                    break
            back = time.time() - self.t0
            self._stop_producer.set()
            producer.join()
            exact = self.check_results()
            self._stop_sampler.set()
            sampler.join()
            return {
                "samples": self.samples, "stepStart": round(step_start, 1), "stepEnd": round(step_end, 1),
                "tailEnd": round(back, 1), "exact": exact, "produced": self.produced, "events": self.autoscale_events(),
            }  # fmt: skip
        finally:
            self._stop_producer.set()
            self._stop_sampler.set()
            self.stop()

    def _watch(self, seconds: float) -> None:
        """Wait ``seconds``, printing each change of the count or the reason."""
        end = time.monotonic() + seconds
        shown = None
        while time.monotonic() < end:
            self.bed.check_operator()
            last = self.samples[-1] if self.samples else None
            if last is not None and (last["active"], last["desired"], last["reason"]) != shown:
                shown = (last["active"], last["desired"], last["reason"])
                print(
                    f"    t={last['t']:.0f}s rate {last['producerRate']:g}/s task {last['taskRate']} rows/s, worst lag "
                    f"{last['worstLagSeconds']} s, {last['active']} active, wants {last['desired']} ({last['reason']})",
                    flush=True,
                )
            time.sleep(min(2.0, max(0.0, end - time.monotonic())))


def lag_text(v: Any) -> str:
    return "no progress" if v is not None and v >= LAG_SECONDS_STALLED else f"{v} s" if v is not None else "-"


def _handovers(samples: list[dict[str, Any]]) -> list[tuple[int, int, float]]:
    """``(from, to, seconds)`` for each change of the count wanted: until the active shards were as many."""
    out = []
    for i, (a, b) in enumerate(zip(samples, samples[1:], strict=False)):
        if a["desired"] is not None and b["desired"] is not None and b["desired"] != a["desired"]:
            done = next((s["t"] for s in samples[i + 1 :] if s["active"] == b["desired"]), None)
            if done is not None:
                out.append((a["desired"], b["desired"], done - b["t"]))
    return out


def evaluate(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The summary table's rows and the Targets row of one run, from its samples."""
    samples, s0, s1, tl = raw["samples"], raw["stepStart"], raw["stepEnd"], args.target_lag
    pairs = list(zip(samples, samples[1:], strict=False))
    peak = max((s["active"] for s in samples), default=0)
    ups = [b for a, b in pairs if b["active"] > a["active"]]
    last_minute = [
        s["worstLagSeconds"] for s in samples if s1 - 60 <= s["t"] <= s1 and s["worstLagSeconds"] is not None
    ]
    end_lag = max(last_minute) if last_minute else None
    back_at = next((s["t"] for s in samples if s["t"] >= s1 and s["active"] == 1), None)
    peak_lag = max((s["worstLagSeconds"] or 0 for s in samples if s0 <= s["t"] <= s1), default=0)
    under = next(
        (s["t"] for s in samples if s["t"] > s0 + 1 and s["active"] == peak and (s["worstLagSeconds"] or 0) <= tl), None
    )
    handovers = _handovers(samples)
    hand = ", ".join(f"{a}->{b}: {d:.0f} s" for a, b, d in handovers)
    rows = [
        ["input rate", f"{args.base:g} -> {args.base * args.factor:g} -> {args.base:g} events/s", ""],
        ["step", f"{s1 - s0:.0f} s, from t={s0:.0f} s", ""],
        ["peak active shards", peak, f"maxShards {args.max_shards}"],
        ["scale-ups (t after the step began)", ", ".join(f"{s['t'] - s0:.0f} s" for s in ups) or "-", ""],
        ["worst lag during the step (peak)", lag_text(peak_lag), f"target {tl} s"],
        ["worst lag over the step's last minute", lag_text(end_lag), f"target {tl} s"],
        ["lag under the target at the peak count (t after the step began)",
         f"{under - s0:.0f} s" if under is not None else "never", ""],
        ["scale-downs (t after the step ended)",
         ", ".join(f"{b['t'] - s1:.0f} s" for a, b in pairs if b["active"] < a["active"]) or "-",
         f"cooldown {args.cooldown} s"],
        ["back at 1 shard (t after the step ended)", f"{back_at - s1:.0f} s" if back_at is not None else "not yet", ""],
        ["hand-overs: the count wanted changed -> the active shards followed", hand or "-", ""],
        ["results", "exact" if raw["exact"] else "MISMATCH", f"{raw['produced']:,} events"],
    ]  # fmt: skip
    grown, kept, shrunk = peak > 1 and bool(ups), end_lag is not None and end_lag <= tl, back_at is not None
    why = [
        *(["the Task never grew"] if not grown else []),
        *([f"the worst lag over the step's last minute was {lag_text(end_lag)}"] if not kept else []),
        *(["the Task was not back at one shard before the tail ended"] if not shrunk else []),
        *(["the results were not exact"] if not raw["exact"] else []),
        *([f"the time goes to the hand-overs: {hand.replace(': ', ' took ')} from the autoscaler's decision until the "
           "active shards followed (new Spark JVMs starting and restoring while the others run, all on the same 2 "
           "cores: see the load average), while the lag kept growing"] if handovers else []),
    ]  # fmt: skip
    back = f"back to 1 after {back_at - s1:.0f} s" if back_at is not None else "not back to 1"
    goal = target(
        f"autoscale: {args.factor:g}x rate step: grows, lag under the target by the step's end, back to minShards "
        "after the cooldown, exact results",
        f"lag <= {tl} s, back to 1, exact",
        f"peak {peak} shards, last-minute lag {lag_text(end_lag)}, {back}"
        + (", exact" if raw["exact"] else ", NOT exact"),
        grown and kept and shrunk and raw["exact"],
        "; ".join(why),
    )
    return {"rows": rows, "targets": [goal]}


def summarize(data: dict[str, Any]) -> list[str]:
    """The "What the numbers say" lines of ``autoscale.json`` (from its samples, as :func:`evaluate`)."""
    args = argparse.Namespace(**data["parameters"])
    result = evaluate(data["raw"], args)
    rows, (goal,) = [r[1] for r in result["rows"]], result["targets"]
    return [
        f"On a {args.factor:g}x rate step: {goal['value']} (target {goal['target']}: "
        f"{'met' if goal['met'] else 'missed'}); scale-ups {rows[3]} after the step began, scale-downs {rows[7]} "
        "after it ended.",
        f"Hand-overs, from a change of the count wanted until the active shards followed: {rows[9]}.",
    ]


def plot(raw: dict[str, Any], args: argparse.Namespace, path: Path) -> None:
    plt = pyplot()
    samples = raw["samples"]
    t = [s["t"] for s in samples]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    ax1.plot(t, [s["producerRate"] for s in samples], label="producer (events/s)")
    ax1.plot(t, [s["taskRate"] or 0 for s in samples], label="Task rate (rows/s)")
    ax1.set_ylabel("rate")
    lag = [
        min(s["worstLagSeconds"], 10 * args.target_lag) if s["worstLagSeconds"] is not None else None for s in samples
    ]
    ax2.plot(t, [v if v is not None else float("nan") for v in lag], color="tab:red", label="worst lagSeconds")
    ax2.axhline(args.target_lag, color="gray", linestyle="--", label=f"target {args.target_lag} s")
    ax2.set_ylabel("lag (s)")
    ax3.step(t, [s["active"] for s in samples], where="post", label="active shards")
    ax3.step(t, [s["desired"] or 0 for s in samples], where="post", linestyle=":", label="desired")
    ax3.set_ylabel("shards")
    ax3.set_xlabel("seconds")
    for ax in (ax1, ax2, ax3):
        ax.legend(loc="upper right", fontsize=8)
        ax.axvspan(raw["stepStart"], raw["stepEnd"], color="orange", alpha=0.1)
    fig.suptitle(f"Autoscaling on a {args.factor:g}x rate step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = options(__doc__, seed=None)
    p.add_argument("--base", type=float, default=40.0, help="events/s before and after the step")
    p.add_argument("--factor", type=float, default=4.0)
    p.add_argument("--settle", type=int, default=90, help="seconds at the base rate before the step")
    p.add_argument("--step", type=int, default=720, help="seconds at the stepped rate")
    p.add_argument("--tail", type=int, default=900, help="at most this long after the step")
    p.add_argument("--max-bytes", type=int, default=2500, help="spark.taskshard.maxBytesPerTrigger of each shard")
    p.add_argument("--max-shards", type=int, default=4)
    p.add_argument("--target-lag", type=int, default=30)
    p.add_argument("--stabilization", type=int, default=20)
    p.add_argument("--cooldown", type=int, default=120)
    args = parse(p, argv)
    run_dir = (REPO / ".run" / time.strftime("bench-autoscale-%Y%m%d-%H%M%S")).resolve()
    run_dir.mkdir(parents=True)
    with LoadSampler() as load:
        raw = AutoscaleRun(run_dir, args).measure()
    summary = evaluate(raw, args)
    for e in raw["events"]:
        print(f"    {e['time']} {e['reason']}: {e['message']}", flush=True)
    plot(raw, args, args.out / "autoscale.png")
    notes = [
        "The Task's shards run as pods on the local control plane (Spark local[2] each, started as processes by the "
        f"node agent), scraped every 2 s. Each reads at most {args.max_bytes} bytes per micro-batch (trigger every "
        f"second): a per-shard throughput bound, as on cores of its own; the journal's {PARTITIONS} partitions are "
        "partitioned by key, so a split child reads only its half.",
        "'worst lag' = the largest status.live.lagSeconds of the active shards (seconds to work off the lag at the "
        "pace of the last minute; 999999: no progress, e.g. a shard that just started). Times: seconds since the first "
        "shard ran; the orange band is the step. Results: every key's count against a plain-Python count of the "
        "journal. Splits and merges skip the standby rehearsal (spark.taskshard.rehearse: false).",
    ]
    events = [[e["time"], e["reason"], e["message"]] for e in raw["events"]]
    tables = [
        (TITLE, COLUMNS, summary["rows"]),
        ("The autoscaler's decisions (events)", ["time", "reason", "message"], events),
    ]
    publish("autoscale", args, argv, title=TITLE, load=load.summary(), tables=tables, targets=summary["targets"],
            plots=["autoscale.png"], notes=notes, raw=raw)  # fmt: skip
    return 0 if raw["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
