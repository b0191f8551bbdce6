"""Export a checkpoint of a training run as a Hugging Face model directory.

    python export.py --workdir=DIR --out=HF_DIR                        # the latest checkpoint
    python export.py --workdir=DIR --step=N --dtype=bfloat16 --out=HF_DIR

HF_DIR gets what train.py writes to DIR/policy at the end of a run, for checkpoint N (default: the
latest) of DIR/checkpoints: config.json, the tokenizer files and chat template, and the weights in
safetensors (sharded above 5 GiB, with an index), which transformers' AutoModelForCausalLM and
vLLM load. The weights are the checkpoint's master weights cast to --dtype (default: the run's
config.export.dtype, itself defaulting to config.model.dtype). HF_DIR must not exist or be empty;
it appears whole when the export is complete. While train.py (or eval.py) works in DIR the export
stops at once, naming the holder of DIR/.lock (the trainer prunes the checkpoints it reads).
A LoRA run's checkpoint (config.model.lora) is exported merged: its adapters on the base its metadata
references (checked against the base's checksum), as train.py writes DIR/policy.

An export never imports the run's reward functions; a task of the run's own (config.task naming
module:object) is imported only with --trust_workdir_code (DIR/config.json could name any code).
On read-only storage (a finished run) the export reads DIR without taking its lock.
"""

from __future__ import annotations

import dataclasses
import pathlib

import jax.numpy as jnp
from absl import flags

from gd2po_jax import cli
from gd2po_jax.config import DTYPES, ConfigError, RunConfig
from gd2po_jax.data.tokenization import load_tokenizer
from gd2po_jax.errors import UserError
from gd2po_jax.evaluation.policy import abstract_params, lora_from_checkpoint
from gd2po_jax.models import save_pretrained
from gd2po_jax.models.logprobs import merge_model
from gd2po_jax.models.lora import merged_decoder
from gd2po_jax.runtime import run_dir
from gd2po_jax.runtime.checkpoints import Checkpoints
from gd2po_jax.runtime.run_dir import RunDir
from gd2po_jax.runtime.sharding import make_mesh
from gd2po_jax.tasks import task_of
from gd2po_jax.tasks.setup import with_local_models

FLAGS = flags.FLAGS


class ExportError(UserError, ValueError):
    """An export that cannot be made; the message names the flag or file to fix."""


@dataclasses.dataclass(frozen=True)
class Exported:
    """What `export_checkpoint` wrote: checkpoint ``step`` of the run, in ``dtype``, as ``out``'s ``files``."""

    step: int
    dtype: str
    out: pathlib.Path
    files: list[str]


def check_out_dir(out: pathlib.Path) -> None:
    """``--out`` must be a new directory, or an empty one (an export never overwrites files).

    Raises:
      ExportError: naming the flag.
    """
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "is not empty" if out.is_dir() else "is a file"
        raise ExportError(f"--out={out}: {what}; pass a new directory (an export never overwrites)")


@dataclasses.dataclass(frozen=True)
class ExportSetup:
    """What an export needs of a run: the policy's model directory, its tokenizer and the mesh (no
    data beyond what the task reads to find its model, no reward function)."""

    model_path: pathlib.Path
    tokenizer: object
    mesh: object


def export_setup(config: RunConfig, workdir: pathlib.Path) -> ExportSetup:
    """The `ExportSetup` of the run of ``config`` in ``workdir``: its mesh, its task's model directory
    (`gd2po_jax.tasks.Task.load_splits`) and tokenizer; the run's reward functions are not imported.

    Raises:
      ConfigError: the config does not fit this machine's devices, or its task cannot be had.
    """
    try:
        mesh = make_mesh(data=config.mesh.data, fsdp=config.mesh.fsdp, tensor=config.mesh.tensor)
    except ValueError as err:
        raise ConfigError(f"config.mesh: {err}") from err
    config.check_mesh(num_data_shards=mesh.shape["data"] * mesh.shape["fsdp"])
    config = with_local_models(config)
    _, model_path = task_of(config).load_splits(config, workdir)
    return ExportSetup(model_path, load_tokenizer(config.model.tokenizer_path or model_path), mesh)


