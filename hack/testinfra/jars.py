"""Jars from Maven Central, with their transitive dependencies, in a cache keyed by version.

Three sets (each a directory ``$TASKSHARD_JAR_CACHE/<set>-<versions>/``, default cache
``~/.cache/taskshard/jars``):

- ``kafka-broker``: ``org.apache.kafka:kafka_2.13`` (runs ``kafka.Kafka`` and ``kafka.tools.StorageTool``) plus an
  slf4j binding so the broker logs. Used on its own classpath, never mixed with Spark's.
- ``spark-kafka``: Spark's Kafka connector (``spark-sql-kafka-0-10_2.13`` + ``spark-token-provider-kafka``,
  ``kafka-clients``, ``commons-pool2``) for the installed pyspark (see :mod:`testinfra.versions` for why the
  connector version may differ from pyspark's).
- ``hadoop-aws``: ``org.apache.hadoop:hadoop-aws`` of exactly the Hadoop version inside pyspark, with the AWS SDK v2
  ``bundle`` it needs (about 650 MB; fetched once).

For the two Spark sets, jars whose artifact pyspark already ships (scala-library, hadoop-client-*, slf4j, lz4,
snappy, ...) are dropped, so Spark's own versions win and nothing is on the classpath twice.

How: a generated pom listing the set's coordinates (with version overrides in ``dependencyManagement``) and
``mvn dependency:build-classpath`` with a settings file that mirrors every repository to Maven Central (Spark's
parent pom declares another repository, which would otherwise be tried first). Maven's own downloads live in
``<cache>/.m2`` and the set's directory holds hard links to them (copies across filesystems), so the 650 MB
bundle is on disk once. A set is built in a temporary directory and renamed into place with a ``.complete``
marker and a ``CONTENTS`` file, so an interrupted fetch leaves nothing half-made. Progress goes to stderr.

Errors: :class:`JarsUnavailable` when Maven is missing, Maven Central (``$TASKSHARD_MAVEN_REPO`` overrides its
URL) is unreachable, or resolution fails; the message says which and how to fix it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .common import jar_cache_dir, log, run_with_progress
from .versions import KAFKA_VERSION, SLF4J_RELOAD4J_VERSION, SPARK_KAFKA_CONNECTOR

__all__ = [
    "JarSet",
    "JarsUnavailable",
    "ensure_jar_set",
    "hadoop_aws_set",
    "hadoop_version",
    "kafka_broker_jars",
    "kafka_broker_set",
    "maven_repo_url",
    "pyspark_jars_dir",
    "pyspark_version",
    "spark_jars",
    "spark_kafka_set",
]

COMPONENT = "jars"
DEFAULT_REPO = "https://repo.maven.apache.org/maven2"


class JarsUnavailable(RuntimeError):
    """The jars are not cached and could not be fetched."""


@dataclass(frozen=True)
class JarSet:
    """A named set of Maven coordinates resolved together into one cache directory."""

    name: str
    key: str  # the cache directory name: <name>-<versions>
    coordinates: tuple[str, ...]  # group:artifact:version
    managed: tuple[str, ...] = ()  # group:artifact:version overrides for transitive dependencies
    drop_present_in: Path | None = None  # drop jars whose artifact already exists here (pyspark/jars)
    notes: tuple[str, ...] = field(default=())

    @property
    def directory(self) -> Path:
        return jar_cache_dir() / self.key


def maven_repo_url() -> str:
    return (os.environ.get("TASKSHARD_MAVEN_REPO") or DEFAULT_REPO).rstrip("/")


def pyspark_jars_dir() -> Path:
    import pyspark  # the venv's pyspark: the jars must match it

    return Path(pyspark.__file__).parent / "jars"


def pyspark_version() -> str:
    import pyspark

    return pyspark.__version__


def hadoop_version() -> str:
    """The Hadoop version pyspark ships (from ``hadoop-client-api-<v>.jar``)."""
    found = sorted(pyspark_jars_dir().glob("hadoop-client-api-*.jar"))
    if not found:
        raise JarsUnavailable(f"no hadoop-client-api-*.jar in {pyspark_jars_dir()}; is pyspark installed fully?")
    return found[0].name[len("hadoop-client-api-") : -len(".jar")]


def kafka_broker_set() -> JarSet:
    return JarSet(
        name="kafka-broker",
        key=f"kafka-broker-{KAFKA_VERSION}",
        coordinates=(
            f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}",
            f"org.slf4j:slf4j-reload4j:{SLF4J_RELOAD4J_VERSION}",
        ),
    )


def spark_kafka_set() -> JarSet:
    pv = pyspark_version()
    sql_kafka, token_provider = SPARK_KAFKA_CONNECTOR.get(pv, (pv, pv))
    return JarSet(
        name="spark-kafka",
        key=f"spark-kafka-{sql_kafka}-for-pyspark-{pv}",
        coordinates=(f"org.apache.spark:spark-sql-kafka-0-10_2.13:{sql_kafka}",),
        managed=(f"org.apache.spark:spark-token-provider-kafka-0-10_2.13:{token_provider}",),
        drop_present_in=pyspark_jars_dir(),
    )


def hadoop_aws_set() -> JarSet:
    hv = hadoop_version()
    return JarSet(
        name="hadoop-aws",
        key=f"hadoop-aws-{hv}-for-pyspark-{pyspark_version()}",
        coordinates=(f"org.apache.hadoop:hadoop-aws:{hv}",),
        drop_present_in=pyspark_jars_dir(),
    )


def _dependency_xml(coordinate: str) -> str:
    g, a, v = coordinate.split(":")
    return f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>"


def _pom(jar_set: JarSet) -> str:
    managed = "".join(_dependency_xml(c) for c in jar_set.managed)
    deps = "".join(_dependency_xml(c) for c in jar_set.coordinates)
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        f"<groupId>taskshard.local</groupId><artifactId>jars-{jar_set.name}</artifactId><version>1</version>"
        f"<packaging>pom</packaging><dependencyManagement><dependencies>{managed}</dependencies>"
        f"</dependencyManagement><dependencies>{deps}</dependencies></project>\n"
    )


def _settings(repo: str) -> str:
    return (
        "<settings><mirrors><mirror><id>taskshard-central</id><mirrorOf>*</mirrorOf>"
        f"<url>{repo}</url></mirror></mirrors></settings>\n"
    )


_ARTIFACT = re.compile(r"^(?P<artifact>.+?)-(?P<version>\d[^-]*(?:-[A-Za-z0-9.]+)*)\.jar$")


def _artifact_name(jar: str) -> str:
    """``hadoop-client-api-3.5.0.jar`` -> ``hadoop-client-api``; ``bundle-2.35.4.jar`` -> ``bundle``."""
    m = _ARTIFACT.match(jar)
    return m.group("artifact") if m else jar[:-4]


def check_maven_central(repo: str | None = None) -> None:
    """Raise :class:`JarsUnavailable` unless ``repo`` answers within 20 s."""
    repo = repo or maven_repo_url()
    probe = f"{repo}/org/apache/kafka/kafka_2.13/maven-metadata.xml"
    try:
        with urllib.request.urlopen(probe, timeout=20) as r:
            r.read(64)
    except (urllib.error.URLError, OSError) as e:
        raise JarsUnavailable(
            f"Maven Central ({repo}) is not reachable ({e}); the jars cannot be fetched. "
            f"Set TASKSHARD_MAVEN_REPO to a reachable mirror, or pre-fill {jar_cache_dir()}"
        ) from e


def ensure_jar_set(jar_set: JarSet) -> list[Path]:
    """Return the jars of ``jar_set``, fetching them first when the cache does not hold them."""
    dest = jar_set.directory
    if (dest / ".complete").exists():
        jars = sorted(dest.glob("*.jar"))
        log(COMPONENT, f"{jar_set.key}: cached ({len(jars)} jars) at {dest}")
        return jars
    if shutil.which("mvn") is None:
        raise JarsUnavailable("Maven (mvn) is not installed; install maven (apt-get install maven) and retry")
    repo = maven_repo_url()
    check_maven_central(repo)
    cache = jar_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".fetch-{jar_set.name}.", dir=cache))
    try:
        jars = _resolve(jar_set, repo, work)
        out = work / "jars"
        out.mkdir()
        kept, dropped = [], []
        present = (
            {_artifact_name(p.name) for p in jar_set.drop_present_in.glob("*.jar")}
            if jar_set.drop_present_in
            else set()
        )
        for jar in jars:
            if _artifact_name(jar.name) in present:
                dropped.append(jar.name)
                continue
            target = out / jar.name
            try:
                os.link(jar, target)
            except OSError:
                shutil.copy2(jar, target)
            kept.append(jar.name)
        lines = [f"# {c}" for c in jar_set.coordinates] + [f"# managed {c}" for c in jar_set.managed]
        lines += kept + [f"# dropped (pyspark ships the artifact): {d}" for d in dropped]
        (out / "CONTENTS").write_text("\n".join(lines) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        out.rename(dest)
        (dest / ".complete").touch()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = sum(p.stat().st_size for p in dest.glob("*.jar")) / 2**20
    log(COMPONENT, f"{jar_set.key}: ready ({len(kept)} jars, {size:.0f} MB; {len(dropped)} left to pyspark) at {dest}")
    return sorted(dest.glob("*.jar"))


def _resolve(jar_set: JarSet, repo: str, work: Path) -> list[Path]:
    (work / "pom.xml").write_text(_pom(jar_set))
    (work / "settings.xml").write_text(_settings(repo))
    local_repo = jar_cache_dir() / ".m2"
    log(COMPONENT, f"{jar_set.key}: resolving {', '.join(jar_set.coordinates)} from {repo}")
    downloads = [0]

    def summarize(line: str) -> str | None:
        if line.startswith("[ERROR]"):
            return line
        m = re.search(r"Downloaded from \S+: (\S+) \(([\d.]+) ([kMG]?B)", line)
        if not m:
            return None
        downloads[0] += 1
        big = m.group(3) in ("MB", "GB") and float(m.group(2)) >= 5 or m.group(3) == "GB"
        if big or downloads[0] % 25 == 0:
            name = m.group(1).rsplit("/", 1)[-1]
            return f"{jar_set.name}: {downloads[0]} files downloaded (latest {name}, {m.group(2)} {m.group(3)})"
        return None

    cp_file = work / "classpath.txt"
    rc, tail = run_with_progress(
        [
            "mvn",
            "-B",
            "-s",
            str(work / "settings.xml"),
            f"-Dmaven.repo.local={local_repo}",
            "-Dorg.slf4j.simpleLogger.log.org.apache.maven.cli.transfer.Slf4jMavenTransferListener=info",
            "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:build-classpath",
            "-DincludeScope=runtime",
            f"-Dmdep.outputFile={cp_file}",
        ],
        component=COMPONENT,
        cwd=work,
        summarize=summarize,
        heartbeat=20,
        what=f"fetching {jar_set.name}",
        status=lambda: _partial_downloads(local_repo),
    )
    if rc != 0 or not cp_file.exists():
        errors = [line for line in tail if "ERROR" in line] or tail[-20:]
        raise JarsUnavailable(
            f"Maven could not resolve {', '.join(jar_set.coordinates)} from {repo} (exit {rc}):\n" + "\n".join(errors)
        )
    jars = [Path(p) for p in cp_file.read_text().strip().split(os.pathsep) if p.endswith(".jar")]
    log(COMPONENT, f"{jar_set.name}: resolved {len(jars)} jars ({downloads[0]} files downloaded)")
    return jars


def _partial_downloads(local_repo: Path) -> str:
    """``bundle-2.35.4.jar 431 MB so far`` for the downloads in flight (Maven writes them as ``*.part``)."""
    parts = [(p.stat().st_size, p.name[: -len(".part")]) for p in local_repo.rglob("*.jar.part")]
    return ", ".join(f"{name} {size / 2**20:.0f} MB so far" for size, name in sorted(parts, reverse=True)[:2])


def kafka_broker_jars() -> Path:
    """The directory of the broker's jars (its classpath is ``<dir>/*``)."""
    ensure_jar_set(kafka_broker_set())
    return kafka_broker_set().directory


def spark_jars(*, kafka: bool = True, s3: bool = True) -> list[Path]:
    """The jars to add to a SparkSession (``spark.jars``) for the Kafka connector and/or s3a."""
    jars: list[Path] = []
    if kafka:
        jars += ensure_jar_set(spark_kafka_set())
    if s3:
        jars += ensure_jar_set(hadoop_aws_set())
    return jars
