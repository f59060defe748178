"""The runtime's SparkSession defaults reach the JVM it starts."""

from __future__ import annotations


def test_default_jvm_options_reach_the_driver_jvm(shard_spark):
    from spark_runtime.session import JVM_OPTIONS

    jvm = shard_spark.sparkContext._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    for option in JVM_OPTIONS.split():
        assert option in arguments, f"{option} is not among the driver JVM's arguments {arguments}"
    assert shard_spark.conf.get("spark.executor.extraJavaOptions") == JVM_OPTIONS
