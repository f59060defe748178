"""The watch-fed cache (:mod:`taskshard_operator.cache`): the pure record functions, the Task-spec memo, and
:class:`~taskshard_operator.cache.KopfCache` over hand-made mappings standing in for the Kopf indexes (index id ->
key -> store of records), including the write-through overlays and their expiry.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest

from taskshard_operator import cache, naming
from taskshard_operator import status as st
from taskshard_operator.cache import KopfCache, SpecMemo, data_digest, not_older, object_record

from .operator_spec import NS, SPEC

pytestmark = pytest.mark.unit


def shard(name: str, version: str, *, task: str = "t", phase: str | None = None, ns: str = NS) -> dict[str, Any]:
    return {
        "apiVersion": naming.GROUP_VERSION,
        "kind": "TaskShard",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "resourceVersion": version},
        "spec": {"taskRef": {"name": task}, "keyGroups": {"start": 0, "end": 16}},
        "status": {"phase": phase} if phase else {},
    }


def task(name: str, version: str, uid: str = "task-uid", spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": naming.GROUP_VERSION,
        "kind": "Task",
        "metadata": {"name": name, "namespace": NS, "uid": uid, "resourceVersion": version},
        "spec": copy.deepcopy(spec or SPEC),
    }


class Indexes:
    """The Kopf indexes as plain dicts of lists (what ``KopfCache.bind`` reads)."""

    def __init__(self) -> None:
        self.shards: dict[tuple[str, str], list] = {}
        self.by_task: dict[tuple[str, str], list] = {}
        self.tasks: dict[tuple[str, str], list] = {}
        self.pods: dict[tuple[str, str], list] = {}
        self.configmaps: dict[tuple[str, str], list] = {}
        self.executors: dict[tuple[str, str], list] = {}
        self.prune_pods: dict[tuple[str, str], list] = {}

    def kwargs(self) -> dict[str, Any]:
        return {
            KopfCache.SHARDS: self.shards,
            KopfCache.SHARDS_BY_TASK: self.by_task,
            KopfCache.TASKS: self.tasks,
            KopfCache.PODS: self.pods,
            KopfCache.CONFIGMAPS: self.configmaps,
            KopfCache.EXECUTORS: self.executors,
            KopfCache.PRUNE_PODS: self.prune_pods,
            "logger": object(),  # other handler kwargs are ignored
        }

    def put_shard(self, body: dict[str, Any]) -> None:
        """What the watch delivers: the record in the by-name index and in its task's store."""
        record = object_record(body)
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        self.shards[(ns, name)] = [record]
        key = (ns, body["spec"]["taskRef"]["name"])
        store = [r for r in self.by_task.get(key, []) if r["metadata"]["name"] != name]
        self.by_task[key] = [*store, record]


@pytest.fixture
def indexes() -> Indexes:
    return Indexes()


@pytest.fixture
def kc(indexes: Indexes) -> KopfCache:
    c = KopfCache()
    assert not c.bound
    c.bind(indexes.kwargs())
    assert c.bound
    return c


def version(obj: dict[str, Any] | None) -> str | None:
    return (obj or {}).get("metadata", {}).get("resourceVersion")


# ---------------------------------------------------------------- records (pure)


