"""Process entry for one container of a local pod: bind-mount its volumes, then exec its command.

Run as ``unshare --mount --propagation private python -m localkube.podshim PLAN.json``. The plan is JSON:
``{"mounts": [{"source": str, "target": str, "readOnly": bool}], "cwd": str | None, "sandboxCwd": str,
"argv": [...], "env": {...}, "keepVisible": [str]}``. ``cwd`` is the container's ``workingDir``, entered after
the mounts (a path of the container's view); without one the process starts in ``sandboxCwd``, entered before
the mounts so that no mount can hide it.

Each mount is a bind mount inside the container's private mount namespace, so every container sees its own
files at the paths its pod spec names, while the rest of the file system is the host's. A missing mount point
is created (an empty directory, or an empty file when the source is a file). Every source is opened before the
first mount and bound through its ``/proc/<pid>/fd`` link, so a mount over a parent of another source (an
emptyDir at ``/tmp`` while pod sandboxes live under ``/tmp``) cannot hide it. Targets are mounted parents
first. Then every ``keepVisible`` host directory (the node agent's Python environment and the project it runs
from: the stand-in for a container image's contents) that a volume now hides is bound back at its own path.
The process then ``exec``s the command, so its pid is the one the node agent started and signals.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _mount(fd: int, target: str, read_only: bool) -> None:
    """Bind the file or directory open as ``fd`` at ``target`` (created when missing)."""
    src, dst = Path(f"/proc/{os.getpid()}/fd/{fd}"), Path(target)  # a magic link: never canonicalized
    if src.is_dir():
        dst.mkdir(parents=True, exist_ok=True)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists():
            dst.touch()
    subprocess.run(["mount", "--no-canonicalize", "--bind", str(src), str(dst)], check=True)
    if read_only:
        subprocess.run(["mount", "--no-canonicalize", "-o", "remount,bind,ro", str(dst)], check=True)


def _hidden(path: str, fd: int) -> bool:
    try:
        return not os.path.samefile(path, f"/proc/{os.getpid()}/fd/{fd}")
    except OSError:
        return True


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    try:
        if not plan.get("cwd"):
            os.chdir(plan["sandboxCwd"])
        mounts = sorted(plan["mounts"], key=lambda m: len(Path(m["target"]).parts))
        fds = [os.open(m["source"], os.O_PATH) for m in mounts]
        keep = {path: os.open(path, os.O_PATH) for path in plan.get("keepVisible", []) if os.path.isdir(path)}
        for m, fd in zip(mounts, fds, strict=True):
            _mount(fd, m["target"], m.get("readOnly", False))
        for path, fd in keep.items():
            if _hidden(path, fd):
                _mount(fd, path, True)
        for fd in [*fds, *keep.values()]:
            os.close(fd)
        if plan.get("cwd"):
            os.chdir(plan["cwd"])
        argv = plan["argv"]
        os.execvpe(argv[0], argv, plan["env"])
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"localkube: cannot start container: {e}", file=sys.stderr, flush=True)
        sys.exit(128)


if __name__ == "__main__":
    main()
