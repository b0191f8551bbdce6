"""The command line (`gd2po_jax.cli`): ``--config.*`` overrides of tuple fields, parsed as absl parses
train.py's argv."""

import subprocess
import sys

import pytest
from absl import flags

from gd2po_jax import cli
from gd2po_jax.config import RunConfig
from tests.fakes import REPO, subprocess_env
from tests.xla_env import xla_flags


def parse(*overrides: str, config_file: str = "configs/tiny.py"):
    """The ConfigDict that ``train.py --config=config_file *overrides`` gets."""
    argv = ["train.py", f"--config={config_file}", *overrides]
    values = flags.FlagValues()
    cli.define_config_flag(flag_values=values, sys_argv=argv)
    values(argv)
    return values.config


@pytest.mark.parametrize("text, expected", [
    ("correctness,length", ("correctness", "length")),  # ml_collections alone: ('correctness,length',)
    ("correctness, length", ("correctness", "length")),
    ("(correctness,length)", ("correctness", "length")),
    ("[correctness, length]", ("correctness", "length")),
    ("correctness,", ("correctness",)),
    ("correctness", ("correctness",)),
    ("1,0.5", (1, 0.5)),
    ("correctness,2", ("correctness", 2)),
    ("/data/a.parquet,/data/b.parquet", ("/data/a.parquet", "/data/b.parquet")),
    ("", ()),
    ("  ", ()),
    # Python literals, which ml_collections already read, keep their meaning.
    ("('correctness', 'length')", ("correctness", "length")),
    ("['correctness','length']", ("correctness", "length")),
    ("'correctness','length'", ("correctness", "length")),
    ("('a,b', 'c')", ("a,b", "c")),  # how to pass an element with a comma
    ("(1.0, 0.5)", (1.0, 0.5)),
    ("()", ()),
    ("[]", ()),
    ("'correctness'", ("correctness",)),
    ("1.5", (1.5,)),
])
def test_parse_sequence(text, expected):
    got = cli.parse_sequence(text)
    assert got == expected and [type(x) for x in got] == [type(x) for x in expected]


@pytest.mark.parametrize("text", ["a,,b", ",a", ",", "(a,,)"])
def test_an_empty_element_is_an_error(text):
    with pytest.raises(ValueError, match="empty element"):
        cli.parse_sequence(text)


def test_a_comma_separated_override_is_a_tuple():
    config = parse("--config.rewards.names=correctness,length", "--config.rewards.weights=1,0.5")
    assert config.rewards.names == ("correctness", "length") and config.rewards.weights == (1, 0.5)
    typed = RunConfig.from_config_dict(config)
    assert typed.rewards.names == ("correctness", "length") and typed.rewards.weights == (1, 0.5)


@pytest.mark.parametrize("overrides", [
    ["--config.rewards.names=correctness,length"],
    ["--config.rewards.names", "correctness,length"],  # the value as the next argument
    ["--config.rewards.names=('correctness','length')"],  # a Python literal, as before
    ["--config.rewards.names=['correctness', 'length']"],
    ["--config.rewards.names=correctness", "--config.rewards.names=length"],  # repeated, as before
])
def test_every_form_gives_the_same_names(overrides):
    assert parse(*overrides).rewards.names == ("correctness", "length")


def test_repeated_overrides_append_and_an_empty_one_clears():
    assert parse("--config.rewards.names=correctness,format", "--config.rewards.names=length").rewards.names == (
        "correctness", "format", "length")
    assert parse("--config.rewards.weights=1,2,3", "--config.rewards.weights=").rewards.weights == (1, 2, 3)
    assert parse("--config.rewards.weights=").rewards.weights == ()
    assert parse().rewards.names == ("correctness", "format", "length")  # no override: the file's


def test_other_fields_parse_as_before():
    config = parse("--config.data.train=/data/a,b.parquet", "--config.rl.snr_tau=0.5", "--config.train.num_steps=3",
                   "--config.model.remat=minimal", "--noconfig.sft.enabled")
    assert config.data.train == "/data/a,b.parquet"  # a string field keeps its comma
    assert (config.rl.snr_tau, config.train.num_steps, config.model.remat, config.sft.enabled) == (0.5, 3, "minimal", False)
    toolrl = parse("--config.rl.algorithm=gdpo", config_file="configs/toolrl.py:qwen2.5-3b,correctness_length")
    assert toolrl.rewards.names == ("correctness", "length") and toolrl.rl.algorithm == "gdpo"


def test_a_malformed_list_names_the_flag():
    with pytest.raises(flags.IllegalFlagValueError, match=r"config\.rewards\.names.*empty element"):
        parse("--config.rewards.names=correctness,,length")


