"""gd2po_jax/runtime/checkpoints.py: Orbax checkpoints, their checksums and the finite-parameter check."""

from __future__ import annotations

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gd2po_jax.training.records import TrainState
from gd2po_jax.runtime.checkpoints import (
    Checkpoints,
    CorruptCheckpointError,
    NonFiniteError,
    check_finite,
    state_integrity,
)


def small_state(scale: float) -> TrainState:
    params = {"embed": jnp.arange(12.0).reshape(4, 3) * scale, "bias": jnp.full((3,), scale)}
    return TrainState(params, optax.adam(1e-3).init(params), jnp.asarray(int(scale), jnp.int32),
                      jax.random.PRNGKey(int(scale)))


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_save_and_restore_round_trip_with_metadata_and_pruning(tmp_path):
    with Checkpoints(tmp_path / "checkpoints", keep=2) as checkpoints:
        assert checkpoints.steps() == [] and checkpoints.latest_step() is None
        for step in (1, 2, 3):
            metadata = {"step": step, "data": {"epoch": step, "order": [2, 0, 1]}}
            checkpoints.save(step, small_state(float(step)), metadata)
        assert checkpoints.steps() == [2, 3] and checkpoints.latest_step() == 3  # keep=2: step 1 pruned
    # A new manager (a resumed process) sees the same checkpoints.
    with Checkpoints(tmp_path / "checkpoints", keep=2) as checkpoints:
        state, meta = checkpoints.restore(None, small_state(0.0))
        assert_trees_equal(state, small_state(3.0))
        assert meta == {"step": 3, "data": {"epoch": 3, "order": [2, 0, 1]}}
        state, meta = checkpoints.restore(2, small_state(0.0))
        assert_trees_equal(state, small_state(2.0)) and meta["step"] == 2
        with pytest.raises(FileNotFoundError, match=r"no checkpoint for step 1 .*available: \[2, 3\]"):
            checkpoints.restore(1, small_state(0.0))
        # The metadata alone (a LoRA checkpoint's reference to its base), without reading an array.
        assert checkpoints.metadata(None) == {"step": 3, "data": {"epoch": 3, "order": [2, 0, 1]}}
        assert checkpoints.metadata(2)["step"] == 2


def test_params_only_restore_onto_a_sharded_target(tmp_path):
    with Checkpoints(tmp_path / "checkpoints") as checkpoints:
        checkpoints.save(5, small_state(5.0), {"step": 5})
    devices = jax.devices()[:4] if len(jax.devices()) >= 4 else jax.devices()[:1]
    mesh = Mesh(np.array(devices), ("fsdp",))
    target = {"embed": jax.ShapeDtypeStruct((4, 3), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec("fsdp"))),
              "bias": jax.ShapeDtypeStruct((3,), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))}
    reader = Checkpoints(tmp_path / "checkpoints", create=False)
    params = reader.restore_params(None, target)
    reader.close()
    assert sorted(params) == ["bias", "embed"]  # no optimizer state, step or key
    assert_trees_equal(params, small_state(5.0).params)
    assert params["embed"].sharding == target["embed"].sharding  # rows split over the mesh
    assert params["embed"].addressable_shards[0].data.shape == (4 // len(devices), 3)


def test_a_read_only_manager_of_a_missing_directory_has_no_steps_and_creates_nothing(tmp_path):
    checkpoints = Checkpoints(tmp_path / "checkpoints", create=False)
    assert checkpoints.steps() == [] and checkpoints.latest_step() is None
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        checkpoints.restore_params(None, {})
    checkpoints.close()
    assert not (tmp_path / "checkpoints").exists()


def damage(checkpoint_dir, how: str) -> None:
    """Damage a checkpoint of `small_state`: truncate its largest array data file, or replace its
    arrays by others of the same shapes (what a flipped bit does to a value: the data reads, but
    is not what was saved; Orbax compresses small arrays, so flipping a bit on disk is not reliable)."""
    if how == "truncate":  # every data file of the arrays (OCDBT keeps small arrays in its b-tree nodes)
        for file in (checkpoint_dir / "state").glob("**/d/*"):
            file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
        return
    other = checkpoint_dir.parent.parent / "other"
    with Checkpoints(other) as checkpoints:
        checkpoints.save(1, small_state(7.25), {"step": 1})
    shutil.rmtree(checkpoint_dir / "state")
    shutil.copytree(other / "1" / "state", checkpoint_dir / "state")


@pytest.mark.parametrize("how", ["truncate", "other data"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, how, caplog):
    with Checkpoints(tmp_path / "checkpoints", keep=3) as checkpoints:
        for step in (1, 2):
            checkpoints.save(step, small_state(float(step) + 0.5), {"step": step})
    damage(tmp_path / "checkpoints" / "2", how)
    with Checkpoints(tmp_path / "checkpoints", keep=3) as checkpoints:
        with pytest.raises(CorruptCheckpointError, match=f"checkpoint {tmp_path / 'checkpoints' / '2'} "):
            checkpoints.restore(2, small_state(0.0))
        step, state, meta = checkpoints.restore_intact(small_state(0.0))
        assert step == 1 and meta == {"step": 1}
        assert_trees_equal(state, small_state(1.5))
        assert checkpoints.steps() == [1]  # the damaged one is set aside, so step 2 can be saved again
        checkpoints.save(2, small_state(2.5), {"step": 2})
    assert f"checkpoint {tmp_path / 'checkpoints' / '2'}" in caplog.text
    [aside] = (tmp_path / "corrupt_checkpoints").iterdir()
    assert aside.name.startswith("2-")


def test_without_an_intact_checkpoint_each_damaged_one_is_named(tmp_path):
    with Checkpoints(tmp_path / "checkpoints") as checkpoints:
        for step in (1, 2):
            checkpoints.save(step, small_state(float(step)), {"step": step})
    for step in (1, 2):
        damage(tmp_path / "checkpoints" / str(step), "truncate")
    with Checkpoints(tmp_path / "checkpoints") as checkpoints:
        with pytest.raises(CorruptCheckpointError, match=r"no intact checkpoint .*checkpoints/2 .*checkpoints/1 "):
            checkpoints.restore_intact(small_state(0.0))
        assert checkpoints.steps() == [1, 2]  # nothing moved
        assert Checkpoints(tmp_path / "none").restore_intact(small_state(0.0)) is None


def test_a_damaged_checkpoint_is_named_when_only_its_params_are_read(tmp_path):
    with Checkpoints(tmp_path / "checkpoints") as checkpoints:
        checkpoints.save(1, small_state(1.0), {"step": 1})
    damage(tmp_path / "checkpoints" / "1", "other data")
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), small_state(0.0).params)
    with Checkpoints(tmp_path / "checkpoints", create=False) as reader:
        with pytest.raises(CorruptCheckpointError, match=r"is damaged: 2 arrays differ from what was "
                                                                  r"saved \(params/bias, params/embed\)"):
            reader.restore_params(1, target)


