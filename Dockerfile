# TaskShard images: one Dockerfile, two final targets.
#
#   operator  the Kopf operator: Python + the `taskshard` package without Spark extras. ENTRYPOINT taskshard-operator
#   shard     the shard runtime: adds a Java 17 JRE (headless) and `taskshard[spark]` (PySpark).
#             ENTRYPOINT python -m spark_runtime. The operator's shard pods override the command with
#             `python -m spark_runtime run --config /etc/taskshard/shard.json`, so `python` must be on PATH: it is
#             the venv's interpreter, /opt/taskshard/bin/python.
#
# Build (any Docker, with or without BuildKit; this file uses only classic-builder syntax):
#   docker build --target operator -t taskshard/operator:0.1.0 .
#   docker build --target shard    -t taskshard/shard:0.1.0 .
#   hack/image/check.sh builds both from a debootstrap'ed bookworm base where no registry can be reached.
#
# BASE_IMAGE must be Debian bookworm or an image built from it (python3 = 3.11, openjdk-17-jre-headless and
# python3-venv from its apt sources); every stage starts from it, so pin it by digest in a release build.
#
# Runtime contract (what the chart and the operator rely on):
#   - uid/gid 10001 (numeric, so `runAsNonRoot` can be verified); code under /opt/taskshard is root-owned, read-only.
#   - The root filesystem may be read-only, but /tmp MUST be writable and allow exec: it is HOME, the working
#     directory, Java's tmpdir and Spark's local dir (spark.local.dir, spark-warehouse, hsperfdata), and RocksDB's
#     JNI library is unpacked there and mapped executable (a `noexec` /tmp fails the first stateful batch with
#     "UnsatisfiedLinkError: /tmp/librocksdbjni...so: failed to map segment"). The chart mounts an emptyDir at
#     /tmp; with Docker: `docker run --read-only --tmpfs /tmp:exec ...` (Docker's tmpfs default is noexec).
#   - PYSPARK_PYTHON / PYSPARK_DRIVER_PYTHON name the venv's interpreter, so Spark's Python workers find
#     pandas and pyarrow. JAVA_HOME points at the JRE through an architecture-neutral link.
#   - TASKSHARD_EXTRA_JARS=/opt/taskshard/jars: the JVM class path for Kafka and s3a (`make images` fetches the
#     jars first; a bare `docker build` copies whatever hack/image/jars holds).
#   - No compilers or build tools in the final stages; pip stays in the venv so that a derived image can add
#     a user's processor package (`USER 0`, `pip install ...`, `USER 10001`).
#
# Layers: the dependencies are installed from a requirements list derived from pyproject.toml
# (hack/image/requirements.py), keyed by that list only; a source change rebuilds only the project's wheel.
# Stage order matters: the classic builder builds every stage above --target, so the operator's stages come
# first and `--target operator` never downloads PySpark or the JRE.

ARG BASE_IMAGE=debian:bookworm-slim

