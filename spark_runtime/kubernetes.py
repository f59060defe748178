"""Spark executors on Kubernetes: the driver's client-mode settings and the executor pods' entry point.

A shard whose Task asks for ``spark.executors.instances > 0`` runs its driver in client mode inside its pod
(master ``k8s://...``); Spark's own Kubernetes scheduler backend creates the executor pods from the template the
operator wrote (``spark.kubernetes.executor.podTemplateFile``), owned by the driver pod, and replaces an executor
that dies. This module holds the two halves that depend on the pod they run in.

**Driver** (:func:`driver_conf`, applied by the runner before its SparkSession starts):

- the master is the API server every pod can reach, ``k8s://https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``
  (the variables every kubelet sets), not a DNS name;
- the driver authenticates with its pod's service-account token and the cluster CA
  (``spark.kubernetes.authenticate.oauthTokenFile`` / ``caCertFile``, Spark's client-mode settings), mounted at
  :data:`SERVICE_ACCOUNT_DIR`;
- it binds its RPC and block-manager ports to the pod's own IP (``$TASKSHARD_POD_IP``, the downward API's
  ``status.podIP``) and advertises the headless Service of its pod (``spark.driver.host``, set by the operator),
  through which executors connect back.

**Executor** (:func:`executor_command`; the template's command is ``python -m spark_runtime`` and Spark appends
the argument ``executor``): Spark puts these variables on every executor container (``BasicExecutorFeatureStep``)
and the entry point turns them into the JVM command the Spark image's entrypoint would run:

==============================  ===========================================================================
``SPARK_DRIVER_URL``            the driver's scheduler endpoint (``spark://CoarseGrainedScheduler@host:port``)
``SPARK_EXECUTOR_ID``           this executor's id (1, 2, ...; a replacement gets a new one)
``SPARK_EXECUTOR_CORES``        task slots
``SPARK_EXECUTOR_MEMORY``       heap size (``-Xms``/``-Xmx``), e.g. ``1024m``
``SPARK_APPLICATION_ID``        the application's id
``SPARK_RESOURCE_PROFILE_ID``   the resource profile (0: the default)
``SPARK_EXECUTOR_POD_IP``       the pod's IP (downward API): the executor binds and advertises it
``SPARK_EXECUTOR_POD_NAME``     the pod's name
``SPARK_JAVA_OPT_<n>``          JVM options: ``spark.executor.extraJavaOptions`` and the start-up confs
``SPARK_CLASSPATH``             ``spark.executor.extraClassPath`` (connector jars), before Spark's own jars
``SPARK_CONF_DIR``, ``SPARK_USER``  passed through to the JVM
==============================  ===========================================================================

Spark's jars are the ones of the PySpark installation the image runs (``pyspark/jars``), so driver and
executors always run the same Spark.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "EXECUTOR_BACKEND",
    "ExecutorEnvError",
    "POD_IP_ENV",
    "SERVICE_ACCOUNT_DIR",
    "driver_conf",
    "executor_command",
    "in_cluster_master",
    "spark_jars_dir",
]

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
POD_IP_ENV = "TASKSHARD_POD_IP"
"""The pod's IP (downward API ``status.podIP``) in the driver container."""
EXECUTOR_BACKEND = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
REQUIRED_EXECUTOR_ENV = (
    "SPARK_DRIVER_URL",
    "SPARK_EXECUTOR_ID",
    "SPARK_EXECUTOR_CORES",
    "SPARK_EXECUTOR_MEMORY",
    "SPARK_APPLICATION_ID",
    "SPARK_EXECUTOR_POD_IP",
)
LOCAL_DRIVER_CONF = {
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.blockManager.bindAddress": "127.0.0.1",
}
"""A local-mode driver's RPC and block manager listen on loopback only."""
_JAVA_OPT = re.compile(r"^SPARK_JAVA_OPT_(\d+)$")


class ExecutorEnvError(RuntimeError):
    """An executor container lacks a variable Spark sets on executor pods (the message names it)."""


def in_cluster_master(env: Mapping[str, str]) -> str | None:
    """``k8s://https://<host>:<port>`` from the kubelet's ``KUBERNETES_SERVICE_*`` variables (None: not in a pod)."""
    host = env.get("KUBERNETES_SERVICE_HOST")
    port = env.get("KUBERNETES_SERVICE_PORT_HTTPS") or env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    if ":" in host and not host.startswith("["):  # an IPv6 address
        host = f"[{host}]"
    return f"k8s://https://{host}:{port}"