def test_non_finite_states_are_never_checkpointed(tmp_path):
    state = small_state(1.0)
    state = state.replace(params={**state.params, "bias": state.params["bias"].at[1].set(jnp.inf)})
    with Checkpoints(tmp_path / "checkpoints") as checkpoints:
        with pytest.raises(NonFiniteError, match=r"step 3 .* in 1 arrays: params/bias; not saving"):
            checkpoints.save(3, state, {"step": 3})
        assert checkpoints.steps() == []
    with pytest.raises(NonFiniteError, match="the policy has non-finite values .* params/bias"):
        check_finite({"params": state.params}, "the policy")


def test_checksums_do_not_depend_on_the_sharding():
    devices = jax.devices()[:4] if len(jax.devices()) >= 4 else jax.devices()[:1]
    mesh = Mesh(np.array(devices), ("fsdp",))
    x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 3)), jnp.float32)
    sharded = jax.device_put(x, NamedSharding(mesh, PartitionSpec("fsdp")))
    assert state_integrity({"x": sharded}) == state_integrity({"x": x})
    flipped = x.at[5, 2].set(jax.lax.bitcast_convert_type(
        jax.lax.bitcast_convert_type(x[5, 2], jnp.uint32) ^ jnp.uint32(1 << 31), jnp.float32))
    assert state_integrity({"x": flipped})[0] != state_integrity({"x": x})[0]


# ----------------------------------------------------------------------------------------------
# Issue 63, finding 6: a real hash of each array, the metadata (the data position) covered and checked.
# ----------------------------------------------------------------------------------------------


def test_the_array_hash_sees_what_the_old_sum_missed():
    """The old checksum, a sum of bit patterns mod 2**32, gave the same value for a reversed array and for
    two elements moved one ulp in opposite directions."""
    from gd2po_jax.runtime.checkpoints import legacy_sums

    x = jnp.asarray(np.random.default_rng(0).normal(size=(16,)), jnp.float32)
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    ulp_pair = jax.lax.bitcast_convert_type(bits.at[3].add(1).at[7].add(-1), jnp.float32)
    for other in (x[::-1], ulp_pair):
        assert legacy_sums({"x": other}) == legacy_sums({"x": x})  # what the old sum saw
        assert state_integrity({"x": other})[0] != state_integrity({"x": x})[0]
    # dtype and shape are part of it, and so is the high word of 8-byte values.
    assert state_integrity({"x": x.reshape(4, 4)})[0] != state_integrity({"x": x})[0]
    assert state_integrity({"x": jnp.zeros(4, jnp.int32)})[0] != state_integrity({"x": jnp.zeros(4, jnp.uint32)})[0]
    [value] = state_integrity({"x": x})[0].values()
    assert value.startswith("b2:") and len(value) == 3 + 32


def edit_meta(checkpoint_dir, change, *, rehash: bool = False) -> None:
    """Edit checkpoint ``checkpoint_dir``'s metadata file on disk with ``change(meta)``; with ``rehash``,
    write a matching metadata checksum (a consistent edit, caught only by validation)."""
    import json

    from gd2po_jax.runtime.checkpoints import META_CHECKSUM_KEY, meta_checksum

    file = checkpoint_dir / "meta" / "metadata"
    meta = json.loads(file.read_text())
    change(meta)
    if rehash:
        meta[META_CHECKSUM_KEY] = meta_checksum(meta)
    file.write_text(json.dumps(meta))


