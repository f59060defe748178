"""Real components for the integration tests, started on loopback from cached builds.

- :mod:`testinfra.jars`: jars from Maven Central (with transitive dependencies) in a version-keyed cache:
  the Kafka broker, Spark's Kafka connector and ``hadoop-aws`` with its AWS SDK.
- :mod:`testinfra.kafka`: an Apache Kafka broker in KRaft mode from those jars, plus admin, produce and
  consume helpers (confluent-kafka).
- :mod:`testinfra.minio`: MinIO built from its Go module into a version-keyed cache, started on loopback.
- :mod:`testinfra.s3`: a tiny SigV4 S3 client for set-up and checks.

``python -m testinfra --help`` fetches/builds everything ahead of time and can start the servers by hand.
Versions and why: :mod:`testinfra.versions`.
"""
