"""The Helm chart, checked with the real helm binary: lint, values schema, and what it renders."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from localkube.binaries import ensure_binaries

pytestmark = pytest.mark.cluster

CHART = Path(__file__).resolve().parents[2] / "charts" / "taskshard-operator"
KUBE_VERSION = "1.34.4"


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([ensure_binaries().helm, *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def render(*sets: str, namespace: str = "taskshard-system") -> list[dict]:
    args = ["template", "ts", str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def test_helm_lint_strict_passes():
    out = helm("lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART))
    assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("replicaCount=two", "/replicaCount"),
        ("watchNamespaces={Bad_NS}", "/watchNamespaces/0"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("probes.port=70000", "/probes/port"),
        ("storage.pvc.size=lots", "/storage/pvc/size"),
        ("logFormat=xml", "/logFormat"),
        ("clusterWide=yes", "/clusterWide"),
        ("unknownKey=1", "unknownKey"),
    ],
)
def test_values_schema_rejects_bad_values_naming_the_field(setting, complaint):
    result = helm("template", "ts", str(CHART), "--kube-version", KUBE_VERSION, "--set", setting, check=False)
    assert result.returncode != 0
    assert complaint in result.stderr


def test_more_than_one_replica_without_peering_is_refused_naming_the_values():
    result = helm(
        "template", "ts", str(CHART), "--kube-version", KUBE_VERSION,
        "--set", "replicaCount=2", "--set", "peering.enabled=false", check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "replicaCount: 2 replicas need peering.enabled=true" in result.stderr
    assert by_kind(render("replicaCount=2"), "Deployment")[0]["spec"]["replicas"] == 2  # with peering: fine
    assert by_kind(render("peering.enabled=false"), "Deployment")[0]["spec"]["strategy"]["type"] == "Recreate"


def test_operator_pod_meets_the_restricted_pod_security_standard():
    deployment = by_kind(render(), "Deployment")[0]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    for container in pod["containers"]:
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["port"] == "probes"
    assert {"name": "tmp", "mountPath": "/tmp"} in pod["containers"][0]["volumeMounts"]


ROLES = {
    "ts-taskshard-operator-framework",
    "ts-taskshard-operator-framework-namespaced",
    "ts-taskshard-operator-application",
}
MODES = {
    "default": (),
    "watchNamespaces": ("watchNamespaces={team-a,team-b}",),
    "clusterWide": ("clusterWide=true",),
}


def rules_of(role: dict) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def operator_args(docs: list[dict]) -> list[str]:
    return by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]


def test_namespaced_by_default_watching_only_the_release_namespace():
    docs = render(namespace="tasks-here")
    roles = {r["metadata"]["name"]: r for r in by_kind(docs, "ClusterRole")}
    assert set(roles) == ROLES
    application = roles["ts-taskshard-operator-application"]["rules"]
    groups = {g for rule in application for g in rule["apiGroups"]}
    assert groups == {"taskshard.io", "", "policy"}, "only TaskShard kinds, core objects and disruption budgets"
    on_secrets = {verb for rule in application if "secrets" in rule["resources"] for verb in rule["verbs"]}
    assert on_secrets == {"create"}, "the operator creates shards' Spark keys and never reads a Secret"
    assert not any("*" in rule["verbs"] or "*" in rule["resources"] for r in roles.values() for rule in r["rules"])
    # Cluster-wide: only Kopf's reads of cluster-scoped kinds (CRDs, namespaces); no ClusterKopfPeering grant.
    assert rules_of(roles["ts-taskshard-operator-framework"]) == {
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
        ("", "namespaces", "list"),
        ("", "namespaces", "watch"),
    }
    assert [b["metadata"]["name"] for b in by_kind(docs, "ClusterRoleBinding")] == ["ts-taskshard-operator-framework"]
    bindings = by_kind(docs, "RoleBinding")
    assert {(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in bindings} == {
        ("tasks-here", "ts-taskshard-operator-application"),
        ("tasks-here", "ts-taskshard-operator-framework-namespaced"),
    }
    assert all(
        b["subjects"] == [{"kind": "ServiceAccount", "name": "ts-taskshard-operator", "namespace": "tasks-here"}]
        for b in bindings
    )
    args = operator_args(docs)
    assert [a for a in args if a.startswith("--namespace") or a.startswith("--all")] == ["--namespace=tasks-here"]
    assert "--peering=taskshard" in args
    assert not by_kind(docs, "ClusterKopfPeering")
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in by_kind(docs, "KopfPeering")] == [
        ("tasks-here", "taskshard")
    ]
    shard_accounts = [a for a in by_kind(docs, "ServiceAccount") if a["metadata"]["name"] == "taskshard-shard"]
    assert [a["metadata"]["namespace"] for a in shard_accounts] == ["tasks-here"]
    (pod_monitor,) = by_kind(render("metrics.podMonitor.enabled=true", namespace="tasks-here"), "PodMonitor")
    assert pod_monitor["spec"]["namespaceSelector"] == {"matchNames": ["tasks-here"]}


def test_cluster_wide_is_an_explicit_opt_in():
    docs = render("clusterWide=true", "metrics.podMonitor.enabled=true")
    roles = {r["metadata"]["name"]: r for r in by_kind(docs, "ClusterRole")}
    assert set(roles) == ROLES
    assert {("kopf.dev", "clusterkopfpeerings", v) for v in ("list", "watch", "patch")} <= rules_of(
        roles["ts-taskshard-operator-framework"]
    )
    assert {(b["metadata"]["name"], b["roleRef"]["name"]) for b in by_kind(docs, "ClusterRoleBinding")} == {
        (name, name) for name in ROLES
    }
    assert not by_kind(docs, "RoleBinding")
    args = operator_args(docs)
    assert "--all-namespaces" in args and "--peering=taskshard" in args
    assert not [a for a in args if a.startswith("--namespace")]
    assert by_kind(docs, "ClusterKopfPeering")[0]["metadata"]["name"] == "taskshard"
    assert not by_kind(docs, "KopfPeering")
    shard_accounts = [a for a in by_kind(docs, "ServiceAccount") if a["metadata"]["name"] == "taskshard-shard"]
    assert [a["metadata"]["namespace"] for a in shard_accounts] == ["taskshard-system"]
    assert by_kind(docs, "PodMonitor")[0]["spec"]["namespaceSelector"] == {"any": True}


def test_cluster_wide_with_watch_namespaces_is_refused_naming_both_values():
    result = helm(
        "template", "ts", str(CHART), "--kube-version", KUBE_VERSION,
        "--set", "clusterWide=true", "--set", "watchNamespaces={team-a}", check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert 'clusterWide: true and watchNamespaces: ["team-a"] exclude each other' in result.stderr
    # Either alone renders; clusterWide=false with a list is the plain namespaced mode.
    assert "--namespace=team-a" in operator_args(render("clusterWide=false", "watchNamespaces={team-a}"))


@pytest.mark.parametrize("mode", sorted(MODES))
def test_the_application_role_grants_exactly_the_calls_the_operator_makes(mode):
    """The verbs come from the code: every public method of the operator's API wrapper declares its calls
    (``kube.API_VERBS``), Kopf's watches and finalizer patches are ``kube.KOPF_VERBS``; the chart grants those and
    nothing else (a new call without a grant, or a grant without a call, fails here), and binds that role to the
    operator's ServiceAccount wherever it watches, in every mode."""
    from taskshard_operator import kube

    methods = {n for n, v in vars(kube.Kube).items() if callable(v) and not n.startswith("_")}
    assert methods == set(kube.API_VERBS), "every API method declares its calls"
    used = {*kube.KOPF_VERBS, *(c for calls in kube.API_VERBS.values() for c in calls)}
    docs = render(*MODES[mode])
    roles = {r["metadata"]["name"]: r for r in by_kind(docs, "ClusterRole")}
    granted = rules_of(roles["ts-taskshard-operator-application"])
    assert granted == used, (sorted(granted - used), sorted(used - granted))
    # No other role grants any of the operator's own resources: the application role is the whole grant.
    others = set().union(*(rules_of(r) for n, r in roles.items() if n != "ts-taskshard-operator-application"))
    assert not {(g, r) for g, r, _ in others} & {(g, r) for g, r, _ in used}
    bound = [
        b
        for b in (*by_kind(docs, "ClusterRoleBinding"), *by_kind(docs, "RoleBinding"))
        if b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "ts-taskshard-operator-application"}
    ]  # fmt: skip
    expected = {"clusterWide": {("ClusterRoleBinding", None)}, "default": {("RoleBinding", "taskshard-system")}}
    expected["watchNamespaces"] = {("RoleBinding", "team-a"), ("RoleBinding", "team-b")}
    assert {(b["kind"], b["metadata"].get("namespace")) for b in bound} == expected[mode]
    assert all(
        b["subjects"] == [{"kind": "ServiceAccount", "name": "ts-taskshard-operator", "namespace": "taskshard-system"}]
        for b in bound
    )


