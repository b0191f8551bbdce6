"""The one base class of the errors a user can fix: a field of the config, a file, a data row, a
reward function, a busy or damaged workdir. Every command (`gd2po_jax.cli`) catches `UserError` in one
place (`gd2po_jax.cli.user_errors`) and prints its message as one line naming what to fix, with exit
code `USER_ERROR_EXIT_CODE`; anything else is a bug and keeps its traceback.

Each package defines its own errors on this base (e.g. `gd2po_jax.config.ConfigError`,
`gd2po_jax.runtime.run_dir.RunDirError`, `gd2po_jax.data.schema.DataFormatError`); most also derive from
the built-in class they were before (ValueError, RuntimeError), so code that catches those still does.

May import: nothing of gd2po_jax (the lowest layer).
"""

from __future__ import annotations

USER_ERROR_EXIT_CODE = 2
"""The exit code of a command stopped by a `UserError` (and by a bad flag): as argparse and absl use 2
for usage errors; 1 stays for what is not the user's to fix."""


class UserError(Exception):
    """An error the user can fix; its message names the field, file, row or function, and what to do."""
