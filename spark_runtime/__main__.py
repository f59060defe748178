"""``python -m spark_runtime`` / ``taskshard-shard``: run a shard, append events, read results.

Subcommands::

    run --config shard.json      run one shard until its successors are ready (a final drain) or a SIGTERM
                                 (a resumable stop); exit 0 after either, and 0 when a later writer epoch
                                 fenced it (event "fenced": the kubelet does not restart it); 1 when the query
                                 fails, 2 for a bad config or a restore it must refuse, 3 when the source, sink
                                 or storage cannot be used (missing topic, wrong credentials, unreachable bucket
                                 or broker)
        [--abort-split A,B]      instead: undo the shard's split into children A and B (fence them, clear
                                 their storage and the hand-over) and exit 0 with an "aborted" summary, or
                                 with the drain summary when the hand-over happened already
        [--abort-merge]          instead (a merged shard): fence it and report whether a parent drained for it
                                 (event "merge-abort", outcome Aborted or TooLate)
    produce ...                  append events to a journal (same as taskshard-produce)
    results --sink DIR --storage DIR --task NAME
                                 print the final per-key results across the shard lineage as JSON lines
    executor                     the command of an executor pod Spark created (the executor pod template's
                                 command is ``python -m spark_runtime``, Spark appends ``executor``): exec
                                 Spark's executor backend with the variables Spark set (spark_runtime.kubernetes)

Nothing here imports pyspark before a subcommand needs it, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_runtime.config import ShardConfig
    from spark_runtime.fencing import WriterFenced
    from spark_runtime.shard import ShardRunner

__all__ = ["main"]

log = logging.getLogger("taskshard.shard")


def _write_termination_message(path: str, summary: dict[str, Any]) -> None:
    from spark_runtime.shard import summary_message

    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(summary_message(summary))
    except OSError as exc:
        log.warning("cannot write the termination message to %s: %s", path, exc)


def _cmd_run(args: argparse.Namespace) -> int:
    from spark_runtime.config import ConfigError, load_config

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if config.heartbeat_file:  # a previous container's (an emptyDir outlives it) would fail the liveness probe
        Path(config.heartbeat_file).unlink(missing_ok=True)
    # A SIGTERM from now on means "stop at a batch boundary" (a resumable stop; a final drain already begun
    # stays final), even one that arrives while Spark is still starting.
    early_sigterm: list[bool] = []
    runner: ShardRunner | None = None

    def on_sigterm(signum: int, frame: Any) -> None:
        if runner is None:
            early_sigterm.append(True)
        else:
            runner.request_drain("SIGTERM", final=False)

    signal.signal(signal.SIGTERM, on_sigterm)
    from spark_runtime.processor import ProcessorError
    from spark_runtime.shard import ShardRunner

    try:
        runner = ShardRunner(config)
    except (ProcessorError, NotImplementedError, ConfigError) as exc:
        print(f"invalid shard config: {exc}", file=sys.stderr)
        return _failed(config, exc, code=2)
    if early_sigterm:
        runner.request_drain("SIGTERM", final=False)
    return _run_and_report(args, config, runner)


def _failed(config: ShardConfig, error: Any, reason: str | None = None, code: int = 1, field: str | None = None) -> int:
    """Report a failure in the termination message (a ``FailureSummary``); returns the exit code."""
    from spark_runtime.protocol import FailureSummary

    summary = FailureSummary(config.shard, str(error), reason=reason, field=field).to_json()
    _write_termination_message(config.termination_message_path, summary)
    return code


def _run_and_report(args: argparse.Namespace, config: ShardConfig, runner: ShardRunner) -> int:
    """Run what ``run`` was started for and report its end in the termination message; returns the exit code
    (0: done, fenced or refused by the template; 1: failed; 2: cannot restore; 3: the environment)."""
    from spark_runtime.fencing import WriterFenced
    from spark_runtime.problems import EXIT_ENVIRONMENT, EnvironmentProblem, TemplateRefused
    from spark_runtime.protocol import STATE_SCHEMA_INCOMPATIBLE
    from spark_runtime.shard import ShardFailed
    from spark_runtime.snapshot import RestoreError

    try:
        summary = _run_mode(args, runner)
    except WriterFenced as exc:
        # Exit 0: a restart would claim yet another epoch and fence the current runtime in turn.
        log.error("fenced: %s", exc)
        _write_termination_message(config.termination_message_path, _fenced(config, runner, exc))
        return 0
    except EnvironmentProblem as exc:
        log.error("cannot run: %s", exc)
        _write_termination_message(config.termination_message_path, exc.termination(config.shard))
        return EXIT_ENVIRONMENT
    except TemplateRefused as exc:
        # Exit 0: the same template would refuse again; the operator keeps the shard stopped until it changes.
        log.error("refused: %s", exc)
        _write_termination_message(config.termination_message_path, exc.termination(config.shard))
        return 0
    except RestoreError as exc:
        log.error("cannot restore: %s", exc)
        if exc.reason == STATE_SCHEMA_INCOMPATIBLE:
            refused = TemplateRefused(exc.reason, "processor.python", str(exc))
            _write_termination_message(config.termination_message_path, refused.termination(config.shard))
            return 0
        return _failed(config, exc, exc.reason, code=2)
    except ShardFailed as exc:
        log.error("%s", exc)
        return _failed(config, exc, exc.reason, field=exc.field)
    _write_termination_message(config.termination_message_path, summary)
    print(json.dumps(summary, sort_keys=True), flush=True)
    return 0


def _run_mode(args: argparse.Namespace, runner: ShardRunner) -> dict[str, Any]:
    """What ``run`` was started for: abort a split, abort a merge, or run the shard."""
    if args.abort_split:
        from spark_runtime.handover import abort_split

        return abort_split(runner.io, [c for c in args.abort_split.split(",") if c])
    if args.abort_merge:
        from spark_runtime.merge import abort_merge

        return abort_merge(runner.io)
    return runner.run()


def _fenced(config: ShardConfig, runner: ShardRunner, exc: WriterFenced) -> dict[str, Any]:
    """The termination message of a fenced runtime (a ``FailureSummary`` with event ``fenced``)."""
    from spark_runtime.protocol import POD_UID_ENV, FailureSummary, SummaryEvent

    return FailureSummary(
        config.shard,
        str(exc),
        reason=exc.reason,
        field=exc.field,
        event=SummaryEvent.FENCED,
        pod=os.environ.get("POD_NAME") or None,
        pod_uid=os.environ.get(POD_UID_ENV) or None,
        writer_epoch=runner.fence.epoch,
    ).to_json()


def _cmd_results(args: argparse.Namespace) -> int:
    from spark_runtime.results import final_results

    results = final_results(args.sink, args.storage, args.task)
    for key in sorted(results):
        print(json.dumps({"key": key, "result": results[key]}, ensure_ascii=False))
    return 0


def _cmd_executor(args: argparse.Namespace) -> int:
    import os

    from spark_runtime.kubernetes import ExecutorEnvError, executor_command

    try:
        command = executor_command(os.environ)
    except ExecutorEnvError as exc:
        print(f"taskshard-shard executor: {exc}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    os.execvp(command[0], command)  # the JVM takes this process's pid: the kubelet's signals reach it
    return 0  # not reached


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="taskshard-shard",
        description="TaskShard shard runtime: one PySpark Structured Streaming job per key-group range.",
    )
    p.add_argument("--log-level", default="INFO", help="Python log level (default INFO)")
    p.add_argument(
        "--log-format",
        choices=("plain", "json"),
        default=None,
        help="log lines as text or one JSON object each (default: $TASKSHARD_LOG_FORMAT, else plain)",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="run one shard until drained or stopped",
        description="Run one shard until its successors are ready (a final drain) or a SIGTERM (a "
        "resumable stop at a batch boundary): exit 0 after either (summary on stdout and in "
        "terminationMessagePath), and 0 when a later writer epoch fenced it (event fenced: not restarted); 1 "
        "when the query fails, 2 for a bad config or a restore it must refuse, 3 when the source, sink or "
        "storage cannot be used (the termination message says which field and why).",
    )
    run.add_argument(
        "--config",
        default=None,
        help="shard config, JSON or YAML (default: $TASKSHARD_CONFIG, or inline JSON in $TASKSHARD_CONFIG_JSON)",
    )
    run.add_argument(
        "--abort-split",
        default="",
        metavar="CHILD,CHILD",
        help="undo this shard's split into these children instead of running (the operator starts the pod so "
        "once the split request was withdrawn and the children's pods are gone)",
    )
    run.add_argument(
        "--abort-merge",
        action="store_true",
        help="(a merged shard) fence it and report whether a parent drained for it instead of running (the "
        "operator starts the pod so once the merge was withdrawn and the merged shard's own pod is gone)",
    )
    run.set_defaults(func=_cmd_run)
    produce = sub.add_parser("produce", help="append events to a journal", add_help=False)
    produce.set_defaults(func=None)
    results = sub.add_parser("results", help="print final per-key results across a task's shard lineage")
    results.add_argument("--sink", required=True, help="sink directory (sink.directory.path)")
    results.add_argument("--storage", required=True, help="storage root (storage.path)")
    results.add_argument("--task", required=True, help="task name")
    results.set_defaults(func=_cmd_results)
    executor = sub.add_parser(
        "executor",
        help="run a Spark executor (the command of the executor pod template)",
        description="Exec Spark's Kubernetes executor backend with the variables Spark sets on an executor pod "
        "(SPARK_DRIVER_URL, SPARK_EXECUTOR_ID, ...); exit 2 naming a missing one.",
    )
    executor.set_defaults(func=_cmd_executor)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `produce` forwards its arguments verbatim to taskshard-produce (so its --help is the producer's).
    if argv[:1] == ["produce"]:
        from spark_runtime.produce import main as produce_main

        return produce_main(argv[1:])
    args = _parser().parse_args(argv)
    from spark_runtime.logs import configure

    try:
        configure(args.log_level, args.log_format)
    except ValueError as exc:  # a bad $TASKSHARD_LOG_FORMAT
        print(f"taskshard-shard: {exc}", file=sys.stderr)
        return 2
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