# ---------------------------------------------------------------- runtime: python3 and the user, nothing else
FROM ${BASE_IMAGE} AS runtime
ARG DEBIAN_FRONTEND=noninteractive
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends python3 ca-certificates; \
    apt-get clean; rm -rf /var/lib/apt/lists/* /var/log/apt /var/log/dpkg.log; \
    groupadd --system --gid 10001 taskshard; \
    useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin taskshard
ENV LANG=C.UTF-8 \
    HOME=/tmp \
    VIRTUAL_ENV=/opt/taskshard \
    PATH=/opt/taskshard/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /tmp

# ---------------------------------------------------------------- builder: venv support and wheel tooling
# Build-only settings (builder stages only; nothing of them reaches a final image):
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL  a PyPI mirror
#   BUILD_CA_CERTS                      extra PEM CA certificates pip must trust (a TLS-inspecting egress proxy)
FROM runtime AS builder
ARG DEBIAN_FRONTEND=noninteractive
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG BUILD_CA_CERTS=""
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt
RUN set -eux; \
    if [ -n "$BUILD_CA_CERTS" ]; then \
      printf '%s\n' "$BUILD_CA_CERTS" > /usr/local/share/ca-certificates/taskshard-build-extra.crt; \
      update-ca-certificates; \
    fi; \
    apt-get update; \
    apt-get install -y --no-install-recommends python3-venv; \
    apt-get clean; rm -rf /var/lib/apt/lists/*; \
    python3 -m venv /opt/buildtools; \
    /opt/buildtools/bin/pip install 'setuptools>=68' wheel

# The requirement lists; the dependency layers below are rebuilt only when a list's content changes
# (not when pyproject.toml changes elsewhere, e.g. its tool config).
FROM builder AS requirements
COPY pyproject.toml hack/image/requirements.py /build/
RUN set -eux; \
    python3 /build/requirements.py /build/pyproject.toml > /build/operator.txt; \
    python3 /build/requirements.py /build/pyproject.toml spark > /build/shard.txt; \
    cat /build/operator.txt /build/shard.txt

# The project itself as one wheel (both targets install the same wheel; the operator does not import pyspark).
FROM builder AS wheel
COPY pyproject.toml README.md /src/
COPY operator /src/operator
COPY spark_runtime /src/spark_runtime
RUN /opt/buildtools/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels /src

# The example processor package (examples/processors), shipped in the shard image: its processors run as they are,
# and it is the model for a user's own package (examples/processors/Dockerfile layers one on this image).
FROM builder AS examples-wheel
COPY examples/processors/pyproject.toml /src/examples/
COPY examples/processors/taskshard_examples /src/examples/taskshard_examples
RUN /opt/buildtools/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels /src/examples

FROM builder AS operator-deps
COPY --from=requirements /build/operator.txt /build/
RUN python3 -m venv /opt/taskshard && pip install --use-pep517 -r /build/operator.txt

# ---------------------------------------------------------------- target: operator
FROM runtime AS operator
COPY --from=operator-deps /opt/taskshard /opt/taskshard
COPY --from=wheel /wheels /opt/wheels
# The `localkube` console script belongs to the test control plane, which is not in the image.
RUN set -eux; \
    pip install --no-deps --no-index /opt/wheels/*.whl; \
    rm -rf /opt/wheels /opt/taskshard/bin/localkube; \
    taskshard-operator --help > /dev/null
USER 10001:10001
ENTRYPOINT ["taskshard-operator"]
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="taskshard-operator" \
      org.opencontainers.image.description="TaskShard operator (Kopf): runs stateful Spark streaming tasks and splits their shards" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="TaskShard"

# ---------------------------------------------------------------- target: shard
FROM builder AS shard-deps
COPY --from=requirements /build/shard.txt /build/
RUN python3 -m venv /opt/taskshard && pip install --use-pep517 -r /build/shard.txt

FROM runtime AS shard
ARG DEBIAN_FRONTEND=noninteractive
# /usr/share/man/man1 must exist for the JRE's update-alternatives in images that strip the manual pages.
RUN set -eux; \
    mkdir -p /usr/share/man/man1; \
    apt-get update; \
    apt-get install -y --no-install-recommends openjdk-17-jre-headless; \
    apt-get clean; rm -rf /var/lib/apt/lists/* /var/log/apt /var/log/dpkg.log; \
    ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /usr/lib/jvm/java-17; \
    /usr/lib/jvm/java-17/bin/java -version
ENV JAVA_HOME=/usr/lib/jvm/java-17 \
    PYSPARK_PYTHON=/opt/taskshard/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/taskshard/bin/python \
    TASKSHARD_EXTRA_JARS=/opt/taskshard/jars
COPY --from=shard-deps /opt/taskshard /opt/taskshard
# Spark's Kafka connector and hadoop-aws + AWS SDK for source/sink.kafka and storage.s3: what `make images`
# (through `make image-jars`) put into hack/image/jars. A bare `docker build` without them makes an image whose
# Kafka and S3 shards stop with the clear KafkaConnectorMissing error; journal/directory/path tasks need no jars.
COPY hack/image/jars/ /opt/taskshard/jars/
COPY --from=wheel /wheels /opt/wheels
COPY --from=examples-wheel /wheels /opt/wheels
RUN set -eux; \
    pip install --no-deps --no-index /opt/wheels/*.whl; \
    rm -rf /opt/wheels /opt/taskshard/bin/localkube; \
    python -c "import pyspark, spark_runtime, taskshard_examples; print('pyspark', pyspark.__version__)"
USER 10001:10001
ENTRYPOINT ["python", "-m", "spark_runtime"]
CMD ["--help"]
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="taskshard-shard" \
      org.opencontainers.image.description="TaskShard shard runtime: one PySpark Structured Streaming driver per key-group range" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="TaskShard"
