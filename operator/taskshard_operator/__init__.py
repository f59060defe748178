"""TaskShard operator (Kopf). Importable as ``taskshard_operator``; never named ``operator``."""
