"""TaskShard shard runtime: the PySpark Structured Streaming job that runs inside each shard pod."""
