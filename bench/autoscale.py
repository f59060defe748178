"""The built-in autoscaler on a 4x step of the input rate, end to end (the Autoscale target of issue 19).

What runs: the local control plane, the operator (``--live-status-seconds 2``) and a Task with
``spec.autoscale`` whose shards run as pods (Spark ``local[2]`` each, the node agent starts them as processes),
over a 4-partition journal partitioned by key (16 key groups nested in the partitions, so a split child reads
only its partitions). ``spark.taskshard.maxBytesPerTrigger`` caps what one shard reads per micro-batch: a
shard's throughput is then bounded like a shard on its own cores would be, and a split adds capacity even on a
2-core machine (without the cap every shard competes for the same two cores and a split adds none).

The producer appends ``--base`` events/s, then ``--factor`` times as many for ``--step`` seconds, then
``--base`` again until the Task is back at ``minShards`` (or ``--tail`` seconds). Every 2 s the script records
the producer's rate, the Task's ``status.live`` (rate, and the worst shard's ``lagSeconds``), the active shards
and ``status.autoscale`` (the count wanted and the reason). At the end the producer stops and every key's count
is compared with a plain-Python count of the journal (exact or not).

Prints the decisions and a summary table; writes ``autoscale.json`` and ``autoscale.png`` (rate, lag and shard
count over time) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DEFAULT_OUT, REPO, LoadSampler, command_line, machine, print_table, pyplot, say, write_result  # noqa: E402
from demo import TASK, Demo  # noqa: E402 - hack/demo.py: cluster, operator, kubectl, the exact-results check

from spark_runtime.live import LAG_SECONDS_STALLED  # noqa: E402
from spark_runtime.produce import append_events  # noqa: E402

PARTITIONS = 4
KEYS = 400


class AutoscaleRun(Demo):
    """The demo's plumbing with an autoscaled Task, a paced producer and a sampler."""

    def __init__(self, run_dir: Path, args: argparse.Namespace) -> None:
        super().__init__(run_dir)
        self.args = args
        self.rate = float(args.base)
        self.samples: list[dict[str, Any]] = []
        self.t0 = time.time()
        self._stop_sampler = threading.Event()

    def apply_task(self) -> None:
        a = self.args
        say(f"applying Task {TASK}: count per key, 16 key groups over {PARTITIONS} partitions, autoscaled")
        self.journal.mkdir(parents=True, exist_ok=True)
        manifest = textwrap.dedent(f"""
            apiVersion: taskshard.io/v1alpha1
            kind: Task
            metadata: {{name: {TASK}}}
            spec:
              maxKeyGroups: 16
              initialShards: 1
              keyField: key
              processor: {{builtin: count}}
              source: {{journal: {{path: /data/journal/{TASK}, partitions: {PARTITIONS}, partitionedByKey: true}}}}
              sink: {{directory: {{path: /data/output/{TASK}, format: jsonl}}}}
              storage:
                path: /data/state
                volume: {{hostPath: {self.data}, mountPath: /data}}
              autoscale:
                minShards: 1
                maxShards: {a.max_shards}
                targetLagSeconds: {a.target_lag}
                stabilizationSeconds: {a.stabilization}
                cooldownSeconds: {a.cooldown}
              spark:
                image: taskshard/shard:0.1.0
                conf:
                  spark.sql.shuffle.partitions: "2"
                  spark.ui.enabled: "false"
                  spark.taskshard.maxBytesPerTrigger: "{a.max_bytes}"
                  spark.taskshard.keyGroupMetrics: "true"
                  spark.taskshard.rehearse: "false"
                triggerInterval: 1 second
        """)
        print(textwrap.indent(manifest.strip(), "    "), flush=True)
        self.kubectl("apply", "-f", "-", input=manifest)

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
        task = json.loads(self.kubectl("get", "task", TASK, "-o", "json"))
        status = task.get("status") or {}
        live = status.get("live") or {}
        auto = status.get("autoscale") or {}
        shards = self.shards()
        owners = [a["name"] for a in status.get("activeShards") or []]  # the operator's owners: no hand-over twice
        lags = [((shards.get(n, {}).get("status") or {}).get("live") or {}).get("lagSeconds") for n in owners]
        measured = [lag for lag in lags if lag is not None]
        return {
            "t": round(time.time() - self.t0, 1),
            "produced": self.produced,
            "producerRate": self.rate,
            "taskRate": live.get("rate"),
            "worstLagSeconds": max(measured) if measured else None,
            "active": int(status.get("shards") or len(owners)),
            "desired": auto.get("desiredShards"),
            "reason": auto.get("reason"),
        }

    def autoscale_events(self) -> list[dict[str, Any]]:
        items = json.loads(self.kubectl("get", "events", "-o", "json"))["items"]
        chosen = [e for e in items if e.get("reason") in ("AutoscalingUp", "AutoscalingDown")]
        return sorted(
            ({"time": e.get("eventTime") or e.get("lastTimestamp"), "reason": e["reason"], "message": e["message"]}
             for e in chosen),
            key=lambda e: e["time"] or "",
        )  # fmt: skip

    def measure(self) -> dict[str, Any]:
        a = self.args
        self.start_cluster()
        producer = threading.Thread(target=self.produce, daemon=True)
        sampler = threading.Thread(target=self.sample_loop, daemon=True)
        try:
            self.start_operator()
            self.apply_task()
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
            events = self.autoscale_events()
            return {
                "samples": self.samples,
                "stepStart": round(step_start, 1),
                "stepEnd": round(step_end, 1),
                "tailEnd": round(back, 1),
                "exact": exact,
                "produced": self.produced,
                "events": events,
            }
        finally:
            self._stop_producer.set()
            self._stop_sampler.set()
            if self.operator and self.operator.poll() is None:
                self.operator.terminate()
                self.operator.wait(timeout=30)
            if self.cluster:
                say("stopping the local control plane")
                self.cluster.stop()

    def _watch(self, seconds: float) -> None:
        """Wait ``seconds``, printing each change of the count or the reason."""
        end = time.monotonic() + seconds
        shown = None
        while time.monotonic() < end:
            self._check_operator()
            last = self.samples[-1] if self.samples else None
            if last is not None:
                now = (last["active"], last["desired"], last["reason"])
                if now != shown:
                    lag = last["worstLagSeconds"]
                    print(
                        f"    t={last['t']:.0f}s rate {last['producerRate']:g}/s task {last['taskRate']} rows/s, worst "
                        f"lag {lag} s, {last['active']} active, wants {last['desired']} ({last['reason']})",
                        flush=True,
                    )
                    shown = now
            time.sleep(min(2.0, max(0.0, end - time.monotonic())))


