"""What ``python eval.py`` does: pick a policy, generate greedily, score, write a report.

Two sources of a policy:

  a training run   ``--workdir=DIR`` with ``DIR/config.json`` (written by train.py): the data,
                   tokenizer and mesh are rebuilt from that config (`run_setup.build_setup`) and the
                   parameters are restored from ``DIR/checkpoints`` (latest, or ``--checkpoint_step``;
                   only the ``params`` of the saved `TrainState` are read), else ``DIR/policy``.
  a plain model    ``--model_path=HF_DIR``: a Hugging Face checkpoint directory (config.json,
                   safetensors, a tokenizer with a chat template); no training run needed.

Three kinds of evaluation:

  a split          ``--split=test|validation`` of the run's own data, scored with the training
                   task's tool-calling metrics, or by the run's reward models for a reward_model
                   run -> ``DIR/eval/<split>.json`` (+ ``.jsonl``).
  API-Bank         ``--data=PATH`` of an API-Bank directory / level file (or ``--data=api_bank`` with
                   ``--api_bank_dir=DIR``), scored as docs/algorithm.md#api-bank-metric says
                   -> ``DIR/eval/api_bank.json`` (+ ``.jsonl``).
  safe alignment   ``--data=PATH`` of a directory of verl parquet sets / one such file, scored by the
                   reward models of the run in ``--workdir`` (`gd2po_jax.evaluation.safe_alignment`)
                   -> ``DIR/eval/safe_alignment.json`` (+ ``.jsonl``).

No data set has a default location: the user passes the directory (`API_BANK_ORIGIN` and
`gd2po_jax.evaluation.safe_alignment.SETS_ORIGIN` say where they are published).

Generation is greedy (`gd2po_jax.evaluation.generation.evaluate`). ``--habits`` generates nothing:
it prints the habit breakdown (`gd2po_jax.tasks.synthetic_tools.habits`) of a synthetic_tools run's saved
generations ``DIR/eval/<name>.jsonl`` (before_rl and after_rl, or ``--split``'s).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections import defaultdict
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from gd2po_jax.config import ConfigError, RunConfig
from gd2po_jax.data.loaders import load_data
from gd2po_jax.data.prompts import PromptSet, build_prompt_set
from gd2po_jax.data.tokenization import eos_token_ids, load_tokenizer, pad_token_id
from gd2po_jax.evaluation.api_bank import (
    DEFAULT_MAX_THINK_WORDS,
    ApiBankReport,
    api_bank_report,
    api_bank_scorer,
)
from gd2po_jax.evaluation.generation import evaluate, response_budgets, write_report
from gd2po_jax.evaluation.safe_alignment import (
    evaluate_safe_alignment,
    is_safe_alignment_data,
    resolve_sets,
    safe_alignment_table,
    set_metrics,
)
from gd2po_jax.models import Decoder, load_pretrained
from gd2po_jax.models.config import load_hf_config
from gd2po_jax.models.lora import (
    ADAPTER_CONFIG,
    LORA_BASE_KEY,
    base_reference,
    check_base,
    load_peft_adapter,
    lora_spec,
    read_adapter_config,
    split_lora,
)
from gd2po_jax.models.sampling import bucket_length
from gd2po_jax.rewards.base import build_reward_function
from gd2po_jax.rewards.reward_model import RewardModelReward
from gd2po_jax.models.logprobs import merge_model
from gd2po_jax.tasks.setup import RunSetup, build_setup, eval_split, reward_spec
from gd2po_jax.runtime import run_dir
from gd2po_jax.runtime.checkpoints import Checkpoints
from gd2po_jax.runtime.distributed import is_primary
from gd2po_jax.runtime.hub import resolve_model_dir
from gd2po_jax.runtime.sharding import make_mesh, mesh_of, variable_sharding
from gd2po_jax.runtime.run_dir import RunDir, RunDirError
from gd2po_jax.tasks import task_of
from gd2po_jax.tasks.safety import task as safety_embedded
from gd2po_jax.tasks.synthetic_tools.habits import habits_of_run, habits_table

API_BANK = "api_bank"
"""``--data=api_bank``: the API-Bank directory ``--api_bank_dir`` names (no default)."""
API_BANK_ORIGIN = ("the level-{1,2,3}-api_processed.json files of tool-calling/API_Bank/ in "
                   "github.com/Qwen-Applications/GD2PO")
"""Where the API-Bank evaluation files are published (for errors that ask for them)."""
API_BANK_MAX_NEW_TOKENS = 4096  # docs/algorithm.md#api-bank-metric
API_BANK_MAX_TOTAL_TOKENS = 4096
"""Prompt + response tokens of an API-Bank example with ``--model_path`` (no run config): the official
generate_deterministic.py's vLLM ``max_model_len`` default (a run's is ``eval.max_total_tokens``)."""
MODEL_PATH_BATCH_SIZE = 32
SETS = "sets"
"""What a training run with ``eval.sets`` evaluates, in place of a split's name (`eval_target`)."""