def test_train_py_reads_a_list_override(tmp_path):
    """The override reaches the typed config through train.py: two names and one weight is an
    error naming rewards.weights, before any compute."""
    env = subprocess_env(XLA_FLAGS=xla_flags(1))
    proc = subprocess.run(
        [sys.executable, "train.py", "--config=configs/tiny.py", f"--workdir={tmp_path / 'run'}",
         "--config.rewards.names=correctness,length", "--config.rewards.weights=2"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode != 0
    assert "config.rewards.weights: has 1 entries for 2 rewards ('correctness', 'length')" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())  # nothing written


def test_a_run_config_json_takes_list_overrides_like_a_config_file(tmp_path):
    """configs/resolved.py reads a run's config.json, whose lists are tuple fields again."""
    from configs import tiny

    original = RunConfig.from_config_dict(tiny.get_config())
    (tmp_path / "config.json").write_text(original.to_json())
    resolved = f"configs/resolved.py:{tmp_path / 'config.json'}"
    assert RunConfig.from_config_dict(parse(config_file=resolved)) == original
    config = parse("--config.rewards.names=correctness,length", config_file=resolved)
    assert RunConfig.from_config_dict(config) == original.replace({"rewards.names": ("correctness", "length")})


@pytest.mark.parametrize("config_file, workdir", [
    ("configs/default.py", "runs/default"),
    ("configs/safety_embedded.py", "runs/safety_embedded"),
])
def test_the_default_workdir_is_named_after_the_config_file(config_file, workdir):
    """``python train.py --config=configs/safety_embedded.py`` does not meet a default run in runs/default."""
    argv = ["train.py", f"--config={config_file}"]
    values = flags.FlagValues()
    cli.define_config_flag(flag_values=values, sys_argv=argv)
    values(argv)
    assert cli.default_workdir(values["config"]) == workdir


RUNTIME_IMPORTS = """
import importlib, importlib.util, pkgutil
import gd2po_jax, train
assert importlib.util.find_spec("torch") is None
for module in pkgutil.walk_packages(gd2po_jax.__path__, "gd2po_jax."):
    importlib.import_module(module.name)
try:
    import torch
except ModuleNotFoundError:
    pass
else:
    raise AssertionError("torch was imported")
"""


def test_the_runtime_imports_without_torch():
    """torch is a test-only dependency: the suite's subprocesses run without it (as an install from
    requirements.txt would), and train.py and every module of the package import there (eval.py,
    sweep.py and report.py define the same absl flags, so they run in their own tests' subprocesses)."""
    proc = subprocess.run([sys.executable, "-c", RUNTIME_IMPORTS], cwd=REPO, env=subprocess_env(XLA_FLAGS=xla_flags(1)),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "PyTorch was not found" not in proc.stderr  # transformers' notice, silenced by gd2po_jax


def _train_py(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "train.py"), f"--workdir={tmp_path / 'run'}", *args],
                          cwd=tmp_path, env=subprocess_env(XLA_FLAGS=xla_flags(1)), capture_output=True, text=True,
                          timeout=300)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    """The last line of stderr, checked to be the only trace of the failure (no traceback)."""
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr.strip().splitlines()[-1]


def test_a_misspelt_config_field_is_one_line_with_the_suggestion(tmp_path):
    line = _one_line(_train_py(tmp_path, f"--config={REPO / 'configs/tiny.py'}", "--config.rl.algoritm=gdpo"))
    assert line == ("train.py: --config.rl.algoritm=gdpo: config.rl has no field 'algoritm'; did you mean "
                    "'algorithm'? (the fields are those of the --config file)")


@pytest.mark.parametrize("args, expected", [
    (["--config.rewards.kind=my_reward"], r"^train\.py: config\.rewards\.kind: 'my_reward' is not a registered reward "
                                          r"family; registered: .*config\.rewards\.functions"),
    (["--config.rewards.functions=my_rewards:brevity"], r"^train\.py: config\.rewards\.functions\[0\] "
                                                        r"\('my_rewards:brevity'\): cannot import module 'my_rewards'"),
    (["--config=configs/nowhere.py"], r"^train\.py: --config=configs/nowhere\.py: cannot load the config file"),
])
def test_reward_and_config_file_mistakes_are_one_line(tmp_path, args, expected):
    import re

    args = [f"--config={REPO / 'configs/tiny.py'}", *args] if not args[0].startswith("--config=") else args
    assert re.search(expected, _one_line(_train_py(tmp_path, *args)))


def test_a_malformed_jsonl_row_is_one_line_naming_the_file_and_row(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "hi"}\n{"prompt": 3}\n')
    line = _one_line(_train_py(tmp_path, f"--config={REPO / 'configs/files.py'}", f"--config.model.path={tmp_path}",
                               f"--config.data.train={data}", f"--config.rewards.functions={REPO}/examples/own_task/"
                               "rewards.py:brevity"))
    expected = f"train.py: {data}, row 1 (0-based), line 2, field 'prompt': expected a non-empty list"
    assert line.startswith(expected), line


def test_a_config_file_finds_the_default_next_to_it_without_the_repository_on_sys_path(tmp_path):
    """configs/*.py import configs.default, or load it by path (cli.sibling_config) when the repository's
    root is not importable: gd2po-train --config=/path/to/configs/files.py from another directory."""
    assert cli.sibling_config(str(REPO / "configs" / "files.py"), "default").get_config() == \
        __import__("configs.default").default.get_config()
    package_only = tmp_path / "site"  # gd2po_jax importable, the repository's configs/ not (as an install)
    package_only.mkdir()
    (package_only / "gd2po_jax").symlink_to(REPO / "gd2po_jax")
    code = ("import sys; sys.path = [%r] + [p for p in sys.path if p not in ('', '.', %r)]\n"
            "import importlib.util\n"
            "spec = importlib.util.spec_from_file_location('files_config', %r)  # as ml_collections loads it\n"
            "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
            "config = module.get_config()\n"
            "print(config.task, config.rewards.kind == '')\n") % (str(package_only), str(REPO),
                                                                  str(REPO / "configs" / "files.py"))
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=subprocess_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["files", "True"], proc.stderr
