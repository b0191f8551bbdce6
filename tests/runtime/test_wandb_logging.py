"""gd2po_jax/runtime/wandb_logging.py: a training run's W&B run, with a fake ``wandb`` (tests/fake_wandb)."""

from __future__ import annotations

import builtins
import importlib.util
import json
import signal
import sys

import pytest

from gd2po_jax.config import ConfigError
from gd2po_jax.runtime import wandb_logging
from gd2po_jax.runtime.metrics_logging import MetricsWriter
from gd2po_jax.runtime.preemption import Preempted
from gd2po_jax.runtime.run_dir import RunDir
from tests.fakes import REPO, tiny_run_config


def load_fake_wandb():
    path = REPO / "tests" / "fake_wandb" / "wandb" / "__init__.py"
    spec = importlib.util.spec_from_file_location("wandb", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fake_wandb(monkeypatch):
    """A fresh fake ``wandb`` in ``sys.modules``; WANDB_MODE unset."""
    module = load_fake_wandb()
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    return module


def wandb_config(**changes):
    return tiny_run_config(logging__wandb__enabled=True, **{f"logging__wandb__{k}": v for k, v in changes.items()})


def calls_named(module, name: str) -> list[dict]:
    return [c for c in module.calls if c["call"] == name]


def test_a_run_starts_with_the_config_logs_each_record_at_its_step_and_finishes(fake_wandb, tmp_path):
    config = wandb_config(project="proj", name="ablation-1", entity="team", mode="offline")
    workdir = tmp_path / "run"
    with wandb_logging.WandbLogger(config, workdir) as wandb_log:
        wandb_log.start()
        writer = MetricsWriter(workdir, tensorboard=False)
        for step in (1, 2):
            wandb_log.log(writer.write(step, {"reward/correctness": 0.5 * step, "loss/grad_norm": float("nan")}))
        writer.close()

    [init] = calls_named(fake_wandb, "init")
    run_id = RunDir(workdir).wandb_run_id.read_text().strip()
    assert init == {"call": "init", "project": "proj", "name": "ablation-1", "entity": "team", "mode": "offline",
                    "dir": str(workdir), "config": config.to_dict(), "id": run_id, "resume": "allow",
                    "allow_val_change": True}
    assert json.loads(json.dumps(init["config"])) == json.loads(config.to_json())  # all of config.json
    logs = calls_named(fake_wandb, "log")
    assert [c["step"] for c in logs] == [1, 2]
    assert logs[1]["data"]["reward/correctness"] == 1.0 and "step" not in logs[1]["data"]
    assert fake_wandb.calls[-1] == {"call": "finish", "exit_code": 0}


def test_defaults_name_the_run_after_the_workdir_and_leave_the_entity_to_wandb(fake_wandb, tmp_path):
    with wandb_logging.WandbLogger(wandb_config(), tmp_path / "gd2po_snr_seed3") as wandb_log:
        wandb_log.start()
    [init] = calls_named(fake_wandb, "init")
    assert init["name"] == "gd2po_snr_seed3" and init["entity"] is None and init["project"] == "gd2po-jax"
    assert init["mode"] == "online"


def test_an_empty_mode_is_wandb_mode_from_the_environment(fake_wandb, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    with wandb_logging.WandbLogger(wandb_config(mode=""), tmp_path) as wandb_log:
        wandb_log.start()
    assert calls_named(fake_wandb, "init")[0]["mode"] == "offline"
    # A mode in the config wins over the environment.
    with wandb_logging.WandbLogger(wandb_config(mode="online"), tmp_path) as wandb_log:
        wandb_log.start()
    assert calls_named(fake_wandb, "init")[1]["mode"] == "online"


def test_a_resumed_run_continues_the_same_wandb_run(fake_wandb, tmp_path):
    for _ in range(2):
        with wandb_logging.WandbLogger(wandb_config(), tmp_path) as wandb_log:
            wandb_log.start()
    first, second = calls_named(fake_wandb, "init")
    assert first["id"] == second["id"] and len(first["id"]) >= 8
    assert second["resume"] == "allow"
    assert (tmp_path / "wandb_run_id.txt").read_text().strip() == first["id"]
    with wandb_logging.WandbLogger(wandb_config(), tmp_path / "other") as wandb_log:
        wandb_log.start()
    assert calls_named(fake_wandb, "init")[2]["id"] != first["id"]  # another workdir: another run


def test_a_preempted_run_is_marked_and_finished_with_the_signal_exit_code(fake_wandb, tmp_path):
    with pytest.raises(Preempted):
        with wandb_logging.WandbLogger(wandb_config(), tmp_path) as wandb_log:
            wandb_log.start()
            raise Preempted("stopped by SIGTERM", signal.SIGTERM, step=3)
    assert [c["call"] for c in fake_wandb.calls] == ["init", "mark_preempting", "finish"]
    assert fake_wandb.calls[-1]["exit_code"] == 128 + signal.SIGTERM


def test_a_failed_run_finishes_with_exit_code_1_and_its_error_passes(fake_wandb, tmp_path):
    with pytest.raises(ValueError, match="boom"):
        with wandb_logging.WandbLogger(wandb_config(), tmp_path) as wandb_log:
            wandb_log.start()
            raise ValueError("boom")
    assert fake_wandb.calls[-1] == {"call": "finish", "exit_code": 1}


def test_a_failure_of_wandb_when_finishing_is_logged_not_raised(fake_wandb, tmp_path, monkeypatch, caplog):
    def broken_finish(self, exit_code=None):
        raise RuntimeError("network down")

    monkeypatch.setattr(fake_wandb.Run, "finish", broken_finish)
    with wandb_logging.WandbLogger(wandb_config(), tmp_path) as wandb_log:
        wandb_log.start()
    assert "network down" in caplog.text


def test_off_elsewhere_than_process_0_disabled_or_not_enabled(fake_wandb, tmp_path, monkeypatch):
    for logger in (wandb_logging.WandbLogger(wandb_config(), tmp_path, primary=False),
                   wandb_logging.WandbLogger(wandb_config(mode="disabled"), tmp_path),
                   wandb_logging.WandbLogger(tiny_run_config(), tmp_path)):
        with logger:
            logger.start()
            logger.log({"step": 1, "x": 1.0})
    monkeypatch.setenv("WANDB_MODE", "disabled")
    with wandb_logging.WandbLogger(wandb_config(), tmp_path) as wandb_log:
        wandb_log.start()
    assert fake_wandb.calls == [] and not (tmp_path / "wandb_run_id.txt").exists()


def test_enabled_without_wandb_installed_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb" or name.startswith("wandb."):
            raise ModuleNotFoundError("No module named 'wandb'", name="wandb")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(ConfigError, match=r"^config\.logging\.wandb\.enabled:.*pip install wandb"):
        wandb_logging.WandbLogger(wandb_config(), tmp_path)
    wandb_logging.WandbLogger(tiny_run_config(), tmp_path)  # off: wandb is never imported


def test_secrets_in_reward_options_reach_neither_config_json_nor_wandb(tmp_path, caplog):
    """Issue 63 finding 9: a reward option ``api_key`` was written to config.json and sent to W&B."""
    import json

    from gd2po_jax.config.run import REDACTED
    from gd2po_jax.runtime import run_dir
    from gd2po_jax.runtime.wandb_logging import init_arguments
    from tests.fakes import tiny_run_config

    options = {"api_key": "sk-SECRET1", "Auth": {"HF_Token": "hf_SECRET2"}, "password": "SECRET3",
               "max_tokens": 64, "model": "judge-1"}
    entry = {"fn": "my_rewards:judge", "options": options}
    config = tiny_run_config(rewards__functions=(entry,))
    run_dir.write_config(tmp_path, config)
    text = run_dir.RunDir(tmp_path).config.read_text()
    assert "SECRET" not in text
    written = json.loads(text)["rewards"]["functions"][0]["options"]
    assert written == {"api_key": REDACTED, "Auth": {"HF_Token": REDACTED}, "password": REDACTED,
                       "max_tokens": 64, "model": "judge-1"}
    assert "rewards.functions[0].options.api_key" in caplog.text and "SECRET" not in caplog.text
    sent = init_arguments(config.replace({"logging.wandb.enabled": True}), tmp_path, "abc")["config"]
    assert "SECRET" not in json.dumps(sent) and sent["rewards"]["functions"][0]["options"]["model"] == "judge-1"
    assert config.rewards.function_entries()[0].options["api_key"] == "sk-SECRET1"  # the run itself has it
    # The run resumes from its --config (which has the secret): the redacted field is not compared.
    run_dir.RunDir(tmp_path).metrics.write_text('{"step": 1}\n')
    run_dir.check_resume_config(tmp_path, config)
    run_dir.check_resume_config(tmp_path, tiny_run_config(rewards__functions=(
        {**entry, "options": {**options, "api_key": "sk-ROTATED"}},)))
    # eval.py would hand the placeholder to the function: refused, naming the field.
    with pytest.raises(run_dir.RedactedSecretError, match=r"config\.json: .*rewards\.functions\[0\]\.options\.api_key"
                                                          r".* read it from the environment"):
        with run_dir.trusting_code_of(tmp_path, trust=True):
            pass
    with run_dir.trusting_code_of(tmp_path, trust=True, rewards=False):  # export.py needs no reward
        pass