class EvalError(ValueError):
    """A request eval.py cannot serve; the message names the flag or file to fix."""


@dataclasses.dataclass(frozen=True)
class EvalOptions:
    """eval.py's flags (see eval.py for their help).

    ``max_new_tokens`` / ``batch_size`` None: the run's config values for a split; for API-Bank
    4096 new tokens and the run's ``eval.batch_size`` (32 with ``model_path``).
    ``max_total_tokens`` None: for API-Bank the run's ``eval.max_total_tokens`` (4096 with
    ``model_path``, `API_BANK_MAX_TOTAL_TOKENS`); 0: no cap.
    ``max_examples`` 0: every example (per level for API-Bank).
    ``habits``: names of saved evaluations (``before_rl``, ``after_rl``, ``test`` ...) whose habit
    breakdown to print instead of evaluating.
    """

    workdir: str = ""
    split: str = "test"
    checkpoint_step: int | None = None
    data: str = ""
    api_bank_dir: str = ""
    model_path: str = ""
    dtype: str = "bfloat16"
    max_new_tokens: int | None = None
    max_total_tokens: int | None = None
    batch_size: int | None = None
    max_examples: int = 0
    max_think_words: int = DEFAULT_MAX_THINK_WORDS
    max_prompt_tokens: int = 4096
    habits: tuple[str, ...] = ()
    progress: bool = True


@dataclasses.dataclass
class Policy:
    """A model ready to generate, with what decoding needs; ``source`` says where it came from."""

    model: Any
    tokenizer: Any
    eos_ids: list[int]
    pad_id: int
    source: dict[str, Any]


# ----------------------------------------------------------------------------------------------
# Where things are.
# ----------------------------------------------------------------------------------------------


def output_dir(options: EvalOptions) -> pathlib.Path:
    """The workdir reports go to: ``--workdir``, or ``runs/eval/<model dir name>`` for a plain
    model evaluated without one."""
    if options.workdir:
        return pathlib.Path(options.workdir)
    if options.model_path:
        return pathlib.Path("runs") / "eval" / pathlib.Path(options.model_path).resolve().name
    raise EvalError("pass --workdir=DIR (a training run directory) or --model_path=HF_DIR")


def load_run_config_or_eval_error(workdir: pathlib.Path) -> RunConfig:
    """`run_dir.load_run_config` of the training run in ``workdir``, its errors as `EvalError` (a
    missing ``config.json`` with a hint to ``--model_path``)."""
    file = RunDir(workdir).config
    if not file.is_file():
        raise EvalError(
            f"{file} not found: --workdir must be a directory written by train.py; to evaluate a "
            "Hugging Face model directory instead, pass --model_path=HF_DIR"
        )
    try:
        return run_dir.load_run_config(workdir)
    except (ConfigError, RunDirError) as err:  # both name the file
        raise EvalError(str(err)) from None


def resolve_api_bank(data: str, api_bank_dir: str) -> pathlib.Path:
    """The API-Bank directory or level file ``--data`` names (``api_bank``: ``--api_bank_dir``).

    Raises:
      EvalError: ``api_bank`` without ``--api_bank_dir``, or a path that does not exist, naming the
        flag and where the files are published (`API_BANK_ORIGIN`).
    """
    if data == API_BANK and not api_bank_dir:
        raise EvalError(f"--data=api_bank needs --api_bank_dir=DIR (or pass --data=DIR): a directory of "
                        f"{API_BANK_ORIGIN}")
    path = pathlib.Path(api_bank_dir if data == API_BANK else data)
    if not path.exists():
        flag = f"--api_bank_dir={api_bank_dir}" if data == API_BANK else f"--data={data}"
        raise EvalError(f"{flag}: {path} does not exist (an API-Bank directory of level-N files, or one such "
                        f"file: {API_BANK_ORIGIN})")
    return path


