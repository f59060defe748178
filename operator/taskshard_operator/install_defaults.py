"""What the Helm release sets for Tasks that leave it open: the chart's values reach the operator as environment
variables (templates/deployment.yaml), and every Task spec the operator parses is completed with them
(:func:`taskshard_operator.cache.parse_task`), so the shard pods, ConfigMaps and the template hash all see one
effective spec. A Task's own value always wins.

- ``shardServiceAccount`` (with ``create: true``): ``TASKSHARD_DEFAULT_SHARD_SERVICE_ACCOUNT`` and
  ``TASKSHARD_DEFAULT_SHARD_SERVICE_ACCOUNT_NAMESPACES`` fill ``spark.serviceAccountName`` of the Tasks in the
  namespaces where the chart created the account;
- ``storage.s3.endpoint``: ``TASKSHARD_DEFAULT_S3_ENDPOINT`` fills ``storage.s3.endpoint``;
- ``storage.s3.credentialsSecret``: ``TASKSHARD_DEFAULT_S3_CREDENTIALS_SECRET`` fills
  ``storage.s3.credentialsSecret``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass

from taskshard_operator.models import TaskSpec

__all__ = ["InstallDefaults", "install_defaults"]

SERVICE_ACCOUNT_ENV = "TASKSHARD_DEFAULT_SHARD_SERVICE_ACCOUNT"
SERVICE_ACCOUNT_NAMESPACES_ENV = "TASKSHARD_DEFAULT_SHARD_SERVICE_ACCOUNT_NAMESPACES"
S3_ENDPOINT_ENV = "TASKSHARD_DEFAULT_S3_ENDPOINT"
S3_CREDENTIALS_SECRET_ENV = "TASKSHARD_DEFAULT_S3_CREDENTIALS_SECRET"


@dataclass(frozen=True)
class InstallDefaults:
    """The release's defaults for Task fields (see the module docstring); None: no default."""

    shard_service_account: str | None = None
    service_account_namespaces: frozenset[str] = frozenset()
    """Where the chart created the shard ServiceAccount (the default applies only to Tasks there)."""
    s3_endpoint: str | None = None
    s3_credentials_secret: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> InstallDefaults:
        namespaces = (env.get(SERVICE_ACCOUNT_NAMESPACES_ENV) or "").split(",")
        return cls(
            shard_service_account=env.get(SERVICE_ACCOUNT_ENV) or None,
            service_account_namespaces=frozenset(n.strip() for n in namespaces if n.strip()),
            s3_endpoint=env.get(S3_ENDPOINT_ENV) or None,
            s3_credentials_secret=env.get(S3_CREDENTIALS_SECRET_ENV) or None,
        )

    def apply(self, spec: TaskSpec, namespace: str | None) -> TaskSpec:
        """``spec`` with the fields it leaves open filled in (the same object when nothing applies)."""
        updates: dict[str, object] = {}
        account = self.shard_service_account
        if account and spec.spark.service_account_name is None and namespace in self.service_account_namespaces:
            updates["spark"] = spec.spark.model_copy(update={"service_account_name": account})
        s3 = spec.storage.s3
        if s3 is not None:
            fill = {
                "endpoint": s3.endpoint or self.s3_endpoint,
                "credentials_secret": s3.credentials_secret or self.s3_credentials_secret,
            }
            if fill != {"endpoint": s3.endpoint, "credentials_secret": s3.credentials_secret}:
                updates["storage"] = spec.storage.model_copy(update={"s3": s3.model_copy(update=fill)})
        return spec.model_copy(update=updates) if updates else spec


@functools.cache
def install_defaults() -> InstallDefaults:
    """This operator process's defaults (its environment, read once)."""
    return InstallDefaults.from_env(os.environ)