def test_namespaced_watch_binds_roles_only_in_those_namespaces():
    docs = render("watchNamespaces={team-a,team-b}")
    bindings = by_kind(docs, "RoleBinding")
    assert {(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in bindings} == {
        (ns, f"ts-taskshard-operator-{role}")
        for ns in ("team-a", "team-b")
        for role in ("application", "framework-namespaced")
    }
    assert [b["metadata"]["name"] for b in by_kind(docs, "ClusterRoleBinding")] == ["ts-taskshard-operator-framework"]
    args = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args and "--all-namespaces" not in args
    peerings = by_kind(docs, "KopfPeering")
    assert {p["metadata"]["namespace"] for p in peerings} == {"team-a", "team-b"}
    shard_accounts = [a for a in by_kind(docs, "ServiceAccount") if a["metadata"]["name"] == "taskshard-shard"]
    assert {a["metadata"]["namespace"] for a in shard_accounts} == {"team-a", "team-b"}
    assert all(a["automountServiceAccountToken"] is False for a in shard_accounts)


def test_monitoring_pieces_render_when_enabled_and_the_dashboard_queries_real_metrics():
    import json
    import re

    from spark_runtime.live import Metric
    from taskshard_operator import metrics

    assert not [d for d in render("metrics.enabled=true") if "monitoring.coreos.com" in d["apiVersion"]]
    docs = render(
        "metrics.enabled=true", "metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true",
        "metrics.dashboard.enabled=true", "watchNamespaces={team-a}",
    )  # fmt: skip
    (pod_monitor,) = by_kind(docs, "PodMonitor")
    assert pod_monitor["spec"]["selector"]["matchLabels"] == {"taskshard.io/component": "shard"}
    assert pod_monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    (service_monitor,) = by_kind(docs, "ServiceMonitor")
    service = by_kind(docs, "Service")[0]
    labels = service["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service_monitor["spec"]["selector"]["matchLabels"].items())
    dashboard = next(d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard"))
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(dashboard["data"]["taskshard.json"])
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 12
    known = {str(m) for m in Metric} | {n.removesuffix("_total") for n in metrics.METRIC_NAMES}
    used = {re.sub(r"_(total|count|sum|bucket)$", "", n) for e in exprs for n in re.findall(r"taskshard_\w+", e)}
    assert used and used <= known, f"the dashboard queries unknown series: {sorted(used - known)}"
    shard_pod = builders_pod()
    assert {"name": "metrics", "containerPort": 9108} in shard_pod["spec"]["containers"][0]["ports"]


def builders_pod() -> dict:
    from spark_runtime.keygroups import KeyGroupRange
    from taskshard_operator import builders
    from taskshard_operator.models.task import TaskSpec

    spec = TaskSpec.from_k8s(
        {
            "maxKeyGroups": 16,
            "initialShards": 1,
            "processor": {"builtin": "count"},
            "source": {"journal": {"path": "/j", "partitions": 1}},
            "sink": {"directory": {"path": "/out"}},
            "storage": {"path": "/data"},
            "spark": {"image": "taskshard/shard:0.1.0"},
        }
    )
    return builders.build_pod(task="t", shard="t-0-16", key_groups=KeyGroupRange(0, 16), spec=spec, template_hash="h")


def test_optional_pieces_render_only_when_enabled():
    assert not by_kind(render(), "Service") and not by_kind(render(), "PersistentVolumeClaim")
    docs = render("metrics.enabled=true", "storage.pvc.create=true", "peering.enabled=false", "logFormat=json")
    assert by_kind(docs, "Service")[0]["spec"]["ports"][0]["targetPort"] == "metrics"
    container = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    assert "--metrics-port=9090" in container["args"] and "--log-format=json" in container["args"]
    pvc = by_kind(docs, "PersistentVolumeClaim")[0]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    args = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--standalone" in args
    assert by_kind(docs, "Deployment")[0]["spec"]["strategy"]["type"] == "Recreate"
    assert not by_kind(docs, "ClusterKopfPeering") and not by_kind(docs, "KopfPeering")


def test_network_policies_close_the_shard_pods_in_every_watched_namespace():
    """A driver's Spark ports only from executors, its metrics port only from the operator's pods (and
    networkPolicy.metricsFrom); executors only from drivers and executors; per watched namespace; off by value.
    The selectors are the labels the operator really puts on shard and executor pods."""
    from taskshard_operator import builders, naming

    docs = render(
        "watchNamespaces={streams,batch}",
        "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring",
    )
    policies = {(p["metadata"]["namespace"], p["metadata"]["name"]): p["spec"] for p in by_kind(docs, "NetworkPolicy")}
    assert set(policies) == {
        (ns, f"ts-taskshard-operator-shard-{w}") for ns in ("streams", "batch") for w in ("drivers", "executors")
    }
    drivers = policies[("streams", "ts-taskshard-operator-shard-drivers")]
    shard = {naming.LABEL_COMPONENT: naming.COMPONENT_SHARD}
    executor = {naming.LABEL_COMPONENT: naming.COMPONENT_EXECUTOR}
    assert drivers["podSelector"]["matchLabels"] == shard and drivers["policyTypes"] == ["Ingress"]
    spark_rule, metrics_rule = drivers["ingress"]
    assert spark_rule["from"] == [{"podSelector": {"matchLabels": executor}}]
    assert sorted(p["port"] for p in spark_rule["ports"]) == [builders.DRIVER_PORT, builders.BLOCK_MANAGER_PORT]
    operator_pods = by_kind(docs, "Deployment")[0]["spec"]["template"]["metadata"]["labels"]
    operator_peer, prometheus = metrics_rule["from"]
    assert operator_peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "taskshard-system"}
    assert operator_peer["podSelector"]["matchLabels"].items() <= operator_pods.items()
    assert prometheus == {"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}
    from spark_runtime.live import METRICS_PORT

    assert [p["port"] for p in metrics_rule["ports"]] == [METRICS_PORT]
    executors = policies[("batch", "ts-taskshard-operator-shard-executors")]
    assert executors["podSelector"]["matchLabels"] == executor
    assert executors["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": shard}}, {"podSelector": {"matchLabels": executor}}]}
    ]
    assert not by_kind(render("networkPolicy.enabled=false"), "NetworkPolicy")


