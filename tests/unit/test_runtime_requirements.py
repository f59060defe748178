"""Every module the shipped images import at run time is installed in them: each third-party import of the shard
runtime (``spark_runtime``, function-local imports included) comes from a distribution that the image's
requirements (``hack/image/requirements.py``: the base dependencies plus the ``spark`` extra) install, directly or
as a dependency of one; the same for the operator (``taskshard_operator``) and the base dependencies. A module only
the ``dev`` extra installs (the test bed's venv) would pass every tier that runs in the venv and fail on the image at
its first use."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
FIRST_PARTY = {"spark_runtime", "taskshard_operator", "localkube", "testinfra", "tests"}


def imported_modules(package: Path) -> dict[str, str]:
    """Top-level module -> the first file that imports it, for every absolute import in ``package``."""
    found: dict[str, str] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(REPO)))
    return found


def image_requirements(*extras: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, str(REPO / "hack/image/requirements.py"), str(REPO / "pyproject.toml"), *extras],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def installed_closure(requirements: list[str]) -> set[str]:
    """The distributions ``requirements`` install, with their own dependencies (as installed here; extras of
    those dependencies and environment-marked ones for other platforms are not followed)."""
    todo, seen = [_name(r) for r in requirements], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.distribution(name).requires or []
        except md.PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" in req.replace('"', " ").replace("'", " ") or "extra==" in req:
                continue
            todo.append(_name(req))
    return seen


@pytest.mark.parametrize(
    ("package", "extras"),
    [("spark_runtime", ("spark",)), ("operator/taskshard_operator", ())],
    ids=["shard image", "operator image"],
)
def test_every_module_the_image_imports_is_installed_in_it(package, extras):
    closure = installed_closure(image_requirements(*extras))
    providers = md.packages_distributions()
    missing = []
    for module, where in sorted(imported_modules(REPO / package).items()):
        if module in FIRST_PARTY or module in sys.stdlib_module_names or module == "__future__":
            continue
        dists = {d.lower().replace("_", "-") for d in providers.get(module, [])}
        if not dists & closure:
            missing.append(f"{module} (imported by {where}; from {sorted(dists) or 'no installed distribution'})")
    assert not missing, f"not installed by the image's requirements {list(extras)}: {missing}"
