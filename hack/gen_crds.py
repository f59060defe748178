"""Write crds/*.yaml from the pydantic models (the one source of truth), or check that they are current.

Usage (from the repository root):
    python hack/gen_crds.py            # (re)write crds/taskshard.io_tasks.yaml and crds/taskshard.io_taskshards.yaml
    python hack/gen_crds.py --check    # exit 1 and name the stale files when crds/ differs from the models
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on drift")
    parser.add_argument("--out", type=Path, default=CRDS_DIR, help="output directory (default: crds/)")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render_crds().items():
        path = args.out / name
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if args.check and stale:
        print("stale CRDs (run: python hack/gen_crds.py): " + ", ".join(map(str, stale)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
