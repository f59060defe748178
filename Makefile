# TaskShard developer entry points. Every target installs what it needs (venv, binaries) itself.
#   make demo          the main job: local control plane + (once the operator lands) a Task that splits
#   make test          every tier that runs on this machine (unit, spark, cluster, integration)
#   make test-unit | test-spark | test-cluster | test-integration | test-kind
#   make soak SEED=<n> OPS=<n>  a long nemesis run: one Task's seeded random life, checked as its consumer reads it
#   make test-node     docs/install.md on a real kubelet with the built images (root; ~18 min cold, ~5 min warm)
#   make test-image    build both images from a debootstrap'ed bookworm base and check them (root; ~10 min cold)
#   make images        docker build both targets with the Kafka and S3 jars (IMAGE_REPO/operator|shard:IMAGE_TAG)
#   make push-images   make images, then docker push both (IMAGE_REPO=registry.example.com/taskshard)
#   make binaries      build or reuse the control-plane binaries (cache: $TASKSHARD_BIN_CACHE)
#   make bench         benchmarks -> docs/benchmarks.md with tables and plots (QUICK=1 for smaller inputs)
#   make lint          ruff (check, format --check) and mypy (the modules listed in pyproject.toml [tool.mypy])

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
PYTEST := bash hack/run-pytest.sh
IMAGE_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE_REPO ?= taskshard

.PHONY: venv binaries demo test soak test-unit test-spark test-cluster test-integration test-kind test-node test-image image-jars images push-images bench lint clean

venv: $(STAMP)
$(STAMP): pyproject.toml
	@echo "[make] installing the Python environment into $(VENV) (first run downloads pyspark, ~450 MB)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-*; touch $@

binaries:
	bash hack/build-binaries.sh all

demo: venv binaries
	$(PY) hack/demo.py

# Two pytest processes at once (hack/test-all.sh): the integration tier's SparkSession must be the first JVM of its
# process (the Kafka and s3a jars join the classpath only at JVM start); it runs beside the Spark and unit tiers.
# The venv (mostly downloads) and the binaries (a Go build on a cold cache) are installed side by side.
test:
	@$(MAKE) --no-print-directory -j2 venv binaries
	bash hack/test-all.sh

SEED ?= 9
OPS ?= 40
soak: venv binaries
	TASKSHARD_NEMESIS_SEED=$(SEED) TASKSHARD_NEMESIS_OPS=$(OPS) $(PYTEST) --require-tests -m nemesis -s --timeout 0

test-unit: venv
	$(PYTEST) -m unit

test-spark: venv
	$(PYTEST) -m spark

test-cluster: venv binaries
	$(PYTEST) -m cluster

test-integration: venv
	$(PYTEST) -m integration

test-kind: venv
	$(PYTEST) -m kind

# A real node: containerd, runc and CNI plugins from Debian (installed when missing), kubelet and kube-proxy built
# like the control plane (`hack/build-binaries.sh node`), both images built and imported into containerd.
test-node: venv binaries
	$(PYTEST) --require-tests -m node

test-image: venv
	$(PYTEST) -m image

image-jars: venv
	$(VENV)/bin/python -m testinfra jars --into hack/image/jars

# The shard image carries Spark's Kafka connector and hadoop-aws with the AWS SDK (image-jars fetches them from
# Maven Central into hack/image/jars, which the Dockerfile copies): a Kafka or S3 Task runs on it as it is.
images: image-jars
	docker build --target operator -t $(IMAGE_REPO)/operator:$(IMAGE_TAG) .
	docker build --target shard -t $(IMAGE_REPO)/shard:$(IMAGE_TAG) .

push-images: images
	docker push $(IMAGE_REPO)/operator:$(IMAGE_TAG)
	docker push $(IMAGE_REPO)/shard:$(IMAGE_TAG)

bench: venv binaries
	$(PY) bench/run_all.py $(if $(QUICK),--quick,)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
