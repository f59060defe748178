"""Example TaskShard processors (``processor.python: taskshard_examples.<module>:<Class>``).

- :class:`taskshard_examples.profiles.SpendProfile`: per customer, orders counted and amounts summed, with the
  largest order; three typed result columns; state forgotten 30 days after a customer's last order.
"""