# ----------------------------------------------------------------------------------------------
# Policies.
# ----------------------------------------------------------------------------------------------


def abstract_params(model_dir: pathlib.Path, dtype, mesh) -> tuple[Any, nnx.State]:
    """(graphdef, params) of the decoder described by ``model_dir/config.json``, with
    `jax.ShapeDtypeStruct` values placed on their annotated shardings (nothing is allocated)."""
    model = nnx.eval_shape(lambda: Decoder(load_hf_config(model_dir), dtype=dtype, rngs=nnx.Rngs(0)))
    for _, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Param):
            node.set_value(jax.ShapeDtypeStruct(node.shape, dtype, sharding=variable_sharding(node, mesh)))
    return nnx.split(model, nnx.Param)


def lora_from_checkpoint(config: RunConfig, mesh, checkpoints: Checkpoints, step: int) -> tuple[Any, Any, Any]:
    """(graphdef, adapters, base) of a LoRA run's checkpoint ``step``: the base from the directory
    its metadata references (checked against its checksum), the adapters from the checkpoint.

    Raises:
      EvalError: the checkpoint references no base, or one whose weights have changed.
    """
    meta = checkpoints.metadata(step).get(LORA_BASE_KEY)
    if meta is None:
        raise EvalError(f"checkpoint {checkpoints.step_dir(step)} holds no LoRA adapters (the run's config.json "
                        "sets config.model.lora.rank > 0)")
    master = jnp.dtype(config.train.master_dtype)
    model = load_pretrained(meta["path"], dtype=jnp.dtype(config.model.lora.base_dtype or master), mesh=mesh,
                            lora=lora_spec(config))
    graphdef, fresh, frozen = split_lora(model)
    try:
        check_base({LORA_BASE_KEY: meta}, base_reference(meta["path"], frozen), checkpoints.step_dir(step))
    except ConfigError as err:
        raise EvalError(str(err)) from None
    return graphdef, checkpoints.restore_params(step, fresh), frozen


def policy_from_run(config: RunConfig, setup: RunSetup, workdir: pathlib.Path, step: int | None) -> Policy:
    """The run's policy: checkpoint ``step`` (default the latest), else ``workdir/policy``.

    Raises:
      EvalError: ``step`` is not among the saved checkpoints, or the run has neither a checkpoint
        nor a policy directory.
    """
    files = RunDir(workdir)
    common = dict(tokenizer=setup.tokenizer, eos_ids=setup.eos_ids, pad_id=setup.pad_id)
    with Checkpoints(files.checkpoints, create=False) as checkpoints:
        steps = checkpoints.steps()
        if step is not None and step not in steps:
            raise EvalError(f"--checkpoint_step={step}: no such checkpoint in {files.checkpoints}; "
                            f"available steps: {steps or 'none'}")
        if steps:
            step = steps[-1] if step is None else step
            if config.model.lora.enabled:
                graphdef, params, frozen = lora_from_checkpoint(config, setup.mesh, checkpoints, step)
            else:
                graphdef, target = abstract_params(setup.model_path, jnp.dtype(config.train.master_dtype), setup.mesh)
                params, frozen = checkpoints.restore_params(step, target), None
            model = merge_model(graphdef, params, config.model.dtype, frozen)
            return Policy(model=model, source={"checkpoint": str(files.checkpoints), "step": step}, **common)
    policy_dir = files.policy
    if (policy_dir / "config.json").is_file():
        model = load_pretrained(policy_dir, dtype=jnp.dtype(config.model.dtype), mesh=setup.mesh)
        return Policy(model=model, source={"model_path": str(policy_dir)}, **common)
    raise EvalError(f"{workdir} has no checkpoint in {files.checkpoints} and no exported policy in "
                    f"{policy_dir}: train first (python train.py --workdir={workdir}) or pass --model_path")