def summarize(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    samples = raw["samples"]
    s0, s1 = raw["stepStart"], raw["stepEnd"]
    target = args.target_lag
    peak = max((s["active"] for s in samples), default=0)
    ups = [s for a, s in zip(samples, samples[1:], strict=False) if s["active"] > a["active"]]
    downs = [s for a, s in zip(samples, samples[1:], strict=False) if s["active"] < a["active"]]
    last_minute = [
        s["worstLagSeconds"] for s in samples if s1 - 60 <= s["t"] <= s1 and s["worstLagSeconds"] is not None
    ]
    end_lag = max(last_minute) if last_minute else None
    after = [s for s in samples if s["t"] >= s1]
    back_at = next((s["t"] for s in after if s["active"] == 1), None)
    peak_lag = max((s["worstLagSeconds"] or 0 for s in samples if s0 <= s["t"] <= s1), default=0)
    under = next(
        (s["t"] for s in samples if s["t"] > s0 + 1 and s["active"] == peak and (s["worstLagSeconds"] or 0) <= target),
        None,
    )
    handovers = _handovers(samples)
    grown = peak > 1 and bool(ups)
    kept = end_lag is not None and end_lag <= target
    shrunk = back_at is not None
    met = grown and kept and shrunk and raw["exact"]

    def lag_text(v: Any) -> str:
        return "no progress" if v is not None and v >= LAG_SECONDS_STALLED else f"{v} s" if v is not None else "-"

    rows = [
        ["input rate", f"{args.base:g} -> {args.base * args.factor:g} -> {args.base:g} events/s", ""],
        ["step", f"{s1 - s0:.0f} s, from t={s0:.0f} s", ""],
        ["peak active shards", peak, f"maxShards {args.max_shards}"],
        ["scale-ups (t after the step began)", ", ".join(f"{s['t'] - s0:.0f} s" for s in ups) or "-", ""],
        ["worst lag during the step (peak)", lag_text(peak_lag), f"target {target} s"],
        ["worst lag over the step's last minute", lag_text(end_lag), f"target {target} s"],
        ["lag under the target at the peak count (t after the step began)",
         f"{under - s0:.0f} s" if under is not None else "never", ""],
        ["scale-downs (t after the step ended)", ", ".join(f"{s['t'] - s1:.0f} s" for s in downs) or "-",
         f"cooldown {args.cooldown} s"],
        ["back at 1 shard (t after the step ended)", f"{back_at - s1:.0f} s" if back_at is not None else "not yet", ""],
        ["hand-overs: the count wanted changed -> the active shards followed",
         ", ".join(f"{a}->{b}: {d:.0f} s" for a, b, d in handovers) or "-", ""],
        ["results", "exact" if raw["exact"] else "MISMATCH", f"{raw['produced']:,} events"],
    ]  # fmt: skip
    why = []
    if not grown:
        why.append("the Task never grew")
    if not kept:
        why.append(f"the worst lag over the step's last minute was {lag_text(end_lag)}")
    if not shrunk:
        why.append("the Task was not back at one shard before the tail ended")
    if not raw["exact"]:
        why.append("the results were not exact")
    if handovers:
        why.append(
            "the time goes to the hand-overs: "
            + ", ".join(f"{a}->{b} took {d:.0f} s" for a, b, d in handovers)
            + " from the autoscaler's decision until the active shards followed (new Spark JVMs starting and "
            "restoring while the others run, all on the same 2 cores: see the load average), while the lag kept "
            "growing"
        )
    targets = [
        {
            "name": f"autoscale: {args.factor:g}x rate step: grows, lag under the target by the step's end, back to "
            "minShards after the cooldown, exact results",
            "target": f"lag <= {target} s, back to 1, exact",
            "value": f"peak {peak} shards, last-minute lag {lag_text(end_lag)}, "
            + (f"back to 1 after {back_at - s1:.0f} s" if back_at is not None else "not back to 1")
            + (", exact" if raw["exact"] else ", NOT exact"),
            "met": met,
            "why": "; ".join(why),
        }
    ]
    return {"rows": rows, "targets": targets}


def _handovers(samples: list[dict[str, Any]]) -> list[tuple[int, int, float]]:
    """``(from, to, seconds)`` for each change of the count wanted: until the active shards were as many."""
    out = []
    for i, (a, b) in enumerate(zip(samples, samples[1:], strict=False)):
        if a["desired"] is not None and b["desired"] is not None and b["desired"] != a["desired"]:
            done = next((s["t"] for s in samples[i + 1 :] if s["active"] == b["desired"]), None)
            if done is not None:
                out.append((a["desired"], b["desired"], done - b["t"]))
    return out


def resummarize(out: Path) -> None:
    """Recompute the tables and targets of ``<out>/autoscale.json`` from its raw samples (``--summarize``)."""
    path = out / "autoscale.json"
    payload = json.loads(path.read_text())
    args = argparse.Namespace(**{k.replace("-", "_"): v for k, v in payload["parameters"].items()})
    summary = summarize(payload["raw"], args)
    payload["tables"][0]["rows"] = summary["rows"]
    payload["targets"] = summary["targets"]
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print_table("Autoscaling on a rate step", ["measurement", "value", "against"], summary["rows"], payload["load"])


def plot(raw: dict[str, Any], args: argparse.Namespace, path: Path) -> None:
    plt = pyplot()
    samples = raw["samples"]
    t = [s["t"] for s in samples]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    ax1.plot(t, [s["producerRate"] for s in samples], label="producer (events/s)")
    ax1.plot(t, [s["taskRate"] or 0 for s in samples], label="Task rate (rows/s)")
    ax1.set_ylabel("rate")
    ax1.legend(loc="upper right", fontsize=8)
    lag = [
        min(s["worstLagSeconds"], 10 * args.target_lag) if s["worstLagSeconds"] is not None else None for s in samples
    ]
    ax2.plot(t, [v if v is not None else float("nan") for v in lag], color="tab:red", label="worst lagSeconds")
    ax2.axhline(args.target_lag, color="gray", linestyle="--", label=f"target {args.target_lag} s")
    ax2.set_ylabel("lag (s)")
    ax2.legend(loc="upper right", fontsize=8)
    ax3.step(t, [s["active"] for s in samples], where="post", label="active shards")
    ax3.step(t, [s["desired"] or 0 for s in samples], where="post", linestyle=":", label="desired")
    ax3.set_ylabel("shards")
    ax3.set_xlabel("seconds")
    ax3.legend(loc="upper right", fontsize=8)
    for ax in (ax1, ax2, ax3):
        ax.axvspan(raw["stepStart"], raw["stepEnd"], color="orange", alpha=0.1)
    fig.suptitle(f"Autoscaling on a {args.factor:g}x rate step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--summarize", action="store_true", help="only recompute the tables from the last results")
    args = p.parse_args(argv)
    out = args.out if args.out.is_absolute() else REPO / args.out
    if args.summarize:
        resummarize(out)
        return 0
    run_dir = (REPO / ".run" / time.strftime("bench-autoscale-%Y%m%d-%H%M%S")).resolve()
    run_dir.mkdir(parents=True)
    with LoadSampler() as load:
        raw = AutoscaleRun(run_dir, args).measure()
    summary = summarize(raw, args)
    print_table("Autoscaling on a rate step", ["measurement", "value", "against"], summary["rows"], load.summary())
    for e in raw["events"]:
        print(f"    {e['time']} {e['reason']}: {e['message']}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    plot(raw, args, out / "autoscale.png")
    notes = [
        "The Task's shards run as pods on the local control plane (the node agent starts them as processes, Spark "
        "local[2] each); the operator scrapes them every 2 s.",
        f"Each shard reads at most {args.max_bytes} bytes per micro-batch (spark.taskshard.maxBytesPerTrigger, "
        "trigger every second): a per-shard throughput bound, as a shard on its own cores would have; the journal "
        f"has {PARTITIONS} partitions partitioned by key, so a split child reads only its half.",
        "'worst lag' is the largest status.live.lagSeconds of the active shards (seconds to work off the lag at the "
        "pace each consumed its source over the last minute; 999999: no progress, e.g. a shard that just started).",
        "Times are seconds since the first shard ran; the orange band is the step. Results: every key's count "
        "against a plain-Python count of the journal, after the producer stopped.",
        "Splits and merges skip the standby rehearsal (spark.taskshard.rehearse: false) to fit the run in about "
        "half an hour.",
    ]
    payload = {
        "title": "Autoscaling on a rate step",
        "command": command_line(argv),
        "machine": machine(),
        "load": load.summary(),
        "parameters": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "tables": [
            {
                "title": "Autoscaling on a rate step",
                "columns": ["measurement", "value", "against"],
                "rows": summary["rows"],
            },
            {
                "title": "The autoscaler's decisions (events)",
                "columns": ["time", "reason", "message"],
                "rows": [[e["time"], e["reason"], e["message"]] for e in raw["events"]],
            },
        ],  # fmt: skip
        "targets": summary["targets"],
        "plots": ["autoscale.png"],
        "notes": notes,
        "raw": raw,
    }
    write_result(out, "autoscale", payload)
    return 0 if raw["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
