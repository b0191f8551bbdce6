"""Tasks: where a run's prompts come from, looked up by ``config.task`` (`gd2po_jax.tasks.base`).

Built in: ``synthetic_tools`` (the embedded default, `gd2po_jax.tasks.synthetic_tools`),
``safety_embedded`` (the helpfulness-safety world, `gd2po_jax.tasks.safety`) and ``files`` (a
user's data files, `gd2po_jax.tasks.files`). Importing this package registers them.
"""

from gd2po_jax.tasks import files  # noqa: F401  (registers the built-in tasks)
from gd2po_jax.tasks.base import Task, register_task, registered_tasks, task_of
from gd2po_jax.tasks.safety import task as _safety  # noqa: F401
from gd2po_jax.tasks.synthetic_tools import task as _synthetic_tools  # noqa: F401

__all__ = ["Task", "register_task", "registered_tasks", "task_of"]
