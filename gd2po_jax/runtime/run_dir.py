"""The workdir of a run: where each file lives, its lock, atomic writes and ``config.json``.

Every module that reads or writes a workdir goes through here (trainer, warm start, evaluation,
sweeps, report, metrics). A workdir holds everything a run needs to resume or be reproduced::

    config.json         the resolved config (`write_config`, `load_run_config`)
    base_model/         the embedded default's tokenizer + tiny random Qwen2 (HF format)
    warm_start/         the supervised warm-start checkpoint (HF format), reused when present
                        (with config.sft.cache_dir it lives in CACHE_DIR/<key> instead, shared)
    warm_start_logs/    the SFT loss of the warm start, if this run trained it
    checkpoints/        Orbax checkpoints of the RL state and data position
                        (`gd2po_jax.runtime.checkpoints.Checkpoints`)
    corrupt_checkpoints/  checkpoints found damaged on resume, moved aside (`Checkpoints.restore_intact`)
    metrics.jsonl       one JSON object per RL step;  tensorboard/  the same as event files
    rollouts/           step_<N>.jsonl: the rollouts of every logging.rollouts_every-th RL step
                        (`gd2po_jax.rl.rollout_log`; docs/logging.md)
    wandb_run_id.txt    the Weights & Biases run a resumed run continues;  wandb/  W&B's own files
                        (`gd2po_jax.runtime.wandb_logging`)
    eval/               <name>.json reports (before_rl, after_rl, test ...) + <name>.jsonl generations
    policy/             the final policy in HF safetensors format
    results.json        validation metrics before and after RL

Files are written through a temporary file in the same directory and a rename (`write_text`,
`write_json`), so a run killed at any moment leaves either the old file or the new one.

Symbolic links: nothing a run writes follows one. The lock is opened with ``O_NOFOLLOW``, a
rename replaces a link rather than writing through it, and every process that takes the lock
refuses a workdir whose own entries (``checkpoints/``, ``tensorboard/``, ``metrics.jsonl`` ...:
`RunDir.entries`) are links (`check_no_links`), so no write leaves the workdir. The workdir itself
may be a link (``runs -> /scratch/runs``).

Permissions: one policy for everything a run writes (`FILE_MODE_POLICY`, `file_mode`): files
``0666 & ~umask`` and directories ``0777 & ~umask`` -- what Orbax, safetensors and TensorBoard do
for checkpoints, the policy and event files, and what `write_text` and the lock now do too (0644 /
0755 under the usual umask 022). Start a run under ``umask 077`` to keep it private.

One process at a time works in a workdir: train.py and eval.py hold an exclusive lock on
``WORKDIR/.lock`` (`lock_workdir`), which names its holder; a second one stops at once. A rerun
that would continue a run with another config is refused (`check_resume_config`): only
`RESUMABLE_FIELDS` may change. The checkpoints and their integrity checks are
`gd2po_jax.runtime.checkpoints`'s (it imports this module, never the reverse).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import pathlib
import shutil
import socket
import stat
import tempfile
import time
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from gd2po_jax.config import ConfigError, RunConfig, upgrade
from gd2po_jax.config.run import redacted, redacted_fields
from gd2po_jax.errors import UserError
from gd2po_jax.runtime.imports import UntrustedCodeError, importing_only, is_import_path, untrusted_message
from gd2po_jax.runtime.trust import sign as sign_config
from gd2po_jax.runtime.trust import signed_here

logger = logging.getLogger(__name__)


class RunDirError(UserError, ValueError):
    """A workdir file that is missing or unreadable; the message names the file."""


class WorkdirBusyError(RunDirError):
    """Another process holds the workdir's lock; the message names it (`lock_workdir`)."""


class WriteFailedError(RunDirError):
    """A write of the run's files that failed (ENOSPC, a full disk, or any other OSError): the
    message names the file and the free space there (`write_failed`). What was there before is
    intact (every write is atomic), so the rerun after freeing space resumes."""


