"""A run's ``config.json`` signed with a key of this user, so that the code a run of one's own names
is trusted by eval.py without a flag, and a workdir from anywhere else is not.

    sign(workdir/config.json) -> text of workdir/config.sig  # write_config: after writing config.json
    signed_here(workdir/config.json, workdir/config.sig)  # eval.py: trust the code it names?

Training a run imported and ran its reward functions and its task already, by the user's own command;
evaluating that run later runs the same code. So `write_config` signs the file's bytes with an HMAC
(SHA-256) under a random key kept in the user's cache (``$GD2PO_JAX_TRUST_KEY``, else
``$XDG_CACHE_HOME/gd2po_jax/trust_key``, else ``~/.cache/gd2po_jax/trust_key``; created 0600 on first
use). A workdir made by someone else, or whose config.json was edited since, or copied from another
machine, has no valid signature under this key: its code runs only with ``--trust_workdir_code``
(`gd2po_jax.runtime.run_dir.trusting_code_of`). Signing is best effort: where the key cannot be
written, the run goes on unsigned (eval.py then asks for the flag).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import pathlib
import secrets
from collections.abc import Mapping

logger = logging.getLogger(__name__)

KEY_ENV = "GD2PO_JAX_TRUST_KEY"
"""The environment variable naming the key file (tests point it into a temporary directory)."""
KEY_BYTES = 32


def key_path(env: Mapping[str, str] | None = None) -> pathlib.Path:
    """Where this user's signing key lives (see the module docstring)."""
    env = os.environ if env is None else env
    if env.get(KEY_ENV):
        return pathlib.Path(env[KEY_ENV])
    base = env.get("XDG_CACHE_HOME") or str(pathlib.Path.home() / ".cache")
    return pathlib.Path(base) / "gd2po_jax" / "trust_key"


def _read_key(path: pathlib.Path) -> bytes | None:
    try:
        key = path.read_bytes()
    except OSError:
        return None
    return key if len(key) == KEY_BYTES else None


def _create_key(path: pathlib.Path) -> bytes | None:
    """A new random key at ``path`` (0600, never through a link); the existing one if another process
    made it first; None where it cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return _read_key(path)
    except OSError as err:
        logger.warning("cannot write the signing key %s (%s): runs are not signed", path, err.strerror or err)
        return None
    key = secrets.token_bytes(KEY_BYTES)
    with os.fdopen(fd, "wb") as file:
        file.write(key)
    return key


def signature(data: bytes, key: bytes) -> str:
    """HMAC-SHA256 of ``data`` under ``key``, as hex."""
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def sign(config_file: pathlib.Path) -> str | None:
    """This user's signature of ``config_file``'s bytes (the key made if needed), for the caller to
    write next to it; None where no key could be had."""
    path = key_path()
    key = _read_key(path) or _create_key(path)
    return None if key is None else signature(config_file.read_bytes(), key)


def signed_here(config_file: pathlib.Path, signature_file: pathlib.Path) -> bool:
    """Whether ``signature_file`` holds this user's signature of ``config_file`` as it is now."""
    key = _read_key(key_path())
    if key is None:
        return False
    try:
        recorded = signature_file.read_text().strip()
        data = config_file.read_bytes()
    except OSError:
        return False
    return hmac.compare_digest(recorded, signature(data, key))