def policy_from_model_path(model_path: str, dtype: str) -> Policy:
    """A Hugging Face checkpoint directory or Hub id (`gd2po_jax.runtime.hub.resolve_model_dir`), its
    parameters sharded over all devices (fsdp); or a PEFT LoRA adapter directory, on its base
    (`adapter_on_base`)."""
    try:
        path = resolve_model_dir(model_path, f"--model_path={model_path}")
    except FileNotFoundError as err:
        raise EvalError(str(err)) from None
    if not (path / "config.json").is_file() and not (path / ADAPTER_CONFIG).is_file():
        raise EvalError(f"--model_path={model_path}: no config.json there (a Hugging Face model directory) nor "
                        f"{ADAPTER_CONFIG} (a PEFT LoRA adapter)")
    mesh = make_mesh(data=1, fsdp=-1)
    if (path / ADAPTER_CONFIG).is_file():  # a PEFT LoRA adapter (a run's policy_adapter/) on its base
        model, base = adapter_on_base(path, dtype, mesh)
        tokenizer_dir = path if (path / "tokenizer_config.json").is_file() else base
        source = {"model_path": str(path), "base_model": str(base)}
    else:
        model = load_pretrained(path, dtype=jnp.dtype(dtype), mesh=mesh)
        tokenizer_dir, source = path, {"model_path": str(path)}
    tokenizer = load_tokenizer(tokenizer_dir)
    eos_ids = eos_token_ids(tokenizer, tokenizer_dir)
    pad_id = pad_token_id(tokenizer, eos_ids)
    return Policy(model=model, tokenizer=tokenizer, eos_ids=eos_ids, pad_id=pad_id, source=source)


def adapter_on_base(adapter_dir: pathlib.Path, dtype: str, mesh) -> tuple[Any, pathlib.Path]:
    """(the model, its base's directory) of a PEFT LoRA adapter directory: the base named by its
    ``base_model_name_or_path`` with the adapters loaded on it, in ``dtype``.

    Raises:
      EvalError: naming the adapter directory, when its config or base cannot be used.
    """
    try:
        spec, base = read_adapter_config(adapter_dir, dtype=dtype)
        base_dir = resolve_model_dir(base, f"{adapter_dir / ADAPTER_CONFIG}: base_model_name_or_path={base!r}")
        model = load_pretrained(base_dir, dtype=jnp.dtype(dtype), mesh=mesh, lora=spec)
        load_peft_adapter(model, adapter_dir, mesh)
    except (ValueError, FileNotFoundError, KeyError) as err:
        raise EvalError(f"--model_path={adapter_dir}: {err}") from None
    return model, base_dir


# ----------------------------------------------------------------------------------------------
# A split of the run's data, and the habit breakdown of saved generations.
# ----------------------------------------------------------------------------------------------


