"""Environment problems: the shard's config is valid, but what it points at cannot be used.

A missing Kafka topic, an unreachable broker, storage credentials the bucket rejects, a bucket that does not
exist. The runtime checks these before it processes anything (so nothing is half-done), exits with
:data:`EXIT_ENVIRONMENT` and writes a termination message ``{"event": "failed", "reason", "field", "error"}``;
the operator shows ``reason`` and ``error`` on the TaskShard's conditions. The pod's restarts (with the
kubelet's back-off) retry the check, and the shard's recovery log is untouched, so fixing the cause (creating
the topic, correcting the Secret) resumes the shard exactly where it was.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EXIT_ENVIRONMENT", "EnvironmentProblem", "TemplateRefused"]

EXIT_ENVIRONMENT = 3
"""Exit code of ``taskshard-shard run`` for an :class:`EnvironmentProblem`."""


class EnvironmentProblem(RuntimeError):
    """Something the config names cannot be used. ``reason``: a CamelCase code for the shard's status
    (e.g. ``SourceTopicMissing``); ``field``: the config field to look at (e.g. ``source.kafka.topic``)."""

    def __init__(self, reason: str, field: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.field = field

    def termination(self, shard: str) -> dict[str, Any]:
        """The termination-message payload (:class:`spark_runtime.protocol.FailureSummary`)."""
        from spark_runtime.protocol import FailureSummary

        return FailureSummary(shard, str(self), reason=self.reason, field=self.field).to_json()


class TemplateRefused(RuntimeError):
    """The shard's template cannot run on its state (e.g. ``StateSchemaIncompatible``: the processor's new state
    schema would misread the stored state), found before anything is processed. The runtime exits 0 with a
    ``refused`` summary: restarting the same template would refuse again, so the operator keeps the shard stopped
    with the reason until the Task's template changes (:data:`spark_runtime.protocol.SummaryEvent.REFUSED`)."""

    def __init__(self, reason: str, field: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.field = field

    def termination(self, shard: str) -> dict[str, Any]:
        from spark_runtime.protocol import FailureSummary, SummaryEvent

        return FailureSummary(
            shard, str(self), reason=self.reason, field=self.field, event=SummaryEvent.REFUSED
        ).to_json()
