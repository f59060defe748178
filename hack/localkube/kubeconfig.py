"""Writing kubeconfig files for the local cluster's clients."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_kubeconfig(
    path: Path,
    server: str,
    ca_file: str,
    *,
    user: str,
    cert: str | None = None,
    key: str | None = None,
    token_file: str | None = None,
    namespace: str | None = None,
) -> None:
    """Write a one-context kubeconfig that authenticates with a client certificate or a bearer-token file."""
    credentials = {"tokenFile": token_file} if token_file else {"client-certificate": cert, "client-key": key}
    context = {"cluster": "localkube", "user": user}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "localkube", "cluster": {"server": server, "certificate-authority": ca_file}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "localkube", "context": context}],
        "current-context": "localkube",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
