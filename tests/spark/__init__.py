"""Spark tier: the shard runtime on local Spark."""