def evaluate_split(config: RunConfig, setup: RunSetup, model, split: str, out_dir: pathlib.Path, name: str,
                   *, progress: bool = True, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Greedy evaluation on ``split`` of the run's data, scored as its task says
    (`gd2po_jax.tasks.Task.eval_scorer`); writes ``out_dir/<name>.json``
    (with the fields of ``extra``, e.g. which policy it was) and ``<name>.jsonl`` and returns the
    summary (``correct_acc``, ``format_acc``, ``length``, ...; for reward models each reward's mean,
    ``reward_sum`` and ``reward_names``). Each file is written once, atomically: a summary on disk is
    a finished evaluation."""
    task = task_of(config)
    scorer = task.eval_scorer(config, setup.reward_fn)
    summary, records = evaluate(
        model, setup.evals[split], setup.tokenizer, scorer,
        batch_size=config.eval.batch_size, max_new_tokens=config.sampling.max_new_tokens,
        eos_token_ids=setup.eos_ids, pad_token_id=setup.pad_id, prompt_length=setup.prompt_length,
        progress=progress, desc=f"eval {name}",
    )
    reward_names = getattr(scorer, "names", None)  # scored by the run's reward functions or reward models
    if reward_names is None and config.rewards.kind == "reward_model":
        reward_names = config.rewards.names  # a task's own scorer around the reward models
    if reward_names is not None:
        summary = {"split": split, **summary, "reward_names": list(reward_names), **(extra or {})}
    else:
        summary = {"split": split, **summary, "correct_acc": summary.get("correct"),
                   "format_acc": summary.get("format"), **(extra or {})}
    summary = task.eval_summary(config, summary)
    write_report(out_dir, name, summary, records)
    return summary


def eval_target(config: RunConfig, setup: RunSetup) -> str | None:
    """What a training run evaluates before RL, every ``eval.every_steps`` and after RL: `SETS` when
    ``config.eval.sets`` names helpfulness-safety sets, else the split (`gd2po_jax.tasks.setup.eval_split`;
    None: nothing). Called when the run starts, before anything is computed.

    Raises:
      ConfigError: naming ``config.eval.sets``: no such directory or file (or one without parquet
        sets), or a run whose rewards are not the reward models alone (which score the sets); or
        `eval_split`'s.
    """
    if not config.eval.sets:
        return eval_split(config, setup)
    try:
        resolve_sets(config.eval.sets)
    except FileNotFoundError as err:
        raise ConfigError(f"config.eval.sets={config.eval.sets!r}: {err}") from None
    if not isinstance(setup.reward_fn, RewardModelReward):
        raise ConfigError(f"config.eval.sets: helpfulness-safety sets are scored by the run's reward models, but its "
                          f"rewards are config.rewards.kind={config.rewards.kind!r}"
                          f"{' with rewards.functions' if config.rewards.functions else ''}: use "
                          "rewards.kind='reward_model' without rewards.functions, or leave config.eval.sets empty")
    return SETS


def evaluate_run(config: RunConfig, setup: RunSetup, model, split: str, out_dir: pathlib.Path, name: str,
                 *, progress: bool = True, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One evaluation of a training run (``name``: before_rl, step_<N>, after_rl) on what `eval_target`
    gave: with `SETS`, the sets of ``config.eval.sets``, greedy at the run's ``sampling.max_new_tokens``,
    prompts as the training prompts (``data.max_prompt_tokens``, ``data.prompt_truncation``), the
    first ``eval.max_examples`` of each, scored by the run's reward models
    (`gd2po_jax.evaluation.safe_alignment.evaluate_safe_alignment`); else the split (`evaluate_split`).
    Writes ``out_dir/<name>.json`` and ``.jsonl``; returns the summary (`eval_metrics` reads it)."""
    if split != SETS:
        return evaluate_split(config, setup, model, split, out_dir, name, progress=progress, extra=extra)
    policy = Policy(model=model, tokenizer=setup.tokenizer, eos_ids=setup.eos_ids, pad_id=setup.pad_id, source={})
    return evaluate_safe_alignment(
        policy, resolve_sets(config.eval.sets), setup.reward_fn, out_dir, batch_size=config.eval.batch_size,
        max_new_tokens=config.sampling.max_new_tokens, max_examples=config.eval.max_examples,
        max_prompt_tokens=config.data.max_prompt_tokens, truncation=config.data.prompt_truncation,
        template_kwargs=config.data.template_kwargs, progress=progress, extra=extra, name=name,
    )


def eval_metrics(summary: Mapping[str, Any]) -> dict[str, Any]:
    """An evaluation's numbers as metrics.jsonl's ``eval/...``: a split's ``eval/<metric>``; a sets
    evaluation's overall mean as ``eval/<metric>`` and each set's as ``eval/<set>/<metric>``
    (`gd2po_jax.evaluation.safe_alignment.set_metrics`: ``eval/alpaca_test/useful`` ...)."""
    if "sets" in summary:
        return {f"eval/{k}": v for k, v in set_metrics(summary).items()}
    return {f"eval/{k}": v for k, v in summary.items() if isinstance(v, (int, float))}


def logged_before_rl(config: RunConfig, before: Mapping[str, Any] | None) -> dict[str, Any]:
    """The before-RL evaluation's `eval_metrics`, logged as step 0 of metrics.jsonl (as verl's
    ``val_before_train`` logs at step 0) for a run that validates on ``eval.sets``; empty otherwise
    (a split's before-RL evaluation is in ``eval/before_rl.json`` only)."""
    return eval_metrics(before) if before is not None and config.eval.sets else {}


def habits_of_workdir(workdir: pathlib.Path, names: Sequence[str]) -> dict[str, dict[str, dict[str, int]]]:
    """`gd2po_jax.tasks.synthetic_tools.habits.habits_of_run` on the saved generations
    ``eval/<name>.jsonl`` of each of ``names`` in ``workdir``.

    Raises:
      EvalError: the run is not of the synthetic_tools task, or an evaluation was not saved.
    """
    config = load_run_config_or_eval_error(workdir)

    def generations(name: str):
        file = RunDir(workdir).eval_generations(name)
        if not file.is_file():
            raise EvalError(f"--habits: {file} not found (evaluations are saved by train.py as "
                            "before_rl / after_rl, by eval.py as test / validation)")
        return run_dir.read_jsonl(file)

    try:
        return habits_of_run(config, names, generations)
    except ValueError as err:
        raise EvalError(f"--habits: {RunDir(workdir).config} {err}") from None


# ----------------------------------------------------------------------------------------------
# API-Bank.
# ----------------------------------------------------------------------------------------------


def first_per_level(levels: list[Any], max_examples: int) -> list[int]:
    """Indices of the first ``max_examples`` rows of each level, in file order (0: all rows)."""
    seen: dict[Any, int] = defaultdict(int)
    keep = []
    for index, level in enumerate(levels):
        if not max_examples or seen[level] < max_examples:
            keep.append(index)
            seen[level] += 1
    return keep


def api_bank_prompts(path: pathlib.Path, tokenizer, max_examples: int, max_prompt_tokens: int,
                     template_kwargs: Mapping[str, Any] | None = None) -> PromptSet:
    """API-Bank system + user messages through the chat template (first ``max_examples`` per level),
    with ``template_kwargs`` (a run's ``data.template_kwargs``)."""
    dataset = load_data(path, kind="api_bank").dataset
    dataset = dataset.select(first_per_level(list(dataset["level"]), max_examples))
    return build_prompt_set(dataset, tokenizer, max_prompt_tokens=max_prompt_tokens,
                            where=f"API-Bank data {path} (--max_prompt_tokens)", template_kwargs=template_kwargs)


def evaluate_api_bank(policy: Policy, path: pathlib.Path, out_dir: pathlib.Path, *, batch_size: int,
                      max_new_tokens: int, max_examples: int, max_think_words: int, max_prompt_tokens: int,
                      progress: bool, template_kwargs: Mapping[str, Any] | None = None,
                      max_total_tokens: int = 0) -> dict[str, Any]:
    """Greedy generation over API-Bank; writes ``out_dir/api_bank.json`` and ``api_bank.jsonl``.

    Each example gets at most ``max_new_tokens`` (the official ``max_tokens``) and, with
    ``max_total_tokens`` > 0, at most ``max_total_tokens`` minus its prompt's tokens (the official
    vLLM ``max_model_len``, tool-calling/API_Bank/generate_deterministic.py: 4096 for both):
    `gd2po_jax.evaluation.generation.evaluate` generates the set in one program at its shortest
    prompt's budget and cuts each response to its own."""
    prompts = api_bank_prompts(path, policy.tokenizer, max_examples, max_prompt_tokens, template_kwargs)
    try:  # before any generation: a prompt that leaves no token of a response
        response_budgets([len(ids) for ids in prompts.token_ids], max_new_tokens, max_total_tokens, f"API-Bank {path}")
    except ValueError as err:
        raise EvalError(str(err)) from None
    summary, records = evaluate(
        policy.model, prompts, policy.tokenizer, api_bank_scorer(max_think_words), batch_size=batch_size,
        max_new_tokens=max_new_tokens, eos_token_ids=policy.eos_ids, pad_token_id=policy.pad_id,
        prompt_length=bucket_length(prompts.max_tokens), progress=progress, desc="API-Bank",
        max_total_tokens=max_total_tokens,
    )
    report = api_bank_report(records)
    result = {
        **report.to_dict(), "num_examples": len(records), "data": str(path), "policy": policy.source,
        "max_new_tokens": max_new_tokens, "max_total_tokens": max_total_tokens, "max_think_words": max_think_words,
        "truncation_rate": summary["truncation_rate"], "response_tokens": summary["response_tokens"],
    }
    write_report(out_dir, API_BANK, result, records)
    return result


# ----------------------------------------------------------------------------------------------
# Entry point.
# ----------------------------------------------------------------------------------------------


def split_table(summary: dict[str, Any]) -> str:
    """The headline metrics of a split evaluation as a two-column text table."""
    rows = [("examples", "num_examples"), ("Correct Acc", "correct_acc"), ("Format Acc", "format_acc"),
            ("Length", "length"), ("Correctness", "correctness"), ("Truncation", "truncation_rate"),
            ("Resp. tokens", "response_tokens")]
    lines = [f"{summary['split']} split  ({_describe(summary['policy'])})"]
    for label, key in rows:
        value = summary.get(key)
        lines.append(f"{label:<14}{'-' if value is None else format(value, '.4g'):>10}")
    if "by_request" in summary:  # the safety_embedded task: reward models and ground truth per request type
        lines.append(safety_embedded.by_request_table({summary["split"]: summary}, summary["reward_names"]))
    return "\n".join(lines)


def _describe(source: dict[str, Any]) -> str:
    if "step" in source:
        return f"checkpoint step {source['step']}"
    return source["model_path"]


def _run_setup(options: EvalOptions, workdir: pathlib.Path):
    """(config, setup) of the training run in ``workdir``, with the eval flags applied to the config."""
    changes = {"eval.max_examples": options.max_examples}
    if options.batch_size:
        changes["eval.batch_size"] = options.batch_size
    if options.max_new_tokens and not options.data:
        changes["sampling.max_new_tokens"] = options.max_new_tokens
    config = load_run_config_or_eval_error(workdir).replace(changes)
    return config, build_setup(config, workdir)


def _evaluate_split(options: EvalOptions, workdir: pathlib.Path) -> dict[str, Any]:
    if options.model_path:
        raise EvalError("--model_path needs --data (api_bank, safe_alignment, or a path to such data): a plain "
                        "model has no training config to take a --split from")
    config, setup = _run_setup(options, workdir)
    if options.split not in setup.evals:
        raise EvalError(f"--split={options.split}: the run has no such split (config.data.{options.split} "
                        f"is empty); available: {sorted(setup.evals)}")
    policy = policy_from_run(config, setup, workdir, options.checkpoint_step)
    return evaluate_split(config, setup, policy.model, options.split, RunDir(workdir).eval_dir, options.split,
                          progress=options.progress, extra={"policy": policy.source})


def _evaluate_api_bank(options: EvalOptions, workdir: pathlib.Path) -> dict[str, Any]:
    path = resolve_api_bank(options.data, options.api_bank_dir)
    template_kwargs = None
    if options.model_path:
        policy, batch_size = policy_from_model_path(options.model_path, options.dtype), MODEL_PATH_BATCH_SIZE
        max_total_tokens = API_BANK_MAX_TOTAL_TOKENS
    else:
        config, setup = _run_setup(options, workdir)
        policy, batch_size = policy_from_run(config, setup, workdir, options.checkpoint_step), config.eval.batch_size
        template_kwargs = config.data.template_kwargs  # rendered as the run's prompts were
        max_total_tokens = config.eval.max_total_tokens
    if options.max_total_tokens is not None:
        max_total_tokens = options.max_total_tokens
    if max_total_tokens < 0:
        raise EvalError(f"--max_total_tokens={max_total_tokens}: must be >= 0 (0: no cap)")
    return evaluate_api_bank(
        policy, path, RunDir(workdir).eval_dir, batch_size=options.batch_size or batch_size,
        max_new_tokens=options.max_new_tokens or API_BANK_MAX_NEW_TOKENS, max_examples=options.max_examples,
        max_think_words=options.max_think_words, max_prompt_tokens=options.max_prompt_tokens,
        progress=options.progress, template_kwargs=template_kwargs, max_total_tokens=max_total_tokens,
    )


def _evaluate_safe_alignment(options: EvalOptions, workdir: pathlib.Path) -> dict[str, Any]:
    """The helpfulness-safety sets of ``--data``, scored by the reward models of the run in ``workdir``;
    the policy is the run's, or ``--model_path`` (its own tokenizer decodes its responses)."""
    try:
        sets = resolve_sets(options.data)
    except FileNotFoundError as err:
        raise EvalError(f"--data={options.data}: {err}") from None
    config = load_run_config_or_eval_error(workdir)
    if config.rewards.kind != "reward_model":
        raise EvalError(f"--data={options.data}: helpfulness-safety sets are scored by a run's reward models, but "
                        f"the run in {workdir} has config.rewards.kind={config.rewards.kind!r} (train with "
                        "configs/safety.py, or pass its --workdir)")
    if options.model_path:
        policy = policy_from_model_path(options.model_path, options.dtype)
        config = task_of(config).prepare(config, workdir, progress=options.progress)  # e.g. the run's own reward models
        reward_fn = build_reward_function(reward_spec(config, tokenizer=policy.tokenizer, eos_ids=policy.eos_ids,
                                                      mesh=mesh_of(policy.model)))
        batch_size = MODEL_PATH_BATCH_SIZE
    else:
        config, setup = _run_setup(options, workdir)
        policy, reward_fn = policy_from_run(config, setup, workdir, options.checkpoint_step), setup.reward_fn
        batch_size = config.eval.batch_size
    return evaluate_safe_alignment(
        policy, sets, reward_fn, RunDir(workdir).eval_dir, batch_size=options.batch_size or batch_size,
        max_new_tokens=options.max_new_tokens or config.sampling.max_new_tokens, max_examples=options.max_examples,
        max_prompt_tokens=config.data.max_prompt_tokens, truncation=config.data.prompt_truncation,
        template_kwargs=config.data.template_kwargs,
        progress=options.progress, extra={"policy": policy.source},
    )


def run(options: EvalOptions) -> dict[str, Any]:
    """Evaluate as ``options`` ask; returns the summary written to ``<workdir>/eval/<name>.json``
    and prints a table when ``options.progress``. With ``options.habits``, returns (and prints) the
    habit breakdown of saved generations instead, and writes nothing.

    An evaluation holds the workdir's lock (`run_dir.lock_workdir`): it stops at once, naming the
    holder, while train.py (or another eval.py) works there. ``--habits`` only reads: no lock.

    Raises:
      EvalError: naming the flag or file to fix.
      RunDirError: the workdir is busy, or a checkpoint is damaged (naming it).
    """
    workdir = output_dir(options)
    if not is_primary():  # several processes evaluate together; process 0 reports (and writes)
        options = dataclasses.replace(options, progress=False)
    if options.habits:
        if options.model_path or options.data:
            raise EvalError("--habits reads a training run's saved generations: pass only --workdir=DIR")
        result = habits_of_workdir(workdir, options.habits)
        if options.progress:
            print(habits_table(result))
        return result
    # Evaluations write into the workdir and read its checkpoints, which a running train.py
    # prunes: one process at a time (a workdir without config.json fails below, unlocked).
    # Several processes: process 0 holds the lock for all.
    locks = (options.model_path or RunDir(workdir).config.is_file()) and is_primary()
    lock = run_dir.lock_workdir(workdir, "eval.py") if locks else None
    try:
        if lock is not None:
            run_dir.remove_stale_staging(RunDir(workdir).eval_dir, all_stale=True)
        if options.data and is_safe_alignment_data(options.data):
            result = _evaluate_safe_alignment(options, workdir)
            table = safe_alignment_table(result, f"helpfulness-safety ({_describe(result['policy'])})")
        elif options.data:
            result = _evaluate_api_bank(options, workdir)
            table = api_bank_table(result)
        else:
            result = _evaluate_split(options, workdir)
            table = split_table(result)
    finally:
        if lock is not None:
            lock.release()
    if options.progress:
        print(table)
        print(f"written to {RunDir(workdir).eval_dir}")
    return result


def api_bank_table(result: dict[str, Any]) -> str:
    """`ApiBankReport.table` with a title line naming the policy and the data."""
    report = ApiBankReport.from_dict(result)
    return f"API-Bank ({_describe(result['policy'])}, {result['data']})\n{report.table()}"
