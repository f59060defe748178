"""Print the dependency requirements of ``pyproject.toml`` (one per line), for the Dockerfile's dependency layer.

The image installs the project's dependencies in a layer of their own, keyed only by ``pyproject.toml``, so that a
source change rebuilds only the small project wheel and never re-downloads PySpark. This script reads the
``[project]`` table with the standard library (``tomllib``; Python >= 3.11, no third-party import) and prints
``project.dependencies`` plus the requested extras. An extra that names the project itself (``taskshard[spark]``)
is expanded recursively.

Usage: ``python3 requirements.py pyproject.toml [EXTRA ...]``
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

_SELF_EXTRA = re.compile(r"^\s*([A-Za-z0-9._-]+)\s*\[([^\]]+)\]\s*$")


def requirements(project: dict, extras: list[str]) -> list[str]:
    """``project.dependencies`` followed by the requirements of ``extras``, without duplicates, in order."""
    name = project["name"].lower()
    optional = project.get("optional-dependencies", {})
    out: list[str] = []
    seen_extras: set[str] = set()

    def add(reqs: list[str]) -> None:
        for req in reqs:
            m = _SELF_EXTRA.match(req)
            if m and m.group(1).lower() == name:
                for extra in m.group(2).split(","):
                    add_extra(extra.strip())
            elif req not in out:
                out.append(req)

    def add_extra(extra: str) -> None:
        if extra in seen_extras:
            return
        if extra not in optional:
            raise SystemExit(f"requirements.py: pyproject.toml has no extra {extra!r} (has: {sorted(optional)})")
        seen_extras.add(extra)
        add(optional[extra])

    add(project.get("dependencies", []))
    for extra in extras:
        add_extra(extra)
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    project = tomllib.loads(Path(argv[0]).read_text())["project"]
    print("\n".join(requirements(project, argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
