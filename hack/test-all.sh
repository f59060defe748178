#!/usr/bin/env bash
# `make test`: every tier that runs on this machine, in two pytest processes at once.
#
# The integration tier's SparkSession must be the first JVM of its process (the Kafka and s3a jars join the class
# path only at JVM start), so it runs in a process of its own, beside the main process's Spark tier (the main
# process's first JVM). The integration tier ends well before the Spark tier, so its process then runs the tests
# that start no JVM (the unit tier, the examples' tests, and the cluster tests of the API, the CRDs and the chart,
# on a control plane of their own), and the main process goes on to the rest of the cluster tier, the most
# sensitive to load, which then runs alone. The second process's output goes to .test-logs/integration.log and is
# printed when both are done; the run fails if either process fails.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p .test-logs
log=.test-logs/integration.log
selected="not kind and not integration and not image and not node"
light=(tests/cluster/test_crds.py tests/cluster/test_chart_render.py tests/cluster/test_localkube.py
  tests/cluster/test_pod_security.py)
{
  bash hack/run-pytest.sh --require-tests --durations=10 -m integration
  first=$?
  bash hack/run-pytest.sh --require-tests --durations=10 -m "$selected" tests/unit examples/processors/tests "${light[@]}"
  rest=$?
  [[ $first -eq 0 && $rest -eq 0 ]]
} > "$log" 2>&1 &
integration=$!
trap 'kill "$integration" 2>/dev/null' INT TERM
bash hack/run-pytest.sh --require-tests --durations=25 -m "$selected" "${light[@]/#/--ignore=}" \
  tests/spark tests/cluster tests/image tests/kind tests/node
main=$?
wait "$integration"
second=$?
echo "----- the integration tier, then the unit tier and the light cluster tests (their own process; full log: $log) -----"
cat "$log"
echo "main tiers: exit $main; integration, unit and light cluster tests: exit $second"
[[ $main -eq 0 && $second -eq 0 ]]