def test_object_record_drops_managed_fields_and_keeps_the_rest():
    body = {
        "apiVersion": "taskshard.io/v1alpha1",
        "kind": "TaskShard",
        "metadata": {
            "name": "s",
            "resourceVersion": "5",
            "labels": {"a": "b"},
            "managedFields": [{"manager": "kopf", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {"keyGroups": {"start": 0, "end": 4}},
        "status": {"phase": "Running"},
    }
    original = copy.deepcopy(body)
    record = object_record(body)
    assert "managedFields" not in record["metadata"]
    assert record["metadata"] == {"name": "s", "resourceVersion": "5", "labels": {"a": "b"}}
    assert record["spec"] == body["spec"] and record["status"] == body["status"]
    assert (record["apiVersion"], record["kind"]) == ("taskshard.io/v1alpha1", "TaskShard")
    assert body == original, "the watched body is not modified"
    record["status"]["phase"] = "Failed"
    assert body["status"]["phase"] == "Running", "the record's status is a copy"


def test_object_record_of_a_body_without_spec_or_status():
    record = object_record({"metadata": {"name": "x"}})
    assert record["spec"] == {} and record["status"] == {} and record["metadata"] == {"name": "x"}


def test_data_digest_is_order_independent_and_follows_the_data():
    a = {"shard.json": "{}", "executor.yaml": "x"}
    b = dict(reversed(list(a.items())))
    assert list(a) != list(b)
    assert data_digest(a) == data_digest(b)
    assert data_digest(a) != data_digest({**a, "shard.json": "{ }"})
    assert data_digest(a) != data_digest({"shard.json": "{}"})
    assert data_digest(None) == data_digest({})
    assert len(data_digest(a)) == 64


@pytest.mark.parametrize(
    ("seen", "written", "expected"),
    [
        ("7", "7", True),
        ("8", "7", True),
        ("10", "9", True),  # numerically, not as text ("10" < "9" as strings)
        ("9", "10", False),
        ("6", "7", False),
        ("abc", "abc", True),
        ("abd", "abc", False),
        ("12", "abc", False),
        (None, "7", False),
        ("7", None, False),
    ],
)
def test_not_older(seen, written, expected):
    assert not_older(seen, written) is expected


# ---------------------------------------------------------------- SpecMemo


@pytest.fixture
def parse_calls(monkeypatch) -> list[str | None]:
    """Count calls of ``cache.parse_task`` (what SpecMemo calls)."""
    calls: list[str | None] = []
    real = cache.parse_task

    def counting(t):
        calls.append((t.get("metadata") or {}).get("resourceVersion"))
        return real(t)

    monkeypatch.setattr(cache, "parse_task", counting)
    return calls


def test_spec_memo_parses_once_per_version(parse_calls):
    memo = SpecMemo()
    first = memo.get(task("t", "1"))
    assert first.error is None and first.spec is not None and first.template_hash
    assert memo.get(task("t", "1")) is first
    assert parse_calls == ["1"]

    changed = task("t", "2", spec={**SPEC, "spark": {"image": "img:2"}})
    second = memo.get(changed)
    assert parse_calls == ["1", "2"], "a new resourceVersion is parsed again"
    assert second.template_hash != first.template_hash
    assert memo.get(task("t", "1", uid="other-uid")) is not first, "keyed by uid too (a recreated Task)"
    assert len(parse_calls) == 3


def test_spec_memo_does_not_memoise_without_a_version(parse_calls):
    memo = SpecMemo()
    body = task("t", "1")
    del body["metadata"]["resourceVersion"]
    memo.get(body)
    memo.get(body)
    assert len(parse_calls) == 2


def test_spec_memo_keeps_invalid_specs_too(parse_calls):
    memo = SpecMemo()
    bad = task("t", "3", spec={**SPEC, "initialShards": 99})
    parsed = memo.get(bad)
    assert parsed.spec is None and parsed.template_hash is None and parsed.error is not None
    assert memo.get(bad) is parsed and len(parse_calls) == 1


def test_spec_memo_is_bounded(parse_calls):
    memo = SpecMemo(size=2)
    for v in ("1", "2", "3"):
        memo.get(task("t", v))
    assert parse_calls == ["1", "2", "3"]
    assert len(memo._memo) == 2
    memo.get(task("t", "3"))
    memo.get(task("t", "2"))
    assert parse_calls == ["1", "2", "3"], "the two newest entries are kept"
    memo.get(task("t", "1"))
    assert parse_calls == ["1", "2", "3", "1"], "the oldest entry was evicted"
    assert len(memo._memo) == 2


def test_kopf_cache_task_spec_goes_through_the_memo(kc: KopfCache, parse_calls):
    body = task("t", "1")
    assert kc.task_spec(body) is kc.task_spec(body)
    assert parse_calls == ["1"]


# ---------------------------------------------------------------- KopfCache reads


def test_reads_come_from_the_indexes(kc: KopfCache, indexes: Indexes):
    indexes.put_shard(shard("t-0-16", "10", phase="Running"))
    indexes.tasks[(NS, "t")] = [object_record(task("t", "3"))]
    view = st.PodView(exists=True, name="t-0-16-driver", phase="Running", running=True)
    indexes.pods[(NS, "t-0-16")] = [view]
    indexes.configmaps[(NS, "t-0-16")] = ["digest-1"]

    got = kc.shard(NS, "t-0-16")
    assert got["status"]["phase"] == "Running" and version(got) == "10"
    assert version(kc.task(NS, "t")) == "3"
    assert kc.pod(NS, "t-0-16") is view
    assert kc.configmap_digest(NS, "t-0-16") == "digest-1"
    assert [s["metadata"]["name"] for s in kc.shards_of_task(NS, "t")] == ["t-0-16"]


def test_absent_objects(kc: KopfCache):
    assert kc.shard(NS, "nope") is None
    assert kc.task(NS, "nope") is None
    assert kc.pod(NS, "nope") == st.PodView(exists=False)
    assert kc.configmap_digest(NS, "nope") is None
    assert kc.shards_of_task(NS, "nope") == []


def test_an_empty_store_reads_as_absent(kc: KopfCache, indexes: Indexes):
    """Kopf keeps a key whose store emptied (the object was deleted)."""
    indexes.shards[(NS, "gone")] = []
    indexes.pods[(NS, "gone")] = []
    assert kc.shard(NS, "gone") is None
    assert kc.pod(NS, "gone").exists is False


def test_keys_lists_tasks_and_shards(kc: KopfCache, indexes: Indexes):
    indexes.tasks[(NS, "t")] = [object_record(task("t", "1"))]
    indexes.put_shard(shard("t-0-8", "1"))
    indexes.put_shard(shard("t-8-16", "1"))
    indexes.put_shard(shard("u-0-16", "1", task="u", ns="other"))
    assert sorted(kc.keys()) == [
        ("shard", NS, "t-0-8"),
        ("shard", NS, "t-8-16"),
        ("shard", "other", "u-0-16"),
        ("task", NS, "t"),
    ]


def test_keys_of_an_unbound_cache_is_empty():
    assert KopfCache().keys() == []


def test_task_figures_are_read_from_the_tasks_status_live(kc: KopfCache, indexes: Indexes):
    shown = {**task("t", "1"), "status": {"live": {"rate": 1.0, "deadLetters": 4, "watermark": "2027-01-15T08:00:12Z"}}}
    indexes.tasks[(NS, "t")] = [object_record(shown)]
    indexes.tasks[(NS, "new")] = [object_record(task("new", "1"))]  # no status.live yet: no figures
    ((namespace, name, figures),) = kc.task_figures()
    assert (namespace, name, figures.watermark, figures.counts.dead_letters) == (NS, "t", 1_800_000_012, 4)
    assert KopfCache().task_figures() == []


# ---------------------------------------------------------------- write-through overlays


def test_a_write_is_visible_until_the_watch_shows_its_version(kc: KopfCache, indexes: Indexes):
    indexes.put_shard(shard("s", "10", phase="Running"))
    kc.wrote(naming.SHARD_PLURAL, shard("s", "12", phase="SplitRequested"))
    got = kc.shard(NS, "s")
    assert version(got) == "12" and got["status"]["phase"] == "SplitRequested", "the pass sees its own write"

    indexes.put_shard(shard("s", "11", phase="Running"))  # an event older than the write
    assert version(kc.shard(NS, "s")) == "12"

    indexes.put_shard(shard("s", "12", phase="SplitRequested"))  # the watch caught up
    assert version(kc.shard(NS, "s")) == "12"
    indexes.put_shard(shard("s", "11", phase="Running"))
    assert version(kc.shard(NS, "s")) == "11", "the overlay was dropped: the index record wins again"


def test_a_newer_watched_version_replaces_the_overlay(kc: KopfCache, indexes: Indexes):
    indexes.put_shard(shard("s", "10"))
    kc.wrote(naming.SHARD_PLURAL, shard("s", "12", phase="Draining"))
    indexes.put_shard(shard("s", "13", phase="Drained"))
    got = kc.shard(NS, "s")
    assert version(got) == "13" and got["status"]["phase"] == "Drained"


def test_the_overlay_is_a_record_and_a_copy(kc: KopfCache, indexes: Indexes):
    written = shard("s", "12", phase="Running")
    written["metadata"]["managedFields"] = [{"manager": "x"}]
    kc.wrote(naming.SHARD_PLURAL, written, created=True)
    written["status"]["phase"] = "Failed"
    got = kc.shard(NS, "s")
    assert "managedFields" not in got["metadata"] and got["status"]["phase"] == "Running"


def test_forget_drops_an_overlay(kc: KopfCache, indexes: Indexes):
    indexes.put_shard(shard("s", "10", phase="Running"))
    kc.wrote(naming.SHARD_PLURAL, shard("s", "12", phase="SplitRequested"))
    kc.forget(naming.SHARD_PLURAL, NS, "s")
    assert version(kc.shard(NS, "s")) == "10"
    kc.forget(naming.SHARD_PLURAL, NS, "never-written")  # no error


def test_overlays_are_per_plural_and_namespace(kc: KopfCache, indexes: Indexes):
    indexes.tasks[(NS, "t")] = [object_record(task("t", "1"))]
    kc.wrote(naming.SHARD_PLURAL, {**shard("t", "9"), "kind": "TaskShard"})
    assert version(kc.task(NS, "t")) == "1", "a shard overlay does not shadow a task of the same name"
    kc.wrote(naming.TASK_PLURAL, task("t", "2"))
    assert version(kc.task(NS, "t")) == "2"
    assert kc.shard("other", "t") is None


def test_an_overlay_older_than_the_ttl_is_ignored(kc: KopfCache, indexes: Indexes, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(cache, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    indexes.put_shard(shard("s", "10", phase="Running"))
    kc.wrote(naming.SHARD_PLURAL, shard("s", "12", phase="SplitRequested"))
    clock[0] += cache.OVERLAY_TTL - 1
    assert version(kc.shard(NS, "s")) == "12"
    clock[0] += 2
    assert version(kc.shard(NS, "s")) == "10", "expired: the watched record"
    clock[0] -= 2  # an expired overlay is dropped for good
    assert version(kc.shard(NS, "s")) == "10"


def test_an_expired_overlay_of_an_object_the_watch_never_showed_disappears(kc, indexes, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(cache, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    kc.wrote(naming.SHARD_PLURAL, shard("created", "5"), created=True)
    assert kc.shard(NS, "created") is not None
    assert [s["metadata"]["name"] for s in kc.shards_of_task(NS, "t")] == ["created"]
    clock[0] = cache.OVERLAY_TTL + 1
    assert kc.shard(NS, "created") is None
    assert kc.shards_of_task(NS, "t") == []


def test_shards_of_task_counts_just_created_shards_and_prefers_newer_writes(kc: KopfCache, indexes: Indexes):
    indexes.put_shard(shard("t-0-16", "10", phase="Running"))
    indexes.put_shard(shard("u-0-16", "10", task="u"))
    kc.wrote(naming.SHARD_PLURAL, shard("t-0-16", "14", phase="SplitRequested"))
    kc.wrote(naming.SHARD_PLURAL, shard("t-0-8", "12"), created=True)  # created by the pass, not watched yet
    kc.wrote(naming.SHARD_PLURAL, shard("t-8-16", "13"), created=True)
    kc.wrote(naming.SHARD_PLURAL, shard("u-0-8", "15", task="u"), created=True)  # another task's
    kc.wrote(naming.SHARD_PLURAL, shard("t-0-4", "16", ns="other"), created=True)  # another namespace's

    got = {s["metadata"]["name"]: s for s in kc.shards_of_task(NS, "t")}
    assert sorted(got) == ["t-0-16", "t-0-8", "t-8-16"]
    assert got["t-0-16"]["status"]["phase"] == "SplitRequested" and version(got["t-0-16"]) == "14"

    indexes.put_shard(shard("t-0-16", "15", phase="Draining"))
    got = {s["metadata"]["name"]: s for s in kc.shards_of_task(NS, "t")}
    assert version(got["t-0-16"]) == "15", "the watch is newer than the write now"
    assert sorted(got) == ["t-0-16", "t-0-8", "t-8-16"]


def test_a_created_pod_counts_until_the_watch_shows_a_pod_of_its_name(kc: KopfCache, indexes: Indexes):
    """A pass right after a pod create sees the pod (no second create, no 409); once the watch shows a pod of
    that name, the watched one wins."""
    created = {
        "metadata": {
            "name": "t-0-8-driver",
            "namespace": NS,
            "uid": "new-pod",
            "labels": {naming.LABEL_SHARD: "t-0-8"},
        },
        "status": {"phase": "Pending"},
    }
    kc.wrote("pods", created)
    seen = kc.pod(NS, "t-0-8")
    assert seen.exists and seen.uid == "new-pod" and seen.phase == "Pending"
    indexes.pods[(NS, "t-0-8")] = [st.PodView(exists=True, name="t-0-8-driver", uid="new-pod", phase="Running")]
    assert kc.pod(NS, "t-0-8").phase == "Running"
    indexes.pods[(NS, "t-0-8")] = []
    assert kc.pod(NS, "t-0-8").exists is False, "the overlay is gone once the watch showed the pod"


def test_an_updated_object_the_watch_no_longer_shows_was_deleted(kc: KopfCache, indexes: Indexes):
    """A status write's overlay must not keep a deleted TaskShard alive (a pass would act for it)."""
    indexes.put_shard(shard("s", "10", phase="Running"))
    kc.wrote(naming.SHARD_PLURAL, shard("s", "12", phase="Failed"))
    assert version(kc.shard(NS, "s")) == "12"
    indexes.shards.pop((NS, "s"))
    indexes.by_task[(NS, "t")] = []
    assert kc.shard(NS, "s") is None
    assert kc.shards_of_task(NS, "t") == []