def size_text(num_bytes: float) -> str:
    """``"1.2 GiB"``, ``"24.0 MiB"``, ``"512 bytes"``: a size in the largest unit that keeps it >= 1."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{int(num_bytes)} bytes"


def free_space(path: str | pathlib.Path) -> str:
    """``"1.2 GiB free of 100.0 GiB on <dir>"`` (in the unit each size needs: ``"3.1 MiB free of
    30.0 MiB"``) for the nearest existing directory of ``path``."""
    where = pathlib.Path(path).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        usage = shutil.disk_usage(where)
    except OSError:
        return f"free space unknown on {where}"
    return f"{size_text(usage.free)} free of {size_text(usage.total)} on {where}"


NO_SPACE = "No space left on device"


def write_failed(path: str | pathlib.Path, err: BaseException) -> WriteFailedError:
    """The `WriteFailedError` for a failed write of ``path``: one line naming it, the error (just
    "No space left on device" for a full disk, however deeply a library quoted it) and the free space."""
    reason = " ".join(str(err.strerror if isinstance(err, OSError) and err.strerror else err).split())
    if NO_SPACE in reason:
        reason = NO_SPACE
    return WriteFailedError(
        f"{path}: cannot write it ({reason}; {free_space(path)}). The run stopped; the "
        "previous checkpoint and files are intact: free space and rerun the same command to resume"
    )


@contextlib.contextmanager
def writing(path: str | pathlib.Path) -> Iterator[None]:
    """Within: an `OSError` becomes `write_failed` (``path``)."""
    try:
        yield
    except OSError as err:
        raise write_failed(path, err) from err


LOCK_FILE = ".lock"


@dataclasses.dataclass(frozen=True)
class RunDir:
    """The paths of one run's workdir (nothing is created or read here)."""

    path: pathlib.Path

    if TYPE_CHECKING:  # the dataclass's __init__ takes a str too (__post_init__ makes it a Path)

        def __init__(self, path: str | pathlib.Path) -> None: ...

    def __post_init__(self):
        object.__setattr__(self, "path", pathlib.Path(self.path))

    @property
    def config(self) -> pathlib.Path:
        return self.path / "config.json"

    @property
    def config_signature(self) -> pathlib.Path:
        """This user's signature of config.json (`gd2po_jax.runtime.trust`)."""
        return self.path / "config.sig"

    @property
    def base_model(self) -> pathlib.Path:
        return self.path / "base_model"

    @property
    def warm_start(self) -> pathlib.Path:
        return self.path / "warm_start"

    @property
    def warm_start_logs(self) -> pathlib.Path:
        return self.path / "warm_start_logs"

    @property
    def lock(self) -> pathlib.Path:
        """``.lock``: held by the one process working in the workdir (`lock_workdir`)."""
        return self.path / LOCK_FILE

    @property
    def checkpoints(self) -> pathlib.Path:
        return self.path / "checkpoints"

    @property
    def corrupt_checkpoints(self) -> pathlib.Path:
        """Where damaged checkpoints are moved on resume (kept for inspection, never read)."""
        return self.path / "corrupt_checkpoints"

    @property
    def metrics(self) -> pathlib.Path:
        return self.path / "metrics.jsonl"

    @property
    def tensorboard(self) -> pathlib.Path:
        return self.path / "tensorboard"

    @property
    def rollouts(self) -> pathlib.Path:
        """``rollouts/``: the logged steps' rollouts (`gd2po_jax.rl.rollout_log`)."""
        return self.path / "rollouts"

    def rollout_file(self, step: int) -> pathlib.Path:
        """``rollouts/step_<N>.jsonl``: the rollouts of RL step ``N`` (1-based, as in metrics.jsonl)."""
        return self.rollouts / f"step_{int(step)}.jsonl"

    @property
    def wandb_run_id(self) -> pathlib.Path:
        """``wandb_run_id.txt``: the id of the run's Weights & Biases run (`gd2po_jax.runtime.wandb_logging`)."""
        return self.path / "wandb_run_id.txt"

    @property
    def eval_dir(self) -> pathlib.Path:
        return self.path / "eval"

    def eval_report(self, name: str) -> pathlib.Path:
        """``eval/<name>.json``: the summary of one evaluation."""
        return self.eval_dir / f"{name}.json"

    def eval_generations(self, name: str) -> pathlib.Path:
        """``eval/<name>.jsonl``: its scored generations, one JSON object per example."""
        return self.eval_dir / f"{name}.jsonl"

    @property
    def policy(self) -> pathlib.Path:
        return self.path / "policy"

    @property
    def policy_adapter(self) -> pathlib.Path:
        """A LoRA run's adapters in PEFT's format (``policy/`` holds them merged)."""
        return self.path / "policy_adapter"

    @property
    def results(self) -> pathlib.Path:
        return self.path / "results.json"

    def entries(self) -> tuple[pathlib.Path, ...]:
        """Every file and directory a run writes at the top of its workdir (`check_no_links`)."""
        return (
            self.lock,
            self.config,
            self.config_signature,
            self.base_model,
            self.warm_start,
            self.warm_start_logs,
            self.checkpoints,
            self.corrupt_checkpoints,
            self.metrics,
            self.tensorboard,
            self.rollouts,
            self.wandb_run_id,
            self.path / "wandb",
            self.eval_dir,
            self.policy,
            self.policy_adapter,
            self.results,
        )


def _umask() -> int:
    """The process's umask (Linux: read from /proc, without changing it)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The permissions of every file a run writes: ``0o666 & ~umask`` (0644 under umask 022)."""
    return 0o666 & ~_umask()


FILE_MODE_POLICY = "files 0666 & ~umask, directories 0777 & ~umask (0644 / 0755 under umask 022)"
"""The permission policy of everything a run writes (docs/reliability.md)."""


class RedactedSecretError(RunDirError):
    """A secret the run's config.json does not hold (`write_config` leaves secrets out) is needed."""


class LinkInWorkdirError(RunDirError):
    """An entry of a workdir that is a symbolic link: a write there would leave the workdir."""


def check_no_links(workdir: str | pathlib.Path) -> None:
    """Refuse a workdir whose entries (`RunDir.entries`) are symbolic links: writing through one (a
    link ``tensorboard -> ~/elsewhere``, ``metrics.jsonl -> ~/precious``) would write outside it.

    Raises:
      LinkInWorkdirError: naming the link, its target and what to do.
    """
    for path in RunDir(workdir).entries():
        if path.is_symlink():
            raise LinkInWorkdirError(
                f"{path} is a symbolic link (to {os.readlink(path)}); a run writes only inside its workdir and "
                "never through a link: remove the link (or put a copy of what it points to in its place)"
            )


# ----------------------------------------------------------------------------------------------
# Files.
# ----------------------------------------------------------------------------------------------


def write_text(path: str | pathlib.Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a temporary file in the same directory, then
    `os.replace`. A kill at any moment leaves the old content or the new one, and no temporary file
    survives an exception. A symbolic link at ``path`` is replaced, never written through; the file
    gets `file_mode`.

    Raises:
      WriteFailedError: the write failed (a full disk ...), naming the file and the free space."""
    path = pathlib.Path(path)
    with writing(path):  # a full disk: WriteFailedError naming the file and the free space
        fd, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, file_mode())  # mkstemp's 0600 -> the run's one policy (FILE_MODE_POLICY)
            with os.fdopen(fd, "w") as file:
                file.write(text)
                file.flush()
                os.fsync(file.fileno())
            os.replace(staging, path)
        except BaseException:
            pathlib.Path(staging).unlink(missing_ok=True)
            raise


def open_append(path: str | pathlib.Path):
    """``path`` opened for appending text, without following a symbolic link (``O_NOFOLLOW``: a link
    there is an `OSError`), created with `file_mode`."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    return os.fdopen(fd, "a")


def write_json(path: str | pathlib.Path, value: Any) -> None:
    """`write_text` of ``value`` as indented JSON with sorted keys."""
    write_text(path, json.dumps(value, indent=2, sort_keys=True))


def read_json(path: str | pathlib.Path) -> Any:
    """The JSON value in ``path``.

    Raises:
      RunDirError: naming the file, when it is missing or not JSON.
    """
    try:
        return json.loads(pathlib.Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise RunDirError(f"{path}: cannot read it as JSON ({err})") from None


def read_jsonl(path: str | pathlib.Path, *, drop_torn_last_line: bool = False) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (``metrics.jsonl``, ``eval/<name>.jsonl``) in order.
    Non-finite numbers read back as floats (``NaN``, ``Infinity``, ``-Infinity``: what
    `json.dumps` writes for them).

    Args:
      drop_torn_last_line: a last line that is not JSON and has no newline after it (a write cut
        short: the process was killed or the disk was full) is dropped with a warning naming the
        file, instead of raising. An appending writer uses this to resume.

    Raises:
      RunDirError: naming the file (and the line), when it is missing or a line is not JSON.
    """
    try:
        text = pathlib.Path(path).read_text(errors="replace")
    except OSError as err:
        raise RunDirError(f"{path}: cannot read it ({err})") from None
    lines = text.splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                if drop_torn_last_line and number == len(lines) and not text.endswith("\n"):
                    logger.warning("%s, line %d: dropped a half-written last line (%r)", path, number, line[:80])
                    break
                raise RunDirError(f"{path}, line {number}: not JSON ({err})") from None
    return records


# ----------------------------------------------------------------------------------------------
# config.json
# ----------------------------------------------------------------------------------------------


def write_config(workdir: str | pathlib.Path, config: RunConfig) -> None:
    """Write the resolved ``config`` to ``workdir/config.json`` (atomically): `RunConfig.to_json`,
    indented JSON with sorted keys, secrets left out (`gd2po_jax.config.run.redacted`: option values
    named like ``*key*``, ``*token*``, ``*secret*``, ``*password*``)."""
    values, fields = redacted(json.loads(config.to_json()))  # a RunConfig (or a ConfigDict)
    if fields:
        logger.warning(
            "%s: not writing the value of %s (it looks like a secret); a resumed run takes it from its "
            "--config again, and eval.py cannot: read secrets from the environment (docs/reliability.md)",
            RunDir(workdir).config,
            ", ".join(fields),
        )
    write_text(RunDir(workdir).config, json.dumps(values, indent=2, sort_keys=True))
    signed = sign_config(RunDir(workdir).config)  # the code it names is this user's (runtime/trust.py)
    if signed is not None:
        write_text(RunDir(workdir).config_signature, signed + "\n")


def load_run_config(path: str | pathlib.Path) -> RunConfig:
    """The typed config of a run, as `write_config` wrote it: ``path`` is a workdir (its
    ``config.json`` is read), or a file (a run's ``config.json`` or a copy of one; a path ending in
    ``.json`` is taken for a file even when missing, for the error to name it). A file written by
    an older version is first brought up to date by `gd2po_jax.config.versions.upgrade` (a field
    whose default changed since takes the default that run used, when the file lacks it).

    Raises:
      RunDirError: the file is missing or not a JSON object.
      ConfigError: naming the file and the first invalid or unknown field.
    """
    path = pathlib.Path(path)
    is_file = path.is_file() or (path.suffix == ".json" and not path.is_dir())
    file = path if is_file else RunDir(path).config
    values = read_json(file)
    if not isinstance(values, dict):
        raise RunDirError(f"{file}: not a config (a JSON object of config sections)")
    try:
        return RunConfig.from_config_dict(upgrade(values))
    except ConfigError as err:
        raise ConfigError(f"{file}: {err}") from None


TRUST_FLAG = "--trust_workdir_code"
"""The flag of eval.py and export.py that lets a workdir's config.json name code to import (`trusting_code_of`)."""


def named_code(values: Any, *, rewards: bool = True) -> list[tuple[str, str]]:
    """(field, import path) of each piece of code a config (a config.json's JSON, or a config dict)
    names: ``task`` when it is an import path, and with ``rewards`` each entry of
    ``rewards.functions``. Nothing is imported."""
    if not isinstance(values, dict):
        return []
    named = []
    task = values.get("task")
    if isinstance(task, str) and is_import_path(task):
        named.append(("config.task", task.strip()))
    functions = (values.get("rewards") or {}).get("functions") if isinstance(values.get("rewards"), dict) else None
    for index, entry in enumerate(functions or () if rewards else ()):
        fn = entry.get("fn") if isinstance(entry, dict) else entry
        if isinstance(fn, str):
            named.append((f"config.rewards.functions[{index}]", fn.strip()))
    return named


@contextlib.contextmanager
def trusting_code_of(
    workdir: str | pathlib.Path, *, trust: bool = False, given: Iterable[str] = (), rewards: bool = True
) -> Iterator[None]:
    """Within: the code that ``workdir/config.json`` names (`named_code`) is imported only if the user
    trusts it: ``trust`` (``--trust_workdir_code``), each path given again on the command line
    (``given``), or a config.json this user's train.py or sweep.py wrote here, unchanged since
    (signed with this user's key: `gd2po_jax.runtime.trust`; that code ran when the run trained).
    Without that the workdir's config is refused before anything is read or imported,
    and any import of another path within is refused too (`gd2po_jax.runtime.imports.importing_only`).
    A config.json written by someone else must not run code (as transformers' ``trust_remote_code``).

    Args:
      rewards: whether the caller uses the run's reward functions (export.py does not: they are then
        neither imported nor asked about).

    Raises:
      UntrustedCodeError: naming every path the config names that the user did not trust, and the flag.
      RedactedSecretError: with ``rewards``, an option of a reward function was a secret, not written
        to config.json (`write_config`): the function cannot get it.
    """
    file = RunDir(workdir).config
    try:
        values = json.loads(file.read_text()) if file.is_file() else None
    except (OSError, ValueError):
        values = None  # reading it later names the problem
    secrets = [f for f in redacted_fields(values) if f.startswith("rewards.functions")] if rewards else []
    if secrets and named_code(values):
        raise RedactedSecretError(
            f"{file}: {', '.join(secrets)} looked like a secret and was not written there, and the reward "
            "function would get the placeholder: have the function read it from the environment "
            "(os.environ; docs/reliability.md) and train again, or evaluate with --model_path"
        )
    if trust or values is None or signed_here(file, RunDir(workdir).config_signature):
        yield
        return
    given = {path.strip() for path in given if path.strip()}
    how = f"pass {TRUST_FLAG}" + (" (or give the same paths again with --reward_functions)" if rewards else "")
    refused = [f"{field} ({path})" for field, path in named_code(values, rewards=rewards) if path not in given]
    if refused:
        raise UntrustedCodeError(untrusted_message(refused, str(file), how))
    with importing_only(given, str(file), how):
        yield


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested JSON objects as one level of dotted names (``{"rl": {"snr_tau": 0.8}}`` ->
    ``{"rl.snr_tau": 0.8}``)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else key))
    return out


def config_changes(
    before: dict[str, Any], after: dict[str, Any], *, limit: int | None = 5, ignore: Iterable[str] = ()
) -> str:
    """The fields whose values differ between two JSON configs (nested dicts), as
    ``"rl.snr_tau (was 0.8, now 0.5), ..."``: the first ``limit`` by name (None: all), then how
    many more; the dotted names in ``ignore`` are not compared. Empty when they agree."""
    old, new, ignored = flatten(before), flatten(after), set(ignore)
    changed = sorted(name for name in old.keys() | new.keys() if old.get(name) != new.get(name) and name not in ignored)
    shown = changed if limit is None else changed[:limit]
    details = ", ".join(f"{name} (was {old.get(name)!r}, now {new.get(name)!r})" for name in shown)
    more = f" and {len(changed) - len(shown)} more" if len(changed) > len(shown) else ""
    return details + more


# The fields a rerun may change when it resumes a run: how the run is executed, recorded and
# guarded, not what it computes (memory and device layout change float rounding at most; the
# stopping rules and the reward timeout only decide whether to stop, or to count a hung reward
# call as failed; runs made before the timeout existed load it as 0, no limit; scoring a step a
# group at a time or whole calls the reward functions on other chunks of it; where reward models
# wait between steps changes nothing they compute; the distributed settings say how the processes
# of a multi-host run find each other, and differ between them; export.dtype is how the policy is
# stored at the end, and a finished run reruns its export in the new dtype; the preemption signals and
# grace time only decide when the run stops, at a step it checkpoints). train.num_steps extends
# a run (it may not go below the step already reached: the trainer checks that). Everything else must
# equal config.json's.
RESUMABLE_FIELDS = (
    "train.num_steps",
    "train.log_every",
    "checkpoint.every_steps",
    "checkpoint.keep",
    "eval.every_steps",
    "eval.batch_size",
    "rewards.num_workers",
    "rewards.score_groups",
    "sft.cache_dir",
    "model.remat",
    "rl.micro_batch_size",
    "rl.length_bucket",
    "sft.length_bucket",
    "mesh.data",
    "mesh.fsdp",
    "mesh.tensor",
    "train.max_consecutive_skipped_steps",
    "rewards.max_failed_fraction",
    "rewards.timeout_s",
    "rewards.offload",
    "distributed.coordinator_address",
    "distributed.num_processes",
    "distributed.process_id",
    "distributed.initialization_timeout_s",
    "distributed.heartbeat_timeout_s",
    "export.dtype",
    "train.preemption_signals",
    "train.preemption_grace_s",
    "logging.rollouts_every",
    "logging.completions_every",
    "logging.compilation_cache",
    "logging.wandb.enabled",
    "logging.wandb.project",
    "logging.wandb.name",
    "logging.wandb.entity",
    "logging.wandb.mode",
)


def has_progress(workdir: str | pathlib.Path) -> bool:
    """Whether a run in ``workdir`` got past its warm start: an evaluation before RL, a checkpoint
    (complete or not), metrics, an exported policy or results. (A warm start alone is checked
    against the config by `gd2po_jax.sft.warm_start`.)"""
    files = RunDir(workdir)
    return any(p.exists() for p in (files.eval_report("before_rl"), files.metrics, files.policy, files.results)) or (
        files.checkpoints.is_dir() and any(files.checkpoints.iterdir())
    )


def check_resume_config(workdir: str | pathlib.Path, config: RunConfig) -> None:
    """Refuse to continue the run in ``workdir`` with ``config`` (a `RunConfig` or a ConfigDict)
    when it differs from the run's ``config.json`` in anything but `RESUMABLE_FIELDS`: the rerun
    would carry on from the run's checkpoint and evaluations, and relabel them with the new values.
    A workdir without ``config.json`` or without progress (`has_progress`) is not checked.

    Raises:
      ConfigError: naming every field that differs, with both values.
      RunDirError: ``config.json`` is unreadable (naming it).
    """
    files = RunDir(workdir)
    if not files.config.is_file() or not has_progress(workdir):
        return
    # Secrets are not in config.json (`write_config`): they are not compared.
    before = {"config": redacted(json.loads(load_run_config(workdir).to_json()))[0]}
    changes = config_changes(
        before,
        {"config": redacted(json.loads(config.to_json()))[0]},  # a RunConfig or a ConfigDict
        limit=None,
        ignore=[f"config.{name}" for name in RESUMABLE_FIELDS],
    )
    if changes:
        raise ConfigError(
            f"{changes}: the run in {files.path} was made with the values in {files.config}, and rerunning "
            f"there resumes it. Use a new --workdir for another run (a resumed run may change only "
            f"{', '.join(RESUMABLE_FIELDS)})."
        )


# ----------------------------------------------------------------------------------------------
# The training data a run's checkpoints were made on.
# ----------------------------------------------------------------------------------------------

DATA_FILES_KEY = "data_files"
"""In a checkpoint's metadata: config field -> `data_fingerprint` of the file it names."""
ALLOW_CHANGED_DATA = "GD2PO_ALLOW_CHANGED_DATA"
"""The environment variable that lets a run resume although its training data changed (set to 1)."""
_SAMPLE_BYTES = 2**20


def data_fingerprint(path: str | pathlib.Path) -> dict[str, Any] | None:
    """``{"path", "size", "sample"}`` of a local data file or directory (a ``datasets`` folder: every
    file in it): the total size in bytes and a BLAKE2b of each file's name, size, first and last MiB;
    None for anything else (a Hub id). The modification time is left out: a copy of the same data
    (``cp``, a checkout) resumes."""
    path = pathlib.Path(path)
    files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else []
    if not files:
        return None
    digest, total = hashlib.blake2b(digest_size=16), 0
    for file in files:
        size = file.stat().st_size
        total += size
        digest.update(f"{file.relative_to(path) if file != path else file.name}|{size}|".encode())
        with open(file, "rb") as handle:
            digest.update(handle.read(_SAMPLE_BYTES))
            if size > _SAMPLE_BYTES:
                handle.seek(max(_SAMPLE_BYTES, size - _SAMPLE_BYTES))
                digest.update(handle.read(_SAMPLE_BYTES))
    return {"path": str(path), "size": total, "sample": digest.hexdigest()}


def check_data_unchanged(
    recorded: Any, current: dict[str, Any], checkpoint: str | pathlib.Path, environ: Any = os.environ
) -> None:
    """Refuse to resume from ``checkpoint`` when a data file it recorded (``recorded``: its
    `DATA_FILES_KEY`, config field -> `data_fingerprint`) differs from ``current``'s: the checkpoint's
    data position would continue on other rows. With ``GD2PO_ALLOW_CHANGED_DATA=1`` it is a warning.
    A checkpoint without a record (older ones) is not checked.

    Raises:
      ConfigError: naming the field, the file, what changed and the override.
    """
    for field, before in (recorded if isinstance(recorded, dict) else {}).items():
        now = current.get(field)
        if not isinstance(before, dict) or now == before:
            continue
        what = (
            f"it is now {now['path']}"
            if now and now.get("path") != before.get("path")
            else f"{before.get('size')} -> {now['size']} bytes"
            if now and now.get("size") != before.get("size")
            else "its content differs"
            if now
            else "it is gone"
        )
        message = (
            f"config.{field}={before.get('path')}: the training data changed since checkpoint {checkpoint} was saved "
            f"({what}); resuming would continue its data position on other rows. Restore the file, use a new "
            f"--workdir, or set {ALLOW_CHANGED_DATA}=1 to resume anyway"
        )
        if environ.get(ALLOW_CHANGED_DATA, "") not in ("", "0"):
            logger.warning("%s (%s is set: resuming)", message, ALLOW_CHANGED_DATA)
            continue
        raise ConfigError(message)


# ----------------------------------------------------------------------------------------------
# The workdir lock.
# ----------------------------------------------------------------------------------------------


def make_workdir(workdir: str | pathlib.Path) -> pathlib.Path:
    """``workdir``, created with its parents if missing.

    Raises:
      RunDirError: one line naming it, when it cannot be created (read-only storage, no permission).
    """
    workdir = pathlib.Path(workdir)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunDirError(
            f"{workdir}: cannot create the workdir ({err.strerror or err}); choose a --workdir on writable storage"
        ) from None
    return workdir


def is_read_only(workdir: str | pathlib.Path) -> bool:
    """Whether this process cannot write in ``workdir`` (read-only storage, or a directory it may not
    write): `os.access`, which also sees a read-only mount (EROFS) for root."""
    return pathlib.Path(workdir).is_dir() and not os.access(workdir, os.W_OK)


class ReadOnlyAccess:
    """What `lock_workdir` gives a reader of a workdir it cannot write (``read_only`` True): no lock
    file (none can be created), nothing to release. No process can write there either, so nothing
    changes under the reader; the reader writes nothing in it."""

    read_only = True

    def __init__(self, path: pathlib.Path):
        self.path = path

    def __enter__(self) -> ReadOnlyAccess:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        pass


class WorkdirLock:
    """An exclusive `fcntl.flock` on ``WORKDIR/.lock`` (`lock_workdir`); the file holds the
    holder's pid, host, program and start time. The kernel drops the lock when the process ends,
    however it ends (also ``kill -9``), so a stale file never blocks anyone."""

    _fd: int | None
    read_only = False

    def __init__(self, path: pathlib.Path, fd: int):
        self.path, self._fd = path, fd

    def __enter__(self) -> WorkdirLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        """Remove the lock file (while still holding it) and drop the lock."""
        if self._fd is None:
            return
        try:
            if _same_file(self.path, self._fd):
                self.path.unlink()
        finally:
            os.close(self._fd)
            self._fd = None


def _same_file(path: pathlib.Path, fd: int) -> bool:
    try:
        st, mine = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _holder(fd: int) -> str:
    """Who holds a lock file, from what it wrote into it."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "null")
    except (OSError, ValueError):
        info = None
    if not isinstance(info, dict):
        return "another process (it has not written its name yet)"
    return (
        f"{info.get('program', 'a process')} (pid {info.get('pid')} on {info.get('host')}, since {info.get('started')})"
    )


def lock_workdir(
    workdir: str | pathlib.Path, program: str, *, readers_ok: bool = False
) -> WorkdirLock | ReadOnlyAccess:
    """Take the workdir's exclusive lock (creating ``workdir``), or stop at once if another
    process holds it: two processes writing one workdir corrupt its metrics and checkpoints.
    Release it with `WorkdirLock.release` (or use it as a context manager); it is also released
    when the process dies.

    Args:
      program: what the holder is ("train.py", "eval.py"), written into the lock file for the
        message another process gets.
      readers_ok: the caller only reads the workdir (eval.py, export.py): on storage this process
        cannot write (`is_read_only`: a finished run on a read-only mount) it gets a `ReadOnlyAccess`
        instead of a lock, and must write nothing there.

    Raises:
      WorkdirBusyError: naming the lock file and its holder.
      LinkInWorkdirError: the lock, or another entry of the workdir, is a symbolic link (`check_no_links`).
    """
    path = RunDir(workdir).lock
    if readers_ok and is_read_only(path.parent):
        logger.warning("%s is read-only: %s reads it without taking its lock", path.parent, program)
        return ReadOnlyAccess(path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        try:  # never through a link (O_NOFOLLOW): the lock is truncated and written below
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        except OSError as err:
            if path.is_symlink():
                raise LinkInWorkdirError(
                    f"{path} is a symbolic link (to {os.readlink(path)}); the lock is never written through "
                    "one: remove the link"
                ) from None
            raise RunDirError(
                f"{path}: cannot create the workdir's lock ({err.strerror or err}); a run needs a workdir it can "
                "write: choose another --workdir (eval.py and export.py read a finished run on read-only storage)"
            ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise RunDirError(f"{path}: not a regular file; remove it (it is the workdir's lock)")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise WorkdirBusyError(
                f"{path.parent} is in use by {holder}; its lock is {path}. Wait for it to "
                "finish, or use another --workdir"
            ) from None
        except OSError as err:
            os.close(fd)
            raise RunDirError(f"{path}: cannot lock it ({err})") from None
        if _same_file(path, fd):  # not removed by a holder that released it meanwhile
            break
        os.close(fd)
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "program": program,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    lock = WorkdirLock(path, fd)
    try:
        check_no_links(workdir)  # no writer in a workdir whose entries lead out of it
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
    except BaseException:
        lock.release()
        raise
    return lock


def staging_name(target: str | pathlib.Path) -> pathlib.Path:
    """A staging path next to ``target`` that is unique to this process:
    ``<target>.tmp-<host>-<pid>-<random>``; `remove_stale_staging` recognizes it."""
    target = pathlib.Path(target)
    return target.with_name(f"{target.name}.tmp-{socket.gethostname()}-{os.getpid()}-{os.urandom(4).hex()}")


def publish_dir(staging: pathlib.Path, target: pathlib.Path) -> bool:
    """Rename the finished ``staging`` directory (a Hugging Face model directory) to ``target``; if
    another process got there first (``target`` holds a config.json), discard ``staging`` and keep
    theirs. Returns whether ours was published."""
    try:
        os.rename(staging, target)  # atomic; fails if target is a non-empty directory
        return True
    except OSError:
        if not (target / "config.json").is_file():
            raise
        shutil.rmtree(staging, ignore_errors=True)
        return False


def replace_dir(staging: pathlib.Path, target: pathlib.Path) -> None:
    """Put the finished directory ``staging`` in the place of ``target`` (replacing what is there),
    so that ``target`` is never half written: a kill in between leaves no ``target`` and staging
    names that `remove_stale_staging` removes."""
    previous = None
    if target.exists():
        previous = staging_name(target)
        os.rename(target, previous)
    os.rename(staging, target)
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_staging(directory: str | pathlib.Path, *, all_stale: bool = False) -> list[pathlib.Path]:
    """Remove the staging files and directories that killed processes left in ``directory``:
    `staging_name`s whose process (on this host) is gone, and, with ``all_stale`` (the caller holds
    the directory's lock, so no one else is writing there), every `staging_name` and every
    temporary file of `write_text` (``.<name>.*.tmp``). Returns what was removed."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        return []
    host, removed = socket.gethostname(), []
    for path in directory.iterdir():
        name, stale = path.name, False
        if ".tmp-" in name:
            _, _, tail = name.rpartition(".tmp-")
            owner, _, rest = tail.rpartition("-")
            owner_host, _, pid = owner.rpartition("-")
            stale = all_stale or (owner_host == host and pid.isdigit() and not _pid_alive(int(pid)))
        elif all_stale and name.startswith(".") and name.endswith(".tmp") and path.is_file():
            stale = True
        if stale:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            removed.append(path)
    if removed:
        logger.info("removed what interrupted writes left in %s: %s", directory, [p.name for p in removed])
    return removed
