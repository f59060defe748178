"""Static checks of the Dockerfile, .dockerignore and hack/image/requirements.py (no Docker needed).

They catch, in the default test run, what would otherwise surface only in the slow image build: a COPY of a path
the .dockerignore allow-list leaves out, a dependency layer that drifts from pyproject.toml, syntax the classic
builder (Debian's docker.io without BuildKit) rejects, and the contract the chart and the operator rely on.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO / "Dockerfile").read_text()
IGNORE = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line.strip() and line[0] != "#"]


def _instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` per instruction, continuation lines joined, comments dropped."""
    lines, current = [], ""
    for raw in DOCKERFILE.splitlines():
        if raw.lstrip().startswith("#") and not current:
            continue
        if raw.rstrip().endswith("\\"):
            current += raw.rstrip()[:-1] + " "
            continue
        current += raw
        if current.strip():
            word, _, rest = current.strip().partition(" ")
            lines.append((word.upper(), rest.strip()))
        current = ""
    return lines


def _stages() -> dict[str, list[tuple[str, str]]]:
    stages: dict[str, list[tuple[str, str]]] = {}
    name = None
    for word, rest in _instructions():
        if word == "FROM":
            m = re.match(r"\S+\s+AS\s+(\S+)", rest, re.IGNORECASE)
            assert m, f"every stage is named: FROM {rest}"
            name = m.group(1)
            stages[name] = []
        elif name is not None:
            stages[name].append((word, rest))
    return stages


def _included(path: str) -> bool:
    """Docker's rule: the last .dockerignore pattern that matches decides (``!`` re-includes)."""
    included = True
    parts = path.split("/")
    for pattern in IGNORE:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if pat.startswith("**/"):
            hit = any(fnmatch.fnmatch(p, pat[3:]) for p in parts)
        else:
            hit = any(fnmatch.fnmatch(p, pat) for p in prefixes)
        if hit:
            included = negate
    return included


def test_both_targets_exist_and_operator_stages_come_first():
    names = list(_stages())
    assert {"operator", "shard"} <= set(names)
    # The classic builder builds every stage above --target: the operator must not need the Spark stages.
    assert names.index("operator") < names.index("shard-deps") < names.index("shard")


def test_base_image_is_a_build_argument():
    first = DOCKERFILE[: DOCKERFILE.index("\nFROM ")]
    assert re.search(r"^ARG BASE_IMAGE=debian:bookworm", first, re.MULTILINE)
    assert "FROM ${BASE_IMAGE} AS runtime" in DOCKERFILE


@pytest.mark.parametrize("target", ["operator", "shard"])
def test_final_stages_run_as_uid_10001_from_the_runtime_stage(target):
    assert re.search(rf"^FROM runtime AS {target}$", DOCKERFILE, re.MULTILINE)
    users = [rest for word, rest in _stages()[target] if word == "USER"]
    assert users == ["10001:10001"]


def test_entrypoints():
    stages = _stages()
    assert ("ENTRYPOINT", '["taskshard-operator"]') in stages["operator"]
    assert ("ENTRYPOINT", '["python", "-m", "spark_runtime"]') in stages["shard"]


def test_shard_pod_command_runs_the_image_python():
    spec = importlib.util.find_spec("taskshard_operator.builders")
    if spec is None:
        pytest.skip("taskshard_operator is not importable")
    from taskshard_operator.builders import SHARD_COMMAND

    assert SHARD_COMMAND[:3] == ["python", "-m", "spark_runtime"]
    assert "PATH=/opt/taskshard/bin:" in DOCKERFILE
    assert "PYSPARK_PYTHON=/opt/taskshard/bin/python" in DOCKERFILE


def test_classic_builder_syntax_only():
    # Debian's docker.io 20.10 builds without BuildKit: no `# syntax=`, no RUN --mount, no COPY --chmod/--link,
    # no heredocs.
    assert not re.search(r"^#\s*syntax=", DOCKERFILE, re.MULTILINE)
    for word, rest in _instructions():
        assert not (word == "RUN" and rest.startswith("--mount")), rest
        assert not (word in {"COPY", "ADD"} and re.search(r"--(chmod|link|parents)", rest)), rest
        assert "<<" not in rest or word != "RUN", rest


def test_every_copied_path_is_in_the_build_context():
    sources = []
    for word, rest in _instructions():
        if word in {"COPY", "ADD"} and "--from=" not in rest:
            *srcs, _dest = rest.split()
            sources += srcs
    assert sources, "the Dockerfile copies files from the context"
    for src in sources:
        assert (REPO / src).exists(), f"COPY {src}: no such path in the repository"
        assert _included(src), f"COPY {src}: .dockerignore leaves it out of the build context"


def test_the_context_leaves_out_local_state():
    for path in [".venv/bin/python", ".git/config", ".run/x", "tests/unit/test_keygroups.py", "charts/x"]:
        assert not _included(path), path
    assert not _included("spark_runtime/__pycache__/keygroups.cpython-311.pyc")
    assert _included("spark_runtime/keygroups.py") and _included("operator/taskshard_operator/__init__.py")


def _load_requirements_module():
    spec = importlib.util.spec_from_file_location("image_requirements", REPO / "hack" / "image" / "requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_requirement_lists_follow_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = _load_requirements_module().requirements
    assert requirements(project, []) == project["dependencies"]
    spark = requirements(project, ["spark"])
    assert spark == project["dependencies"] + project["optional-dependencies"]["spark"]
    assert not any(r.lower().startswith("pyspark") for r in requirements(project, []))


def test_requirements_expand_self_referencing_extras():
    requirements = _load_requirements_module().requirements
    project = {
        "name": "Demo",
        "dependencies": ["a>=1"],
        "optional-dependencies": {"x": ["b"], "all": ["demo[x]", "c", "a>=1"]},
    }
    assert requirements(project, ["all"]) == ["a>=1", "b", "c"]
    with pytest.raises(SystemExit, match="no extra 'nope'"):
        requirements(project, ["nope"])
