"""The executor pods' entry point, the driver's client-mode settings, and the local DNS stand-in (pure parts)."""

from __future__ import annotations

import pytest

from localkube.clusterdns import render_hosts, slice_addresses
from spark_runtime.__main__ import main
from spark_runtime.kubernetes import (
    EXECUTOR_BACKEND,
    LOCAL_DRIVER_CONF,
    POD_IP_ENV,
    ExecutorEnvError,
    driver_conf,
    executor_command,
    in_cluster_master,
)

EXECUTOR_ENV = {
    "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@t-0-8-driver-svc.ns.svc:7078",
    "SPARK_EXECUTOR_ID": "2",
    "SPARK_EXECUTOR_CORES": "1",
    "SPARK_EXECUTOR_MEMORY": "512m",
    "SPARK_APPLICATION_ID": "spark-application-1",
    "SPARK_RESOURCE_PROFILE_ID": "0",
    "SPARK_EXECUTOR_POD_IP": "10.1.2.3",
    "SPARK_EXECUTOR_POD_NAME": "t-0-8-exec-2",
    "SPARK_JAVA_OPT_1": "-Dspark.driver.port=7078",
    "SPARK_JAVA_OPT_0": "-Xss32m",
    "SPARK_JAVA_OPT_10": "-Dspark.last=1",
    "SPARK_CLASSPATH": "/opt/taskshard/jars/a.jar:/opt/taskshard/jars/b.jar",
    "JAVA_HOME": "/usr/lib/jvm/java-17",
}


def test_executor_command_from_the_variables_spark_sets(tmp_path):
    cmd = executor_command(EXECUTOR_ENV, jars_dir=tmp_path)
    assert cmd[:6] == [
        "/usr/lib/jvm/java-17/bin/java",
        "-Xms512m",
        "-Xmx512m",
        "-Xss32m",
        "-Dspark.driver.port=7078",
        "-Dspark.last=1",
    ], "the JVM options in their numbered order (0, 1, 10), after the heap"
    assert cmd[6] == "-Dspark.master=k8s://https://kubernetes.default.svc", (
        "Spark reads the authentication key's file only for a Kubernetes master, which an executor starts without"
    )
    assert cmd[7:9] == ["-cp", f"/opt/taskshard/jars/a.jar:/opt/taskshard/jars/b.jar:{tmp_path}/*"]
    args = dict(zip(cmd[10::2], cmd[11::2], strict=True))
    assert cmd[9] == EXECUTOR_BACKEND
    assert args == {
        "--driver-url": EXECUTOR_ENV["SPARK_DRIVER_URL"],
        "--executor-id": "2",
        "--cores": "1",
        "--app-id": "spark-application-1",
        "--hostname": "10.1.2.3",
        "--resourceProfileId": "0",
        "--podName": "t-0-8-exec-2",
    }


@pytest.mark.parametrize("missing", ["SPARK_DRIVER_URL", "SPARK_EXECUTOR_ID", "SPARK_EXECUTOR_POD_IP"])
def test_a_missing_variable_is_named(missing, capsys):
    env = {k: v for k, v in EXECUTOR_ENV.items() if k != missing}
    with pytest.raises(ExecutorEnvError, match=missing):
        executor_command(env)


def test_the_executor_subcommand_outside_an_executor_pod_exits_2(monkeypatch, capsys):
    for name in EXECUTOR_ENV:
        monkeypatch.delenv(name, raising=False)
    assert main(["executor"]) == 2
    assert "SPARK_DRIVER_URL is not set" in capsys.readouterr().err


def test_driver_conf_in_a_pod(tmp_path):
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text("c")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "6443", POD_IP_ENV: "10.1.0.7"}
    master, conf = driver_conf("k8s://https://kubernetes.default.svc:443", env, sa_dir=str(tmp_path))
    assert master == "k8s://https://10.0.0.1:6443"
    assert conf == {
        "spark.kubernetes.authenticate.oauthTokenFile": str(tmp_path / "token"),
        "spark.kubernetes.authenticate.caCertFile": str(tmp_path / "ca.crt"),
        "spark.driver.bindAddress": "10.1.0.7",
        "spark.blockManager.bindAddress": "10.1.0.7",
    }
    assert driver_conf("local[2]", env, sa_dir=str(tmp_path)) == ("local[2]", LOCAL_DRIVER_CONF), "local: loopback only"
    assert set(LOCAL_DRIVER_CONF.values()) == {"127.0.0.1"}
    outside = driver_conf("k8s://https://kubernetes.default.svc:443", {}, sa_dir=str(tmp_path / "none"))
    assert outside == ("k8s://https://kubernetes.default.svc:443", {})
    assert in_cluster_master({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT_HTTPS": "443"}) == (
        "k8s://https://[fd00::1]:443"
    )


def test_the_dns_stand_in_lists_ready_and_serving_endpoints():
    endpoint_slice = {
        "endpoints": [
            {"addresses": ["127.1.0.5"], "conditions": {"ready": True}},
            {"addresses": ["127.1.0.6"], "conditions": {"ready": False, "serving": False}},
            {"addresses": ["127.1.0.7"], "conditions": {"ready": False, "serving": True}},
            {"addresses": ["127.1.0.8"]},
        ]
    }
    assert slice_addresses(endpoint_slice) == ["127.1.0.5", "127.1.0.7", "127.1.0.8"]
    text = render_hosts("127.0.0.1 localhost\n", {("ns", "t-0-8-driver-svc"): ["127.1.0.5"]})
    assert text.splitlines()[0] == "127.0.0.1 localhost"
    assert "127.1.0.5 t-0-8-driver-svc.ns.svc.cluster.local t-0-8-driver-svc.ns.svc t-0-8-driver-svc.ns" in text