def export_checkpoint(
    workdir: str | pathlib.Path,
    out: str | pathlib.Path,
    *,
    step: int | None = None,
    dtype: str | None = None,
    trust_workdir_code: bool = False,
) -> Exported:
    """Write checkpoint ``step`` (default: the latest) of the run in ``workdir`` to ``out`` as a
    Hugging Face model directory, as the trainer exports its final policy (`save_pretrained` of the
    master weights cast to ``dtype``, with the run's tokenizer and the base model's tokenizer /
    chat template / generation files). The run's data, tokenizer and mesh are rebuilt from its
    config.json as eval.py does (`gd2po_jax.tasks.setup.build_setup`).

    Args:
      dtype: float32 | bfloat16; None or empty: the run's ``config.export.dtype`` (empty there:
        ``config.model.dtype``).
      trust_workdir_code: import a task of the run's own that config.json names (module:object);
        reward functions are never imported (`run_dir.trusting_code_of`).

    Raises:
      ExportError: naming the flag or file (no config.json, no such step, a non-empty ``out``).
      UntrustedCodeError: config.json names a task of its own and ``trust_workdir_code`` is False.
      RunDirError: the workdir is busy (naming the holder of its lock) or the checkpoint is damaged.
      ConfigError: the run's config.json is invalid, or does not fit this machine's devices.
    """
    workdir, out = pathlib.Path(workdir), pathlib.Path(out)
    files = RunDir(workdir)
    if dtype and dtype not in DTYPES:
        raise ExportError(f"--dtype={dtype}: must be one of {', '.join(DTYPES)}")
    if not files.config.is_file():
        raise ExportError(f"--workdir={workdir}: {files.config} not found (a directory written by train.py)")
    check_out_dir(out)
    # The trainer prunes the checkpoints this reads: one process in the workdir at a time (as eval.py).
    with (
        run_dir.trusting_code_of(workdir, trust=trust_workdir_code, rewards=False),
        run_dir.lock_workdir(workdir, "export.py", readers_ok=True),  # read-only storage: no lock
    ):
        config = run_dir.load_run_config(workdir)
        dtype = dtype or config.export.resolved_dtype(config.model.dtype)
        with Checkpoints(files.checkpoints, create=False) as checkpoints:
            steps = checkpoints.steps()
            if not steps:
                raise ExportError(
                    f"--workdir={workdir}: no checkpoint in {files.checkpoints}"
                    + (
                        f" (the run's final policy is in {files.policy})"
                        if (files.policy / "config.json").is_file()
                        else ""
                    )
                )
            if step is None:
                step = steps[-1]
            elif step not in steps:
                raise ExportError(
                    f"--step={step}: no such checkpoint in {files.checkpoints}; available steps: "
                    f"{', '.join(map(str, steps))}"
                )
            setup = export_setup(config, workdir)
            if config.model.lora.enabled:  # the adapters on the base the checkpoint references, merged
                graphdef, params, frozen = lora_from_checkpoint(config, setup.mesh, checkpoints, step)
            else:
                graphdef, target = abstract_params(setup.model_path, jnp.dtype(config.train.master_dtype), setup.mesh)
                params, frozen = checkpoints.restore_params(step, target), None
        out.parent.mkdir(parents=True, exist_ok=True)
        run_dir.remove_stale_staging(out.parent)  # what killed exports left (their processes are gone)
        staging = run_dir.staging_name(out)
        save_pretrained(
            merged_decoder(merge_model(graphdef, params, dtype, frozen)),
            staging,
            dtype=jnp.dtype(dtype),
            tokenizer=setup.tokenizer,
            copy_files_from=setup.model_path,
        )
        run_dir.publish_dir(staging, out)  # a rename: ``out`` appears whole (it may be an empty directory)
    return Exported(step=step, dtype=dtype, out=out, files=sorted(p.name for p in out.iterdir()))


def define_flags() -> None:
    """export.py's flags (`cli.run` calls this before parsing the command line)."""
    main_module = cli.main_module_name()
    flags.DEFINE_string(
        "workdir",
        None,
        "Training run directory (holds config.json and checkpoints/).",
        required=True,
        module_name=main_module,
    )
    flags.DEFINE_integer("step", None, "Checkpoint to export (default: the latest).", module_name=main_module)
    flags.DEFINE_enum(
        "dtype",
        None,
        list(DTYPES),
        "Stored dtype (default: the run's config.export.dtype, empty there: config.model.dtype).",
        module_name=main_module,
    )
    flags.DEFINE_bool(
        "trust_workdir_code",
        False,
        "Import a task of the run's own that --workdir's config.json names (module:object); only for a "
        "workdir you trust. Reward functions are never imported.",
        module_name=main_module,
    )
    flags.DEFINE_string(
        "out", None, "Hugging Face model directory to write (new or empty).", required=True, module_name=main_module
    )


def main(argv):
    cli.start(argv)
    with cli.user_errors("export.py"):  # a bad flag, a missing file, a busy workdir, a damaged checkpoint
        exported = export_checkpoint(
            FLAGS.workdir, FLAGS.out, step=FLAGS.step, dtype=FLAGS.dtype, trust_workdir_code=FLAGS.trust_workdir_code
        )
    print(
        f"exported checkpoint step {exported.step} of {FLAGS.workdir} ({exported.dtype}) to {exported.out}: "
        f"{', '.join(exported.files)}"
    )


def run() -> None:
    """``python export.py`` and the console script ``gd2po-export``."""
    cli.run(__doc__, define_flags, main)


if __name__ == "__main__":
    run()
