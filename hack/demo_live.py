"""The demo's live view: samples every TaskShard's ``status.live`` (RATE, LAG, LAST BATCH, as the operator mirrors
them from the shard drivers' metrics endpoints) while the demo runs, prints a compact line on request, and draws
``live.png``: rate and lag per shard over the demo's time line, with the split moments marked."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Sample:
    t: float
    shard: str
    phase: str
    rate: float | None
    lag: int | None
    batch: int | None


@dataclass
class LiveView:
    """``get_shards()`` returns the TaskShards (``kubectl get taskshards -o json`` items)."""

    get_shards: Callable[[], list[dict]]
    interval: float = 2.0
    samples: list[Sample] = field(default_factory=list)
    marks: list[tuple[float, str]] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="demo-live")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def mark(self, label: str) -> None:
        self.marks.append((time.time(), label))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                shards = self.get_shards()
            except Exception:  # noqa: BLE001 - a missed sample is fine
                continue
            now = time.time()
            for s in shards:
                status = s.get("status") or {}
                live = status.get("live") or {}
                self.samples.append(
                    Sample(
                        now,
                        s["metadata"]["name"],
                        status.get("phase") or "",
                        live.get("rate"),
                        live.get("lag"),
                        live.get("batchId"),
                    )
                )

    def line(self) -> str:
        """The latest RATE / LAG / LAST BATCH of each shard that has them, e.g. for a progress line."""
        latest: dict[str, Sample] = {}
        for s in self.samples:
            latest[s.shard] = s
        parts = [
            f"{name} {s.phase} rate {s.rate:.0f}/s lag {s.lag if s.lag is not None else '-'} B batch {s.batch}"
            for name, s in sorted(latest.items())
            if s.rate is not None and s.phase not in ("Split",)
        ]
        return "; ".join(parts) if parts else "(no live status yet)"

    def save(self, run_dir: Path) -> Path | None:
        """``live.json`` (the samples and marks) and ``live.png``; returns the PNG's path (None without
        matplotlib or samples)."""
        data = {"marks": self.marks, "samples": [s.__dict__ for s in self.samples]}
        (run_dir / "live.json").write_text(json.dumps(data, indent=1))
        if not self.samples:
            return None
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        fig, (rate_ax, lag_ax) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
        for shard in sorted({s.shard for s in self.samples}):
            own = [s for s in self.samples if s.shard == shard and s.rate is not None]
            if not own:
                continue
            xs = [s.t - self.started for s in own]
            rate_ax.plot(xs, [s.rate for s in own], label=shard)
            lag_ax.plot(xs, [s.lag or 0 for s in own], label=shard)
        for t, label in self.marks:
            for ax in (rate_ax, lag_ax):
                ax.axvline(t - self.started, color="grey", linestyle="--", linewidth=0.8)
            rate_ax.annotate(label, (t - self.started, rate_ax.get_ylim()[1]), fontsize=7, rotation=90, va="top")
        rate_ax.set_ylabel("RATE (input rows/s, last minute)")
        lag_ax.set_ylabel("LAG (journal bytes behind)")
        lag_ax.set_xlabel("seconds since the demo's Task started")
        rate_ax.legend(fontsize=7, loc="upper left")
        rate_ax.set_title("TaskShard demo: status.live of every shard (the operator scrapes each driver)")
        fig.tight_layout()
        path = run_dir / "live.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
