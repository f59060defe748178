"""The local control plane and node agent behave like a real cluster where the product depends on it."""

from __future__ import annotations

import json
import textwrap
import urllib.request

import pytest

from tests.cluster.conftest import pod_log
from tests.waiting import get_json, wait_for

pytestmark = pytest.mark.cluster


def pods(kubectl, selector: str) -> list[dict]:
    return get_json(kubectl, "pods", "-l", selector)["items"]


def test_deployment_creates_replicaset_and_pod_that_runs(kube_cluster, namespace, kubectl):
    manifest = textwrap.dedent("""
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: hello}
        spec:
          replicas: 1
          selector: {matchLabels: {app: hello}}
          template:
            metadata: {labels: {app: hello}}
            spec:
              containers:
              - name: main
                image: example.invalid/hello:1
                command: ["sh", "-c", "echo hello from $(POD_NAME) in $(POD_NAMESPACE); sleep 2"]
                env:
                - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
                - {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
    """)
    kubectl("apply", "-f", "-", input=manifest)
    rs = wait_for(lambda: get_json(kubectl, "replicasets", "-l", "app=hello")["items"], 60, "a ReplicaSet")
    assert rs[0]["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    pod = wait_for(lambda: pods(kubectl, "app=hello"), 60, "a Pod of the ReplicaSet")[0]
    name = pod["metadata"]["name"]
    assert pod["metadata"]["ownerReferences"][0]["name"] == rs[0]["metadata"]["name"]

    def completed_once():
        status = get_json(kubectl, "pod", name)["status"]
        statuses = status.get("containerStatuses") or [{}]
        last = statuses[0].get("lastState", {}).get("terminated") or statuses[0].get("state", {}).get("terminated")
        return last if last and last["exitCode"] == 0 else None

    terminated = wait_for(completed_once, 90, "the container to run to completion")
    assert terminated["reason"] == "Completed"
    assert f"hello from {name} in {namespace}" in pod_log(kube_cluster, namespace, name, "main")


def test_on_failure_pod_is_restarted_and_reports_exit_code_and_message(kube_cluster, namespace, kubectl):
    manifest = textwrap.dedent("""
        apiVersion: v1
        kind: Pod
        metadata: {name: flaky}
        spec:
          restartPolicy: OnFailure
          containers:
          - name: main
            image: example.invalid/flaky:1
            command: ["sh", "-c", "echo 'gave up: disk on fire' > /dev/termination-log; exit 3"]
    """)
    kubectl("apply", "-f", "-", input=manifest)

    def restarted_twice():
        statuses = get_json(kubectl, "pod", "flaky")["status"].get("containerStatuses") or [{}]
        return statuses[0] if statuses[0].get("restartCount", 0) >= 2 else None

    status = wait_for(restarted_twice, 90, "restartCount >= 2")
    last = status["lastState"]["terminated"]
    assert last["exitCode"] == 3
    assert last["reason"] == "Error"
    assert last["message"].strip() == "gave up: disk on fire"
    assert get_json(kubectl, "pod", "flaky")["status"]["phase"] == "Running"


def test_never_pod_fails_and_succeeded_pod_succeeds(namespace, kubectl):
    for name, code in (("ok", 0), ("bad", 7)):
        kubectl(
            "run", name, "--image=example.invalid/x:1", "--restart=Never", "--command", "--", "sh", "-c", f"exit {code}"
        )
    wait_for(lambda: get_json(kubectl, "pod", "ok")["status"]["phase"] == "Succeeded", 60, "pod ok Succeeded")
    wait_for(lambda: get_json(kubectl, "pod", "bad")["status"]["phase"] == "Failed", 60, "pod bad Failed")
    state = get_json(kubectl, "pod", "bad")["status"]["containerStatuses"][0]
    assert state["state"]["terminated"]["exitCode"] == 7
    assert state["restartCount"] == 0


def test_env_sources_and_volumes_are_visible_to_the_container(kube_cluster, namespace, kubectl, tmp_path):
    host_dir = tmp_path / "host"
    manifest = textwrap.dedent(f"""
        apiVersion: v1
        kind: ConfigMap
        metadata: {{name: settings}}
        data: {{mode: fast, "app.conf": "level=3"}}
        ---
        apiVersion: v1
        kind: Secret
        metadata: {{name: creds}}
        stringData: {{password: s3cret}}
        ---
        apiVersion: v1
        kind: PersistentVolumeClaim
        metadata: {{name: data}}
        spec: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}}}
        ---
        apiVersion: v1
        kind: Pod
        metadata: {{name: reader, annotations: {{drain: "no"}}}}
        spec:
          restartPolicy: Never
          containers:
          - name: main
            image: example.invalid/reader:1
            command: ["sh", "-c"]
            args:
            - |
              echo "mode=$MODE password=$PASSWORD literal=$LITERAL"
              echo "conf=$(cat /etc/app/app.conf) secret=$(cat /etc/creds/password)"
              echo "annotation=$(cat /etc/podinfo/drain)"
              echo written > /scratch/x && echo "scratch=$(cat /scratch/x)"
              echo from-pod > /host/out.txt
              echo pvc-data > /data/file.txt
              pwd
            workingDir: /tmp
            env:
            - {{name: LITERAL, value: "$(MODE)-literal"}}
            - {{name: MODE, valueFrom: {{configMapKeyRef: {{name: settings, key: mode}}}}}}
            - {{name: PASSWORD, valueFrom: {{secretKeyRef: {{name: creds, key: password}}}}}}
            volumeMounts:
            - {{name: conf, mountPath: /etc/app}}
            - {{name: creds, mountPath: /etc/creds}}
            - {{name: podinfo, mountPath: /etc/podinfo}}
            - {{name: scratch, mountPath: /scratch}}
            - {{name: host, mountPath: /host}}
            - {{name: data, mountPath: /data}}
            - {{name: tmp, mountPath: /tmp}}
          volumes:
          - {{name: tmp, emptyDir: {{}}}}
          - {{name: conf, configMap: {{name: settings}}}}
          - {{name: creds, secret: {{secretName: creds}}}}
          - name: podinfo
            downwardAPI: {{items: [{{path: drain, fieldRef: {{fieldPath: "metadata.annotations['drain']"}}}}]}}
          - {{name: scratch, emptyDir: {{}}}}
          - {{name: host, hostPath: {{path: {host_dir}, type: DirectoryOrCreate}}}}
          - {{name: data, persistentVolumeClaim: {{claimName: data}}}}
    """)
    kubectl("apply", "-f", "-", input=manifest)
    wait_for(lambda: get_json(kubectl, "pod", "reader")["status"]["phase"] == "Succeeded", 90, "reader Succeeded")
    out = pod_log(kube_cluster, namespace, "reader", "main")
    # $(MODE) is not expanded: MODE is defined after LITERAL (Kubernetes semantics).
    assert "mode=fast password=s3cret literal=$(MODE)-literal" in out
    assert "conf=level=3 secret=s3cret" in out
    assert "annotation=no" in out
    assert "scratch=written" in out
    assert "\n/tmp\n" in out
    assert (host_dir / "out.txt").read_text() == "from-pod\n"
    pvc = get_json(kubectl, "pvc", "data")
    assert pvc["status"]["phase"] == "Bound"


def test_graceful_delete_sends_sigterm_then_removes_the_pod(kube_cluster, namespace, kubectl):
    manifest = textwrap.dedent("""
        apiVersion: v1
        kind: Pod
        metadata: {name: graceful}
        spec:
          terminationGracePeriodSeconds: 20
          containers:
          - name: main
            image: example.invalid/graceful:1
            command: ["sh", "-c", "trap 'echo got SIGTERM; exit 0' TERM; echo started; while true; do sleep 0.2; done"]
    """)
    kubectl("apply", "-f", "-", input=manifest)
    wait_for(lambda: "started" in pod_log(kube_cluster, namespace, "graceful", "main"), 60, "container start")
    kubectl("delete", "pod", "graceful", "--wait=true", "--timeout=60s")
    assert "got SIGTERM" in pod_log(kube_cluster, namespace, "graceful", "main")
    assert kubectl("get", "pod", "graceful", check=False).returncode != 0


def test_deleting_a_namespace_removes_its_objects(kube_cluster):
    ns = "gc-check"
    kube_cluster.kubectl("create", "namespace", ns)
    kube_cluster.kubectl(
        "create", "deployment", "web", "--image=example.invalid/web:1", "-n", ns, "--", "sh", "-c", "sleep 3600"
    )
    kube_cluster.kubectl("create", "configmap", "cfg", "--from-literal=a=b", "-n", ns)
    wait_for(lambda: kube_cluster.kubectl("get", "pods", "-n", ns, "-o", "name").stdout.strip(), 60, "a pod")
    kube_cluster.kubectl("delete", "namespace", ns, "--wait=false")
    wait_for(
        lambda: kube_cluster.kubectl("get", "namespace", ns, check=False).returncode != 0,
        120,
        "the namespace and everything in it to be deleted",
    )


def test_crd_applies_and_schema_violations_are_rejected(kube_cluster, namespace, kubectl):
    crd = textwrap.dedent("""
        apiVersion: apiextensions.k8s.io/v1
        kind: CustomResourceDefinition
        metadata: {name: widgets.check.localkube.test}
        spec:
          group: check.localkube.test
          scope: Namespaced
          names: {plural: widgets, singular: widget, kind: Widget}
          versions:
          - name: v1
            served: true
            storage: true
            schema:
              openAPIV3Schema:
                type: object
                properties:
                  spec:
                    type: object
                    required: [size]
                    properties:
                      size: {type: integer, minimum: 1, maximum: 10}
    """)
    kube_cluster.kubectl("apply", "-f", "-", input=crd)
    kube_cluster.kubectl("wait", "--for=condition=Established", "crd/widgets.check.localkube.test", "--timeout=60s")
    good = "apiVersion: check.localkube.test/v1\nkind: Widget\nmetadata: {name: ok}\nspec: {size: 3}\n"
    wait_for(lambda: kubectl("apply", "-f", "-", input=good, check=False).returncode == 0, 30, "a valid Widget")
    bad = good.replace("name: ok", "name: bad").replace("size: 3", "size: 42")
    result = kubectl("apply", "-f", "-", input=bad, check=False)
    assert result.returncode != 0
    assert "spec.size" in result.stderr and "should be less than or equal to 10" in result.stderr


def test_in_cluster_client_has_its_service_accounts_rbac_not_admin(kube_cluster, namespace, kubectl):
    script = textwrap.dedent(f"""
        import os
        from kubernetes import client, config
        from kubernetes.client.exceptions import ApiException
        loaders = {{
            "incluster": config.load_incluster_config,
            "kubeconfig": lambda: config.load_kube_config(config_file=os.environ["KUBECONFIG"]),
        }}
        for how, load in loaders.items():
            load()
            core = client.CoreV1Api()
            names = [c.metadata.name for c in core.list_namespaced_config_map("{namespace}").items]
            print(how, "configmaps:", ",".join(sorted(names)))
            try:
                core.list_namespaced_secret("{namespace}")
                print(how, "secrets: allowed")
            except ApiException as e:
                print(how, "secrets:", e.status)
    """)
    manifest = textwrap.dedent(f"""
        apiVersion: v1
        kind: ServiceAccount
        metadata: {{name: reader}}
        ---
        apiVersion: rbac.authorization.k8s.io/v1
        kind: Role
        metadata: {{name: read-configmaps}}
        rules: [{{apiGroups: [""], resources: [configmaps], verbs: [get, list]}}]
        ---
        apiVersion: rbac.authorization.k8s.io/v1
        kind: RoleBinding
        metadata: {{name: reader-reads-configmaps}}
        roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: read-configmaps}}
        subjects: [{{kind: ServiceAccount, name: reader, namespace: {namespace}}}]
        ---
        apiVersion: v1
        kind: ConfigMap
        metadata: {{name: visible}}
        data: {{a: b}}
        ---
        apiVersion: v1
        kind: Pod
        metadata: {{name: client}}
        spec:
          serviceAccountName: reader
          restartPolicy: Never
          containers:
          - name: main
            image: example.invalid/client:1
            command: ["python", "-c", {json.dumps(script)}]
            volumeMounts: [{{name: tmp, mountPath: /tmp}}]
          volumes: [{{name: tmp, emptyDir: {{}}}}]
    """)
    kubectl("apply", "-f", "-", input=manifest)
    wait_for(
        lambda: get_json(kubectl, "pod", "client")["status"]["phase"] in ("Succeeded", "Failed"),
        90,
        "the client pod to finish",
    )
    out = pod_log(kube_cluster, namespace, "client", "main")
    assert get_json(kubectl, "pod", "client")["status"]["phase"] == "Succeeded", out
    for how in ("incluster", "kubeconfig"):
        assert "visible" in out.split(f"{how} configmaps:")[1].splitlines()[0], out
        assert f"{how} secrets: 403" in out, out


def test_readiness_probe_gates_ready_and_failed_liveness_restarts(kube_cluster, namespace, kubectl):
    from localkube.cluster import free_port

    port = free_port()
    manifest = textwrap.dedent(f"""
        apiVersion: v1
        kind: Pod
        metadata: {{name: probed}}
        spec:
          containers:
          - name: web
            image: example.invalid/web:1
            command: ["sh", "-c", "sleep 4; exec python -m http.server {port} --bind 0.0.0.0"]
            ports: [{{name: http, containerPort: {port}}}]
            readinessProbe: {{httpGet: {{port: http, path: /}}, periodSeconds: 1}}
          - name: doomed
            image: example.invalid/doomed:1
            command: ["sleep", "3600"]
            livenessProbe: {{exec: {{command: ["false"]}}, periodSeconds: 1, failureThreshold: 2}}
    """)
    kubectl("apply", "-f", "-", input=manifest)

    def statuses():
        return {c["name"]: c for c in get_json(kubectl, "pod", "probed")["status"].get("containerStatuses") or []}

    wait_for(lambda: statuses().get("web", {}).get("state", {}).get("running"), 60, "web running")
    assert statuses()["web"]["ready"] is False, "not ready before the server listens"
    wait_for(lambda: statuses()["web"]["ready"], 60, "web ready once its HTTP probe succeeds")
    doomed = wait_for(lambda: (s := statuses()["doomed"]) and s["restartCount"] >= 1 and s, 60, "a liveness restart")
    assert doomed["lastState"]["terminated"]["exitCode"] == 137


SERVE_ON_POD_IP = """
import http.server, os, sys
ip, name, port = os.environ["POD_IP"], os.environ["POD_NAME"], int(sys.argv[1])
body = f"{name} ip={ip} ips={os.environ['POD_IPS']}".encode()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer((ip, port), Handler).serve_forever()
"""


def test_each_pod_has_its_own_ip_so_pods_can_bind_the_same_port(kube_cluster, namespace, kubectl):
    from localkube.cluster import free_port

    port = free_port()
    pod = textwrap.dedent(f"""
        apiVersion: v1
        kind: Pod
        metadata: {{name: __POD__}}
        spec:
          containers:
          - name: web
            image: example.invalid/web:1
            command: ["python", "-c", {json.dumps(SERVE_ON_POD_IP)}, "{port}"]
            env:
            - {{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}
            - {{name: POD_IPS, valueFrom: {{fieldRef: {{fieldPath: status.podIPs}}}}}}
            - {{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
            ports: [{{name: metrics, containerPort: {port}}}]
            readinessProbe: {{httpGet: {{port: metrics, path: /}}, periodSeconds: 1}}
    """)
    names = ("web-a", "web-b")
    kubectl("apply", "-f", "-", input="---\n".join(pod.replace("__POD__", name) for name in names))

    def ready(name: str) -> dict | None:
        status = get_json(kubectl, "pod", name)["status"]
        conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
        return status if conditions.get("Ready") == "True" else None

    statuses = {
        name: wait_for(lambda n=name: ready(n), 90, f"{name} Ready through its httpGet probe") for name in names
    }
    ips = {name: status["podIP"] for name, status in statuses.items()}
    assert len(set(ips.values())) == 2, ips
    for name, status in statuses.items():
        assert status["podIP"] != "127.0.0.1"
        assert status["podIPs"] == [{"ip": status["podIP"]}]
        assert status["hostIP"] == "127.0.0.1"
        assert status["containerStatuses"][0]["restartCount"] == 0, pod_log(kube_cluster, namespace, name, "web")
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for name, ip in ips.items():
        with no_proxy.open(f"http://{ip}:{port}/", timeout=10) as response:
            assert response.read().decode() == f"{name} ip={ip} ips={ip}"