def check_position(meta):
    """What the trainer checks of a checkpoint's metadata: a data position of a 32-prompt set."""
    from gd2po_jax.data.prompts import EpochSampler

    return EpochSampler(32, seed=0).check_state(meta["data"])


@pytest.mark.parametrize("edit", ["offset 999", "offset 999, rehashed", "offset a string, rehashed",
                                  "no data, rehashed", "step", "no checksum"])
def test_an_edited_data_position_falls_back_to_the_previous_checkpoint(tmp_path, edit, caplog):
    with Checkpoints(tmp_path / "checkpoints", keep=3) as checkpoints:
        for step in (1, 2):
            checkpoints.save(step, small_state(float(step)), {"step": step, "data": {"epoch": 0, "offset": 4 * step}})
    edits = {
        "offset 999": lambda m: m["data"].update(offset=999),
        "offset 999, rehashed": lambda m: m["data"].update(offset=999),
        "offset a string, rehashed": lambda m: m["data"].update(offset="8"),
        "no data, rehashed": lambda m: m.pop("data"),
        "step": lambda m: m.update(step=7),
        "no checksum": lambda m: m.pop("meta_checksum"),
    }
    edit_meta(tmp_path / "checkpoints" / "2", edits[edit], rehash="rehashed" in edit)
    with Checkpoints(tmp_path / "checkpoints", keep=3) as checkpoints:
        step, state, meta = checkpoints.restore_intact(small_state(0.0), check_meta=check_position)
        assert step == 1 and meta == {"step": 1, "data": {"epoch": 0, "offset": 4}}
        assert_trees_equal(state, small_state(1.0))
    assert f"checkpoint {tmp_path / 'checkpoints' / '2'}" in caplog.text and "falling back" in caplog.text


def test_a_checkpoint_of_the_old_format_still_restores_and_is_checked(tmp_path):
    """Checkpoints written before the hashes: integer sums per array, no metadata checksum."""
    import orbax.checkpoint as ocp

    from gd2po_jax.runtime.checkpoints import legacy_sums

    def save_old(checkpoints, step, state):
        meta = {"step": step, "data": {"epoch": 0, "offset": step}, "checksums": legacy_sums(state)}
        checkpoints._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                                meta=ocp.args.JsonSave(meta)), force=True)
        checkpoints._manager.wait_until_finished()

    with Checkpoints(tmp_path / "checkpoints", keep=3) as checkpoints:
        save_old(checkpoints, 1, small_state(1.0))
        save_old(checkpoints, 2, small_state(2.0))
    with Checkpoints(tmp_path / "checkpoints", keep=3) as checkpoints:
        state, meta = checkpoints.restore(2, small_state(0.0), check_meta=check_position)
        assert_trees_equal(state, small_state(2.0)) and meta == {"step": 2, "data": {"epoch": 0, "offset": 2}}
    damage(tmp_path / "checkpoints" / "2", "other data")  # the old sums still find a damaged one
    with Checkpoints(tmp_path / "checkpoints", keep=3) as checkpoints:
        with pytest.raises(CorruptCheckpointError, match="arrays differ from what was saved"):
            checkpoints.restore(2, small_state(0.0))
        assert checkpoints.restore_intact(small_state(0.0), check_meta=check_position)[0] == 1


def test_a_full_disk_is_our_one_line_with_the_real_free_space(tmp_path, caplog):
    """Issue 63 finding 7: on a full disk Orbax's threads logged hundreds of lines of tracebacks before our
    line, which said "0.0 GiB free of 0.0 GiB" of a 30 MB filesystem. A real one: a 30 MiB tmpfs (the
    test needs the right to mount one, as root in a container; skipped elsewhere)."""
    import logging
    import subprocess

    from gd2po_jax.runtime.run_dir import WriteFailedError, free_space, size_text

    assert (size_text(3.1 * 2**20), size_text(30 * 2**20), size_text(2**31), size_text(12)) == (
        "3.1 MiB", "30.0 MiB", "2.0 GiB", "12 bytes")
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=30m", "tmpfs", str(small)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()})")
    try:
        assert free_space(small).endswith(f"free of 30.0 MiB on {small}")
        (small / "fill").write_bytes(b"\0" * 27_000_000)
        state = {"x": jax.random.normal(jax.random.PRNGKey(0), (2000, 1000))}  # 8 MB, incompressible
        caplog.set_level(logging.INFO)
        with Checkpoints(small / "checkpoints") as checkpoints:
            with pytest.raises(WriteFailedError) as failed:
                checkpoints.save(1, state, {"step": 1})
        message = str(failed.value)
        assert message.startswith(f"{small / 'checkpoints' / '1'}: cannot write it (No space left on device; ")
        assert " MiB free of 30.0 MiB on " in message and "\n" not in message
        assert not [r for r in caplog.records if r.name in ("absl", "orbax") and r.levelno >= logging.ERROR]
        assert failed.value.__cause__ is None
    finally:
        subprocess.run(["umount", str(small)], check=False)
