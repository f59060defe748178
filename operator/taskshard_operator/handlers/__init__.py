"""The operator's Kopf handlers. Importing this package registers them (``kopf run -m`` or ``__main__``).

Handlers are thin: they unpack kopf's kwargs and run one pass of a reconciler; all decisions are in the pure
``planner``/``builders``/``phases`` modules, all API calls in ``kube``.
"""

from taskshard_operator.handlers import settings, task, taskshard

__all__ = ["settings", "task", "taskshard"]