def driver_conf(master: str, env: Mapping[str, str], sa_dir: str = SERVICE_ACCOUNT_DIR) -> tuple[str, dict[str, str]]:
    """The master and the Spark conf a client-mode driver in a pod adds for ``master`` (``k8s://...``): the
    in-cluster API server, the service-account credentials (when mounted) and the pod-IP bind address.
    A local master (no executors) gets the loopback address for the driver's RPC and block manager: nothing
    outside the pod needs them, so nothing outside can reach them. Another master is returned unchanged with no
    conf. The Task's own ``spark.conf`` wins over this (it may not set these keys: they are reserved)."""
    if master.startswith("local"):
        return master, dict(LOCAL_DRIVER_CONF)
    if not master.startswith("k8s://"):
        return master, {}
    conf: dict[str, str] = {}
    master = in_cluster_master(env) or master
    token, ca = Path(sa_dir) / "token", Path(sa_dir) / "ca.crt"
    if token.is_file():
        conf["spark.kubernetes.authenticate.oauthTokenFile"] = str(token)
    if ca.is_file():
        conf["spark.kubernetes.authenticate.caCertFile"] = str(ca)
    pod_ip = env.get(POD_IP_ENV)
    if pod_ip:
        conf["spark.driver.bindAddress"] = pod_ip
        conf["spark.blockManager.bindAddress"] = pod_ip
    return master, conf


def spark_jars_dir() -> Path:
    """The jars of the installed PySpark (the Spark the driver runs)."""
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def executor_command(env: Mapping[str, str], java: str | None = None, jars_dir: Path | None = None) -> list[str]:
    """The JVM command of an executor from the variables Spark sets on its pod (see the module docstring).
    Raises :class:`ExecutorEnvError` naming the first missing variable."""
    for name in REQUIRED_EXECUTOR_ENV:
        if not env.get(name):
            raise ExecutorEnvError(
                f"{name} is not set: this container is not an executor pod Spark created "
                "(run 'python -m spark_runtime executor' only as the command of the executor pod template)"
            )
    java = java or (str(Path(env["JAVA_HOME"]) / "bin" / "java") if env.get("JAVA_HOME") else "java")
    jars = jars_dir or spark_jars_dir()
    classpath = [p for p in (env.get("SPARK_CLASSPATH") or "").split(os.pathsep) if p] + [f"{jars}/*"]
    if env.get("SPARK_CONF_DIR") and Path(env["SPARK_CONF_DIR"]).is_dir():  # log4j2 settings, as Spark's image
        classpath.insert(0, env["SPARK_CONF_DIR"])
    memory = env["SPARK_EXECUTOR_MEMORY"]
    numbered = []
    for name, value in env.items():
        if m := _JAVA_OPT.match(name):
            numbered.append((int(m.group(1)), value))
    options = [value for _, value in sorted(numbered)]
    if not any(o.startswith("-Dspark.master=") for o in options):
        # Spark reads the authentication key from spark.authenticate.secret.file only when spark.master names
        # Kubernetes (SecurityManager.secretKeyFromFile), and an executor starts without the master: the driver's
        # conf, which has it, arrives only after the key got the executor in.
        options.append(f"-Dspark.master={in_cluster_master(env) or 'k8s://https://kubernetes.default.svc'}")
    return [
        java,
        f"-Xms{memory}",
        f"-Xmx{memory}",
        *options,
        "-cp",
        os.pathsep.join(classpath),
        EXECUTOR_BACKEND,
        "--driver-url",
        env["SPARK_DRIVER_URL"],
        "--executor-id",
        env["SPARK_EXECUTOR_ID"],
        "--cores",
        env["SPARK_EXECUTOR_CORES"],
        "--app-id",
        env["SPARK_APPLICATION_ID"],
        "--hostname",
        env["SPARK_EXECUTOR_POD_IP"],
        "--resourceProfileId",
        env.get("SPARK_RESOURCE_PROFILE_ID") or "0",
        "--podName",
        env.get("SPARK_EXECUTOR_POD_NAME") or "",
    ]