def test_the_release_hands_its_task_defaults_to_the_operator():
    """The shard ServiceAccount (where the chart creates it) and the S3 defaults reach the operator's environment
    (:mod:`taskshard_operator.install_defaults` fills a Task's open fields with them)."""

    def env(*sets: str) -> dict[str, str]:
        container = by_kind(render(*sets), "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in container["env"]}

    defaults = env("storage.s3.endpoint=http://minio:9000", "storage.s3.credentialsSecret=s3-creds")
    assert defaults["TASKSHARD_DEFAULT_S3_ENDPOINT"] == "http://minio:9000"
    assert defaults["TASKSHARD_DEFAULT_S3_CREDENTIALS_SECRET"] == "s3-creds"
    assert defaults["TASKSHARD_DEFAULT_SHARD_SERVICE_ACCOUNT"] == "taskshard-shard"
    assert defaults["TASKSHARD_DEFAULT_SHARD_SERVICE_ACCOUNT_NAMESPACES"] == "taskshard-system"
    watched = env("watchNamespaces={team-a,team-b}")
    assert watched["TASKSHARD_DEFAULT_SHARD_SERVICE_ACCOUNT_NAMESPACES"] == "team-a,team-b"
    bare = env("shardServiceAccount.create=false")
    assert not {k for k in bare if k.startswith("TASKSHARD_DEFAULT_")}
    refused = helm("template", "ts", str(CHART), "--set", "storage.s3.bucket=b", check=False)
    assert refused.returncode != 0 and "bucket" in refused.stderr, "a value that would do nothing is refused"


def test_the_values_checksum_annotation_is_always_a_string():
    """The pod template's checksum of the values is quoted. Unquoted, 16 hex digits that happen to be decimal digits
    only (about one release in 2,000: the values hold the release's name) read as a YAML number, and the API
    server refuses the Deployment: a ``helm upgrade`` in the install test once failed on exactly that."""
    args = ["template", "ts", str(CHART), "--kube-version", KUBE_VERSION, "--show-only", "templates/deployment.yaml"]
    (line,) = [x.strip() for x in helm(*args).stdout.splitlines() if "checksum/values" in x]
    assert re.fullmatch(r'checksum/values: "[0-9a-f]{16}"', line), line
