"""The operator's Kopf handlers. Importing this package registers them (``kopf run -m`` or ``__main__``).

Handlers are thin: they only enqueue a pass on the work queue (``workqueue``); a pass observes the watch-fed
cache (``indexes``, ``cache``), decides in pure code (``reconcile_shard``/``reconcile_task``, ``planner``,
``builders``, ``phases``) and acts in one place (``act``, over ``kube``).
"""

from taskshard_operator.handlers import indexes, settings, task, taskshard

__all__ = ["indexes", "settings", "task", "taskshard"]
