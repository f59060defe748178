"""``python -m localkube`` (console script ``localkube``): build the binaries, or run a local cluster.

- ``localkube build``: build (or reuse) the cached control-plane binaries and print where they are.
- ``localkube up [--run-dir DIR]``: start the local control plane and node agent, print the ``KUBECONFIG`` line
  to use, and keep running until interrupted (Ctrl-C stops every component cleanly).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from .binaries import BinariesUnavailable, ensure_binaries
from .cluster import ClusterStartError, LocalCluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="localkube", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build or reuse the control-plane binaries")
    up = sub.add_parser("up", help="run a local control plane until interrupted")
    up.add_argument("--run-dir", help="directory for logs, certificates and pod sandboxes (default: a temp dir)")
    args = parser.parse_args(argv)
    try:
        binaries = ensure_binaries()
    except BinariesUnavailable as e:
        print(f"localkube: {e}", file=sys.stderr)
        return 2
    if args.command == "build":
        for name, path in vars(binaries).items():
            print(f"{name}={path}")
        return 0
    cluster = LocalCluster(args.run_dir, binaries=binaries)
    try:
        cluster.start()
    except ClusterStartError as e:
        print(f"localkube: {e}", file=sys.stderr)
        return 1
    print(f"export KUBECONFIG={cluster.kubeconfig}", flush=True)
    print(f"# logs: {cluster.log_dir}; pod logs: {cluster.run_dir / 'node' / 'logs'}; Ctrl-C to stop", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
