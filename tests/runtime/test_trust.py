"""gd2po_jax/runtime/trust.py: a config.json this user's run wrote is signed with this user's key, so
eval.py trusts the code it names; an edited file, another user's key, or no key are not trusted."""

import os
import stat

import pytest

from gd2po_jax.runtime import run_dir, trust
from gd2po_jax.runtime.imports import UntrustedCodeError
from tests.fakes import tiny_run_config
from tests.runtime.test_imports import crafted_workdir


def test_the_key_is_made_once_private_and_signatures_check_the_bytes(tmp_path, monkeypatch):
    monkeypatch.setenv(trust.KEY_ENV, str(tmp_path / "keys" / "trust_key"))
    config, signature = tmp_path / "config.json", tmp_path / "config.sig"
    config.write_text('{"task": "x"}')
    assert not trust.signed_here(config, signature)  # no key yet
    signature.write_text(trust.sign(config))
    key_file = trust.key_path()
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600 and len(key_file.read_bytes()) == trust.KEY_BYTES
    first_key = key_file.read_bytes()
    assert trust.signed_here(config, signature)
    config.write_text('{"task": "y"}')  # edited after signing
    assert not trust.signed_here(config, signature)
    signature.write_text(trust.sign(config))
    assert key_file.read_bytes() == first_key  # the same key again
    assert trust.signed_here(config, signature)
    monkeypatch.setenv(trust.KEY_ENV, str(tmp_path / "other_user_key"))  # another user's key
    (tmp_path / "elsewhere.sig").write_text(trust.sign(config))
    assert not trust.signed_here(config, signature)


def test_key_path_follows_the_environment(tmp_path):
    assert trust.key_path({trust.KEY_ENV: "/k"}) == trust.key_path({trust.KEY_ENV: "/k", "XDG_CACHE_HOME": "/c"})
    assert str(trust.key_path({"XDG_CACHE_HOME": "/c"})) == "/c/gd2po_jax/trust_key"


def test_a_run_of_ones_own_is_trusted_without_the_flag_and_an_edited_one_is_not(tmp_path):
    workdir, marker, path = crafted_workdir(tmp_path)  # unsigned: made elsewhere
    with pytest.raises(UntrustedCodeError):
        with run_dir.trusting_code_of(workdir):
            pass
    run_dir.write_config(workdir, tiny_run_config(rewards__functions=(path,)))  # as this user's train.py does
    assert run_dir.RunDir(workdir).config_signature.is_file()
    with run_dir.trusting_code_of(workdir):  # signed here: trusted
        pass
    config = run_dir.RunDir(workdir).config
    config.write_text(config.read_text().replace('"seed": 0', '"seed": 1', 1))  # edited since
    with pytest.raises(UntrustedCodeError, match="--trust_workdir_code"):
        with run_dir.trusting_code_of(workdir):
            pass
    assert not marker.exists()
