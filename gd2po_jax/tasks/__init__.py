"""Tasks: where a run's prompts come from and what comes with them, looked up by ``config.task``.

This package owns the `Task` interface and its registry (`gd2po_jax.tasks.base`: `task_of`,
`register_task`), the built-in tasks with their generated worlds, and what a run is made of, resolved
from its config and task (`gd2po_jax.tasks.setup`). Code above it asks the task (`task_of(config)`
and the `Task` hooks) and never imports a task's own module.

Built in: ``synthetic_tools`` (the embedded default, `gd2po_jax.tasks.synthetic_tools`),
``safety_embedded`` (the helpfulness-safety world, `gd2po_jax.tasks.safety_embedded`) and ``files``
(a user's data files, `gd2po_jax.tasks.files`). Importing this package registers them.

May import: errors, config, runtime, models, data, rewards, training.
"""

from gd2po_jax.tasks import files  # noqa: F401  (registers the built-in tasks)
from gd2po_jax.tasks.base import NoHabitsError, Task, register_task, registered_tasks, task_named, task_of
from gd2po_jax.tasks.safety_embedded import task as _safety  # noqa: F401
from gd2po_jax.tasks.synthetic_tools import task as _synthetic_tools  # noqa: F401

__all__ = ["NoHabitsError", "Task", "register_task", "registered_tasks", "task_named", "task_of"]
