"""Process entry for one container of a local pod: bind-mount its volumes, then exec its command.

Run as ``unshare --mount --propagation private python -m localkube.podshim PLAN.json``. The plan is JSON:
``{"mounts": [{"source": str, "target": str, "readOnly": bool}], "cwd": str, "argv": [...], "env": {...}}``.

Each mount is a bind mount inside the container's private mount namespace, so every container sees its own
files at the paths its pod spec names, while the rest of the file system is the host's. A missing mount point
is created (an empty directory, or an empty file when the source is a file). The process then ``exec``s the
command, so its pid is the one the node agent started and signals.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _mount(source: str, target: str, read_only: bool) -> None:
    src, dst = Path(source), Path(target)
    if src.is_dir():
        dst.mkdir(parents=True, exist_ok=True)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists():
            dst.touch()
    subprocess.run(["mount", "--bind", str(src), str(dst)], check=True)
    if read_only:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(dst)], check=True)


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    try:
        for m in plan["mounts"]:
            _mount(m["source"], m["target"], m.get("readOnly", False))
        os.chdir(plan["cwd"])
        argv = plan["argv"]
        os.execvpe(argv[0], argv, plan["env"])
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"localkube: cannot start container: {e}", file=sys.stderr, flush=True)
        sys.exit(128)


if __name__ == "__main__":
    main()
