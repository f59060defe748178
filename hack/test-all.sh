#!/usr/bin/env bash
# `make test`: every tier that runs on this machine, in two pytest processes at once.
#
# The integration tier's SparkSession must be the first JVM of its process (the Kafka and s3a jars join the class
# path only at JVM start), so it runs in a process of its own, beside the main process's Spark and unit tiers (run
# first: the Spark tier's session is the main process's first JVM, as before; the unit tests leave a core idle);
# the cluster tier, the most sensitive to load, comes last. Its output goes to .test-logs/integration.log and is
# printed when both are done; the run fails if either process fails.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p .test-logs
log=.test-logs/integration.log
bash hack/run-pytest.sh --require-tests --durations=10 -m integration > "$log" 2>&1 &
integration=$!
trap 'kill "$integration" 2>/dev/null' INT TERM
bash hack/run-pytest.sh --require-tests --durations=25 -m "not kind and not integration and not image and not node" \
  tests/spark tests/unit examples/processors/tests tests/cluster tests/image tests/kind tests/node
main=$?
wait "$integration"
second=$?
echo "----- the integration tier (its own process; full log: $log) -----"
cat "$log"
echo "main tiers: exit $main; integration tier: exit $second"
[[ $main -eq 0 && $second -eq 0 ]]
