"""gd2po_jax.runtime.host_memory: the allocator settings, and what they are for (no page faults once warm)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import jax
import pytest

from gd2po_jax.runtime import host_memory
from tests.fakes import REPO, subprocess_env


class FakeLibc:
    """``mallopt`` that records its calls and refuses the parameters in ``refuse``."""

    def __init__(self, refuse=()):
        self.calls = []
        self.refuse = set(refuse)

    def mallopt(self, param, value):
        self.calls.append((param, value))
        return 0 if param in self.refuse else 1


@pytest.fixture
def jax_updates(monkeypatch) -> list:
    """The (name, value) of every ``jax.config.update`` call (recorded, not applied)."""
    calls = []
    monkeypatch.setattr(jax.config, "update", lambda name, value: calls.append((name, value)))
    return calls


def test_sets_the_documented_parameters_and_synchronous_cpu_dispatch(monkeypatch, jax_updates):
    libc = FakeLibc()
    monkeypatch.setattr(host_memory, "_glibc", lambda: libc)
    assert host_memory.retain_freed_memory(environ={}) is True
    assert libc.calls == [(host_memory.M_MMAP_MAX, 0), (host_memory.M_TRIM_THRESHOLD, -1)]
    assert jax_updates == [("jax_cpu_enable_async_dispatch", False)]


def test_system_leaves_the_allocator_and_jax_alone(monkeypatch, jax_updates):
    libc = FakeLibc()
    monkeypatch.setattr(host_memory, "_glibc", lambda: libc)
    assert host_memory.retain_freed_memory(environ={host_memory.ENV_VAR: " System "}) is False
    assert libc.calls == [] and jax_updates == []


def test_a_mistyped_opt_out_is_an_error_naming_the_variable(monkeypatch, jax_updates):
    libc = FakeLibc()
    monkeypatch.setattr(host_memory, "_glibc", lambda: libc)
    with pytest.raises(ValueError, match="GD2PO_JAX_MALLOC='off': set it to 'system'"):
        host_memory.retain_freed_memory(environ={host_memory.ENV_VAR: "off"})
    assert libc.calls == [] and jax_updates == []


def test_a_refused_setting_or_another_c_library_is_reported(monkeypatch, jax_updates):
    libc = FakeLibc(refuse={host_memory.M_MMAP_MAX})
    monkeypatch.setattr(host_memory, "_glibc", lambda: libc)
    assert host_memory.retain_freed_memory(environ={}) is False
    assert libc.calls == [(host_memory.M_MMAP_MAX, 0), (host_memory.M_TRIM_THRESHOLD, -1)]  # the rest still set
    monkeypatch.setattr(host_memory, "_glibc", lambda: None)
    assert host_memory.retain_freed_memory(environ={}) is False


# A process that imports gd2po_jax first, then runs 12 updates of a two-layer MLP whose backward
# pass needs ~100 MB of buffers a run, and prints each update's minor page faults.
_PROBE = """
import json, resource, sys
import gd2po_jax
import jax, jax.numpy as jnp
x = jnp.full((8192, 256), 0.01, jnp.float32)
params = (jnp.full((256, 2048), 0.01, jnp.float32), jnp.full((2048, 256), 0.01, jnp.float32))
loss = lambda p, x: jnp.sum(jnp.tanh(jnp.tanh(x @ p[0]) @ p[1]) ** 2)
update = jax.jit(lambda p, x: jax.tree.map(lambda w, g: w - 1e-3 * g, p, jax.grad(loss)(p, x)), donate_argnums=0)
faults = []
for _ in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    params = jax.block_until_ready(update(params, x))
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"tuned": gd2po_jax.HOST_MALLOC_TUNED, "faults": faults}))
"""


def _probe(**env) -> dict:
    # One device: a program over several devices is dispatched asynchronously whatever the settings.
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=REPO, env=subprocess_env(XLA_FLAGS="", **env),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(host_memory._glibc() is None, reason="the settings are glibc's")
def test_warm_updates_reuse_memory_instead_of_page_faulting():
    tuned, system = _probe(GD2PO_JAX_MALLOC=""), _probe(GD2PO_JAX_MALLOC="system")
    assert tuned["tuned"] is True and system["tuned"] is False
    # With glibc's defaults every update maps its ~100 MB afresh (~35,000 faults of 4 KiB pages);
    # with the settings, once the heap has grown (an update or two), an update faults almost nothing.
    assert statistics.median(system["faults"][-6:]) > 20_000, system
    assert statistics.median(tuned["faults"][-6:]) < 1_000, tuned


def test_importing_after_jax_started_says_so():
    code = "import jax; jax.numpy.ones(1).block_until_ready(); import gd2po_jax"
    env = subprocess_env(GD2PO_JAX_MALLOC="")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "gd2po_jax was imported after JAX started its backend" in out.stderr
    quiet = subprocess.run([sys.executable, "-c", "import gd2po_jax, jax; jax.numpy.ones(1).block_until_ready()"],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0 and "imported after JAX" not in quiet.stderr, quiet.stderr[-3000:]


@pytest.mark.parametrize("before_jax", ["", "import importlib.util; importlib.util.find_spec('jax'); ",
                                        "import gd2po_jax.cli.eval; "])
def test_the_dispatch_setting_survives_a_lookup_of_jax_before_its_import(before_jax):
    # datasets and transformers look JAX up (importlib.util.find_spec) to see what is installed,
    # without importing it; eval.py's imports do so before anything imports JAX.
    code = ("import gd2po_jax; " + before_jax + "import jax; "
            "print(jax.config.values['jax_cpu_enable_async_dispatch'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=subprocess_env(GD2PO_JAX_MALLOC=""),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-1] == "False", out.stdout
