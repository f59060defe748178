"""Write crds/*.yaml from the pydantic models (the one source of truth), or check that they are current.

Usage (from the repository root):
    python hack/gen_crds.py            # (re)write crds/taskshard.io_*.yaml, then copy crds/ into the chart
    python hack/gen_crds.py --check    # exit 1 and name the stale files when crds/ or the chart's copy drifted

The Helm chart's ``charts/taskshard-operator/crds/`` holds an exact copy of every file in ``crds/`` (the
generated TaskShard CRDs and the hand-written Kopf peering CRDs); this script is the only writer of that copy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT, ROOT / "operator"):  # run from a checkout without installing the project
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from taskshard_operator.models.crd import render_crds  # noqa: E402

CRDS_DIR = ROOT / "crds"
CHART_CRDS_DIR = ROOT / "charts" / "taskshard-operator" / "crds"


def sync(path: Path, text: str, check: bool, stale: list[Path]) -> None:
    """Make ``path`` hold ``text`` (or, when checking, record it as stale when it does not)."""
    current = path.read_text(encoding="utf-8") if path.exists() else None
    if current == text:
        return
    stale.append(path)
    if not check:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on drift")
    parser.add_argument("--out", type=Path, default=CRDS_DIR, help="output directory (default: crds/)")
    parser.add_argument("--chart-out", type=Path, default=CHART_CRDS_DIR, help="the chart's copy of crds/")
    args = parser.parse_args(argv)
    stale: list[Path] = []
    rendered = render_crds()
    for name, text in rendered.items():
        sync(args.out / name, text, args.check, stale)
    sources = {p.name: p.read_text(encoding="utf-8") for p in sorted(CRDS_DIR.glob("*.yaml"))}
    sources.update(rendered)  # what crds/ holds once written
    for name, text in sources.items():
        sync(args.chart_out / name, text, args.check, stale)
    extra = sorted(p for p in args.chart_out.glob("*.yaml") if p.name not in sources)
    for path in extra:
        stale.append(path)
        if not args.check:
            path.unlink()
            print(f"removed {path}")
    if args.check and stale:
        print("stale CRDs (run: python hack/gen_crds.py): " + ", ".join(map(str, stale)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
