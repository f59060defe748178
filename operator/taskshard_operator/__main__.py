"""``taskshard-operator`` / ``python -m taskshard_operator``: run the TaskShard operator (Kopf).

Examples::

    taskshard-operator --namespace demo --standalone          # one replica, e.g. in tests or the demo
    taskshard-operator --all-namespaces --peering taskshard    # HA: replicas share a KopfPeering object

Credentials: in-cluster service account, else ``KUBECONFIG`` / ``~/.kube/config``. Exit with SIGINT/SIGTERM.

HA: with peering (the default unless ``--standalone``) each replica announces itself in the KopfPeering object
named by ``--peering`` with a priority (random unless ``--priority``); every replica pauses while a peer with a
higher or equal priority is alive, so exactly one acts. The KopfPeering CRDs must be installed (the chart does).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="taskshard-operator", description=__doc__.split("\n\n")[0])
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable; glob allowed)"
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument("--standalone", action="store_true", help="run without peering (a single replica)")
    peering.add_argument("--peering", default="taskshard", help="KopfPeering object name (default: taskshard)")
    parser.add_argument("--priority", type=int, default=None, help="peering priority (default: random)")
    parser.add_argument(
        "--liveness", default="http://0.0.0.0:8080/healthz", help="liveness endpoint URL ('' to disable)"
    )
    parser.add_argument("--resync-seconds", type=float, default=None, help="safety-net resync interval (default 300)")
    parser.add_argument("--backoff-base", type=float, default=None, help="pod replacement back-off base seconds")
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="serve Prometheus metrics at :PORT/metrics (default: off)"
    )
    parser.add_argument(
        "--live-status-seconds",
        type=float,
        default=None,
        help="scrape running shards' metrics into status.live this often (default 10; 0: off)",
    )
    parser.add_argument(
        "--log-format", choices=("plain", "json"), default="plain", help="log lines as text or one JSON object each"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="verbose kopf logging")
    parser.add_argument("--debug", action="store_true", help="debug kopf logging")
    args = parser.parse_args(argv)
    if not args.namespace and not args.all_namespaces:
        parser.error("one of --namespace NS or --all-namespaces is required")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The handlers read these at import time (timer intervals are fixed when registered).
    if args.resync_seconds is not None:
        os.environ["TASKSHARD_RESYNC_SECONDS"] = str(args.resync_seconds)
    if args.backoff_base is not None:
        os.environ["TASKSHARD_BACKOFF_BASE"] = str(args.backoff_base)
    if args.metrics_port is not None:
        os.environ["TASKSHARD_METRICS_PORT"] = str(args.metrics_port)
    os.environ["TASKSHARD_LOG_FORMAT"] = args.log_format  # the shard pods log alike (shard_context)
    if args.live_status_seconds is not None:
        os.environ["TASKSHARD_LIVE_SECONDS"] = str(args.live_status_seconds)

    import kopf  # noqa: PLC0415 - after the environment is set

    import taskshard_operator.handlers  # noqa: F401, PLC0415 - registers the handlers

    log_format = kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.FULL
    kopf.configure(verbose=args.verbose, debug=args.debug, log_format=log_format)
    if not (args.verbose or args.debug):
        # "Handler ... succeeded" for every timer tick drowns the operator's own lines.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    kopf.run(
        standalone=args.standalone,
        peering_name=None if args.standalone else args.peering,
        priority=args.priority if args.priority is not None else random.randint(1, 2**31 - 1),
        clusterwide=args.all_namespaces,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness or None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
