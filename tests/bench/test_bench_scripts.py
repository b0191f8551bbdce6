"""The bench scripts (bench/bench_train.py, bench_sampling.py, anchor_workloads.py, decode_layouts.py,
bench_lora.py, bench_sft.py, update_memory.py, group_scoring.py, rollout_engine.py, engine_refill.py,
decode_compile.py) run as
``python -m bench.<name>`` in their seconds-long settings and print their numbers (the scripts are not imported by anything else, so they would rot
unnoticed)."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

from tests.fakes import REPO, bench_env, load_bench_script, tiny_checkpoint, tiny_config
from tests.xla_env import SUBPROCESS_DEVICES as DEVICES

NUMBER = r"([\d,]+(?:\.\d+)?)"


def run_bench_process(name: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m bench.<name> <args>`` run from the repository root (the suite's subprocess devices:
    `SUBPROCESS_DEVICES`, compiled unoptimized: tests/xla_env.py), its output captured as text."""
    return subprocess.run([sys.executable, "-m", f"bench.{name}", *args], cwd=REPO, env=bench_env(),
                          capture_output=True, text=True, timeout=300)


def run_bench(name: str, *args: str) -> str:
    """stdout of `run_bench_process`, which must exit 0."""
    proc = run_bench_process(name, *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def number(text: str) -> float:
    return float(text.replace(",", ""))


def line(pattern: str, out: str) -> tuple[float, ...]:
    """The numbers of the one output line that matches ``pattern`` (its ``NUMBER`` groups; None for an
    optional group that did not match)."""
    found = list(re.finditer(rf"^{pattern}$", out, re.MULTILINE))
    assert len(found) == 1, f"no line (or several) matches {pattern!r} in:\n{out}"
    return tuple(None if g is None else number(g) for g in found[0].groups())


@pytest.mark.slow
def test_bench_train_on_the_tiny_config():
    # With micro-batches and length buckets (configs/tiny.py turns them off). Buckets of 32 give a few
    # prompt windows, each a branch of the update to compile; buckets of 8 gave eleven, 3x the compile.
    out = run_bench("bench_train", "--config=configs/tiny.py", "--warmup=1", "--steps=1",
                    "--config.rl.micro_batch_size=8", "--config.rl.length_bucket=32")
    config = tiny_config()
    seconds = rf"sampling {NUMBER} s, rewards {NUMBER} s, update {NUMBER} s"
    line(rf"warm-up 1: {seconds}", out)
    line(rf"step 2: {seconds}", out)
    assert re.search(rf"^device: cpu x{DEVICES}, mesh \{{'data': {DEVICES}, 'fsdp': 1, 'tensor': 1\}}$", out, re.MULTILINE), out
    line(rf"batch: {config.train.prompts_per_step} prompts x {config.rl.num_generations} rollouts, prompt length "
         rf"{NUMBER}, max_new_tokens {config.sampling.max_new_tokens}, micro-batches of 8 rollouts, prompt windows "
         rf"\(\d+, \d+(?:, \d+)*\)", out)  # two windows or more
    prompt_padding, padding = line(rf"update slots that are padding: prompt {NUMBER}%, prompt \+ after the response "
                                   rf"{NUMBER}%", out)
    assert 0 <= prompt_padding <= padding < 100
    total, sampling, _, rewards, _, update, _ = line(
        rf"step {NUMBER} s = sampling {NUMBER} s \({NUMBER}%\) \+ rewards {NUMBER} s \({NUMBER}%\) \+ update "
        rf"{NUMBER} s \({NUMBER}%\)", out)
    assert total > 0 and abs(total - (sampling + rewards + update)) <= 0.02  # printed to 2-3 decimals
    generated, generated_per_step = line(
        rf"generated tokens/s \(sampling\) {NUMBER} \| generated tokens/s \(whole step\) {NUMBER}", out)
    assert generated >= generated_per_step > 0
    trained, padded = line(
        rf"trained tokens/s \(update; real prompt \+ completion tokens\) {NUMBER} \| padded {NUMBER}", out)
    assert 0 < trained <= padded  # the same update time over fewer tokens
    assert line(rf"peak host RSS {NUMBER} MiB(?: \| peak device memory {NUMBER} MiB)?", out)[0] > 0


def test_bench_sampling_on_a_one_layer_model():
    out = run_bench("bench_sampling", "--hidden=32", "--layers=1", "--heads=2", "--kv_heads=1",
                    "--intermediate=64", "--vocab=128", "--head_dim=16", "--batch=2", "--prompt_len=8",
                    "--new_tokens=4", "--repeats=1")
    assert re.search(rf"^device: cpu x{DEVICES}  dtype=float32$", out, re.MULTILINE), out
    assert re.search(r"^model: qwen2 hidden=32 layers=1 heads=2/1 head_dim=16 intermediate=64 vocab=128 tied=True "
                     r"params=", out, re.MULTILINE), out  # the flags override the preset
    line(r"batch: 2 prompts x 1 samples, prompt 8 \(bucket 16\), 4 new tokens, T=1.0 top_p=1.0 top_k=0", out)
    assert line(rf"first call \(compile \+ run\): {NUMBER} s", out)[0] > 0
    for label in (r"  best", r"median"):
        numbers = line(rf"\[{label}\] prefill +{NUMBER} ms = +{NUMBER} prefill tokens/s \| decode +{NUMBER} ms = "
                       rf"+{NUMBER} tokens/s \| generate +{NUMBER} ms = +{NUMBER} generated tokens/s", out)
        assert all(n > 0 for n in numbers), numbers


def test_bench_sampling_compares_the_engine_with_the_static_path():
    out = run_bench("bench_sampling", "--hidden=32", "--layers=1", "--heads=2", "--kv_heads=1",
                    "--intermediate=64", "--vocab=128", "--head_dim=16", "--batch=2", "--prompt_len=8",
                    "--new_tokens=4", "--repeats=1", "--static_pairs=2")
    line(r"engine against static: 2 alternated pairs, generate medians engine / static / static over engine", out)
    numbers = line(rf"  generate +{NUMBER} ms / +{NUMBER} ms / +{NUMBER}", out)
    assert all(n > 0 for n in numbers), numbers
    line(r"  rows equal: 2 of 2", out)  # the same per-row keys: the same completions (fp32, 4 tokens)


def test_bench_sampling_compares_compile_options_in_one_process():
    options = '{"xla_cpu_experimental_ynn_fusion_type": "", "xla_cpu_use_xnnpack": true}'
    out = run_bench("bench_sampling", "--hidden=32", "--layers=1", "--heads=2", "--kv_heads=1",
                    "--intermediate=64", "--vocab=128", "--head_dim=16", "--batch=2", "--prompt_len=8",
                    "--new_tokens=4", "--repeats=1", "--pairs=2", f"--compile_options={options}")
    line(re.escape(f"compile options {options}: 2 alternated pairs, medians default / with them / ratio"), out)
    for label in ("prefill", "decode"):
        numbers = line(rf"  {label} +{NUMBER} ms / +{NUMBER} ms / +{NUMBER}", out)
        assert all(n > 0 for n in numbers), numbers
    line(r"  same tokens: (?:True|False)", out)


def test_bench_sampling_names_a_malformed_option_object():
    proc = run_bench_process("bench_sampling", "--compile_options=[1]")
    assert proc.returncode == 2
    assert "--compile_options" in proc.stderr and "expected a non-empty JSON object of XLA options, got '[1]'" in proc.stderr


@pytest.mark.slow
def test_anchor_workloads_on_a_checkpoint_directory(tmp_path):
    directory, _ = tiny_checkpoint("qwen2", tie=True)
    report_path = tmp_path / "report.json"
    out = run_bench("anchor_workloads", f"--hf_dir={directory}", "--batch=4", "--prompt_len=8",
                    "--new_tokens=4", "--repeats=2", "--train_repeats=2", "--peak_size=256", f"--json={report_path}",
                    f"--profile={tmp_path / 'profile'}")
    report = json.loads(report_path.read_text())
    assert report["hf_dir"] == str(directory) and report["device"] == f"cpu x{DEVICES}"
    assert report["model"]["model_type"] == "qwen2" and report["model"]["params"] > 0
    expected_tokens = {"W": 4 * 4, "T": 4 * (8 + 4)}  # generated / trained tokens per call
    assert sorted(report["workloads"]) == ["T", "W"]
    for name, result in report["workloads"].items():
        assert result["tokens"] == expected_tokens[name]
        assert len(result["times_s"]) == 2 and result["best_s"] <= result["median_s"]
        assert result["tokens_per_s"] == pytest.approx(result["tokens"] / result["median_s"])
        assert result["compiles_after_warmup"] == 0, (name, result)  # warm-up compiles everything
        assert all(peak > 0 for peak in result["matmul_peak_gflops"])
        assert len(result["page_faults"]) == 2  # one count per timed call
        assert len(result["cpu_per_wall"]) == 2 and all(ratio > 0 for ratio in result["cpu_per_wall"])
        assert re.search(rf"^{name}: [\d,]+ tokens/s \(median [\d.]+ ms of 2\), compilations after warm-up 0, "
                         rf"page faults a call [\d,]+, CPU/wall [\d.]+, matmul peak ",
                         out, re.MULTILINE), out
        # --profile: one traced call; its programs' operations, by kind (W: prefill and decode).
        assert list((tmp_path / "profile" / name).glob("**/*.trace.json.gz")), name
        programs = result["profile"]
        assert programs and all(entry["op_s"] > 0 and entry["span_s"] > 0 and entry["kinds"]
                                for entry in programs.values()), programs
        assert "while" not in {kind for entry in programs.values() for kind in entry["kinds"]}, programs
        printed = re.findall(rf"^{name} profile: (\S+) [\d,]+ ms of operations in [\d,]+ ms: \S+ \d+%", out,
                             re.MULTILINE)
        assert printed and set(printed) <= set(programs), out
        if name == "W":
            assert {"jit_admit_prompts", "jit_run_chunk"} <= set(programs), sorted(programs)  # the engine's
            # ... and by source, read from the HLO XLA dumped: the decode's products are named.
            decode_sources = programs["jit_run_chunk"]["sources"]
            assert any(re.search(r" f32\[[\d,]+\] .*dot_general$", label) for label in decode_sources), decode_sources
            assert re.search(r"^W profile:   jit_run_chunk +\d+% +[\d,.]+ ms  \S+ f32\[", out, re.MULTILINE), out
    assert list((tmp_path / "profile" / "hlo").glob("module_*jit_run_chunk*after_optimizations.txt"))


def test_anchor_workloads_times_its_calls_through_the_harness():
    import jax

    anchor_workloads = load_bench_script("anchor_workloads")
    calls = []
    double = jax.jit(lambda x: x * 2)

    def fn():
        calls.append(len(calls))
        return double(jax.numpy.arange(1000.0))

    result = anchor_workloads.timed_calls(fn, repeats=3, warmup=2)
    assert len(calls) == 5 and len(result["times_s"]) == 3 and result["compiles_after_warmup"] == 0
    assert result["best_s"] == min(result["times_s"]) and result["median_s"] == sorted(result["times_s"])[1]
    assert len(result["page_faults"]) == 3 and all(isinstance(n, int) and n >= 0 for n in result["page_faults"])
    assert len(result["cpu_per_wall"]) == 3 and all(ratio >= 0 for ratio in result["cpu_per_wall"])


def test_anchor_workloads_names_an_unknown_workload(tmp_path):
    directory, _ = tiny_checkpoint("qwen2", tie=True)
    proc = run_bench_process("anchor_workloads", f"--hf_dir={directory}", "--workloads=W,X")
    assert proc.returncode != 0 and "--workloads: unknown ['X']" in proc.stderr, proc.stderr[-2000:]


def test_decode_layouts_on_small_shapes():
    out = run_bench("decode_layouts", "--hidden=64", "--intermediate=128", "--heads=4", "--kv_heads=2",
                    "--head_dim=16", "--vocab=256", "--rows=4", "--repeats=3", "--peak_size=128", "--layers=2",
                    "--cache_len=24")
    assert re.search(rf"^device: cpu x{DEVICES}, N = 4 rows, float32$", out, re.MULTILINE), out
    shapes = {"qkv": (64, 128), "o": (64, 64), "gate_up": (64, 256), "down": (128, 64), "lm_head": (64, 256)}
    for name, (k, f) in shapes.items():
        slow, fast, ratio = line(rf"{name} +K= +{k} F= +{f}: x @ W +{NUMBER} GFLOP/s \| W\^T @ x\^T +{NUMBER} GFLOP/s "
                                 rf"\| ratio +{NUMBER}", out)
        assert slow > 0 and fast > 0 and ratio > 0
    slots_major, slots_last, ratio = line(rf"attention 2 layers, S=24: keys \[N, KV, S, hd\] +{NUMBER} ms \| "
                                          rf"keys \[N, KV, hd, S\] +{NUMBER} ms \| ratio +{NUMBER}", out)
    assert slots_major > 0 and slots_last > 0 and ratio > 0
    streamed = line(rf"step products, 2 layers \+ LM head: each layer's weights +{NUMBER} ms \( *{NUMBER} GFLOP/s, "
                    rf"layers' weights at +{NUMBER} GB/s\) \| layer 0's in every layer +{NUMBER} ms \( *{NUMBER} GFLOP/s\) "
                    rf"\| ratio +{NUMBER}", out)
    assert all(value > 0 for value in streamed)
    weights_mib = 2 * (64 * 128 + 64 * 64 + 64 * 256 + 128 * 64) * 4 / 2**20  # qkv, o, gate_up, down of 2 layers
    read = line(rf"reading the layers' {weights_mib:.1f} MiB of weights once: +{NUMBER} ms = +{NUMBER} GB/s", out)
    assert read[0] > 0 and read[1] > 0
    assert line(rf"matmul peak \(128\^3\): {NUMBER} GFLOP/s", out)[0] > 0


def missing_package_modules(script: pathlib.Path) -> list[str]:
    """The ``gd2po_jax`` modules ``script`` imports (``from gd2po_jax.x import ...``) that do not exist."""
    import ast
    import importlib.util

    names = {node.module for node in ast.walk(ast.parse(script.read_text()))
             if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gd2po_jax")}
    return sorted(name for name in names if importlib.util.find_spec(name) is None)


def test_missing_package_modules_names_what_a_script_cannot_import(tmp_path):
    script = tmp_path / "old.py"
    script.write_text("from gd2po_jax.models import Decoder\nfrom gd2po_jax.nowhere import x\n")
    assert missing_package_modules(script) == ["gd2po_jax.nowhere"]


SHARED_HARNESS = REPO.parent / "shared" / "bench" / "anchors" / "bench_project.py"
"""The head-to-head harness's project side: not part of the repository, but beside its checkout in CI
(docs/speed.md)."""


@pytest.mark.slow
def test_the_shared_harness_drives_the_project(tmp_path):
    """../shared/bench/anchors/bench_project.py (the head-to-head harness's project side, which imports
    the project's public API) runs both workloads on a tiny checkpoint: an API rename breaks this."""
    harness = SHARED_HARNESS
    if not harness.is_file():  # a plain clone: the harness lives outside the repository
        pytest.skip(f"{harness} not found: the shared bench harness is not beside this checkout")
    missing = missing_package_modules(harness)
    if missing:  # the harness is not the project's to edit: it runs again once it follows the layout
        pytest.skip(f"{harness} imports {', '.join(missing)}, which the package's layout (docs/architecture.md) "
                    "no longer has: the shared harness needs its imports updated")
    directory, _ = tiny_checkpoint("qwen2", tie=True)
    models = tmp_path / "models"
    models.mkdir()
    (models / "tiny-qwen2").symlink_to(directory)
    env = bench_env(PROJECT_DIR=str(REPO), BENCH_MODELS=str(models), BENCH_OUT=str(tmp_path / "out"))
    proc = subprocess.run([sys.executable, str(harness), "tiny"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "out" / "project_tiny.json").read_text())
    by_workload = {row["workload"]: row for row in rows}
    assert sorted(by_workload) == ["T_train_step", "W_generate", "matmul_peak"]
    assert by_workload["W_generate"]["compiles_in_2_more_generate_calls"] == 0
    assert by_workload["T_train_step"]["compiles_after_first_step"] == 0
    assert all(by_workload[w]["tok_s"] > 0 for w in ("W_generate", "T_train_step"))


@pytest.mark.slow  # 5 programs compiled with optimizations: ~45 s on 2 cores
def test_bench_lora_on_a_one_layer_model():
    """LoRA's optimizer state is Adam's two moments of the adapters alone; the update's memory and the
    three decodes are measured."""
    out = run_bench("bench_lora", "--hidden=32", "--layers=1", "--heads=2", "--kv_heads=1", "--intermediate=64",
                    "--vocab=128", "--head_dim=16", "--prompts=2", "--group=2", "--prompt_len=8", "--new_tokens=4",
                    "--micro_batch=2", "--repeats=1")
    results = json.loads(out)
    full, lora = results["full"], results["lora"]
    assert full["optimizer_bytes"] == 2 * full["trained_param_bytes"] + 4  # AdamW: mu, nu and a count
    assert lora["optimizer_bytes"] == 2 * lora["trained_param_bytes"] + 4
    assert lora["frozen_param_bytes"] == full["trained_param_bytes"] and full["frozen_param_bytes"] == 0
    assert 0 < lora["update_peak_bytes"] < full["update_peak_bytes"]
    for name in ("decode_base", "decode_lora_merged", "decode_lora_unmerged"):
        assert results[name]["tokens_per_s"] > 0, name


def test_lora_memory_counts_the_decoders_parameters_and_adapters():
    """bench/lora_memory.py's counts are those of a `Decoder` of the same shape (with and without
    adapters), and of Qwen2.5-1.5B / -7B (docs/paper.md); LoRA's peak is below full fine-tuning's."""
    import jax
    from flax import nnx

    from gd2po_jax.models import Decoder
    from gd2po_jax.models.decoder import LoRASpec
    from gd2po_jax.models.lora import split_lora
    from tests.fakes import tiny_model_config

    lora_memory = load_bench_script("lora_memory")
    config = tiny_model_config(tie_word_embeddings=False)
    shape = lora_memory.Shape(hidden=config.hidden_size, layers=config.num_layers, heads=config.num_heads,
                              kv_heads=config.num_kv_heads, head_dim=config.head_dim,
                              intermediate=config.intermediate_size, vocab=config.vocab_size, tied=False)
    size = lambda tree: sum(x.size for x in jax.tree.leaves(tree))  # noqa: E731
    model = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0), lora=LoRASpec(4, 8.0, targets=("q", "o", "up"))))
    _, adapters, base = split_lora(model)
    assert size(base) == lora_memory.num_params(shape)
    assert size(adapters) == lora_memory.adapter_params(shape, 4, ("q", "o", "up"))
    assert round(lora_memory.num_params(lora_memory.SHAPES["qwen2.5-1.5b"]) / 1e7) == 154
    assert round(lora_memory.num_params(lora_memory.SHAPES["qwen2.5-7b"]) / 1e7) == 762
    sizes = dict(rows=64, seq=3072, micro_batch=1)
    for shape in lora_memory.SHAPES.values():
        assert lora_memory.estimate(shape, 16, **sizes)["peak"] < lora_memory.estimate(shape, 0, **sizes)["peak"] / 2


def test_bench_sft_times_each_shape(tmp_path):
    out = run_bench("bench_sft", "--config=configs/tiny.py", "--shapes=24x16,32x8", "--rounds=2", "--steps=1",
                    "--vocab_size=64", f"--profile={tmp_path}")
    config = tiny_config()
    line(rf"compiled 24x16: {NUMBER} s", out)
    line(rf"SFT step, {config.sft.batch_size} examples, median of 2 rounds of 1 steps:", out)
    for prompt, completion in ((24, 16), (32, 8)):
        ms, low, high, per_token = line(rf"{prompt}x{completion} \(S=40\): {NUMBER} ms/step \({NUMBER}-{NUMBER}\), "
                                        rf"{NUMBER} us/token", out)
        assert low <= ms <= high and per_token == pytest.approx(ms * 1e3 / (config.sft.batch_size * 40), rel=0.06,
                                                                abs=0.01)
        # --profile: one more step traced per shape; the step program's operations by kind and by source,
        # read from that shape's own program (its sequence length is in the operations' shapes).
        assert list((tmp_path / f"{prompt}x{completion}").glob("**/*.trace.json.gz"))
        head = rf"^{prompt}x{completion} profile:"
        program = f"jit_sft_step_{prompt}x{completion}"
        assert re.search(rf"{head} {program} [\d,]+ ms of operations in [\d,]+ ms: \S+ \d+%", out, re.MULTILINE), out
        assert re.search(rf"{head}   {program} +\d+% +[\d,.]+ ms  \S+ f32\[", out, re.MULTILINE), out
        assert re.search(rf"{head}   \S+ .* f32\[[\d,]*\b{prompt + completion}\b", out, re.MULTILINE), out
    proc = run_bench_process("bench_sft", "--config=configs/tiny.py", "--shapes=24x", "--vocab_size=64")
    assert proc.returncode != 0 and "--shapes: '24x' is not PROMPTxCOMPLETION" in proc.stderr


def test_update_memory_prints_the_programs_bytes_and_names_a_bad_micro_batch():
    args = ("--preset=qwen2-29m", "--layers=2", "--vocab=512", "--prompts=2", "--group=2", "--prompt_len=32",
            "--new_tokens=16", "--micro_batch=2")
    proc = run_bench_process("update_memory", *args, "--remat=full,minimal")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stderr
    for policy in ("full", "minimal"):
        line(rf"qwen2-29m, 2 layers \({NUMBER} B params\), 4 rows x 48 tokens, micro-batches of 2, remat {policy}, "
             rf"bfloat16 compute, {DEVICES} device\(s\), cpu:", out)
    report = json.loads(proc.stdout)
    assert list(report["policies"]) == ["full", "minimal"] and report["seq"] == 48 and report["platform"] == "cpu"
    for found in report["policies"].values():
        assert found["compile_s"] > 0 and found["aliased"] > 0 and found["temporaries"] > 0
        assert found["total"] == found["arguments"] + found["outputs"] + found["temporaries"] - found["aliased"]
        assert found["bytes_per_param"] > 12  # at least the fp32 weights and AdamW's two moments
    # minimal keeps the projections' outputs besides the layer inputs: more than full, as its line says
    assert report["policies"]["minimal"]["temporaries"] > report["policies"]["full"]["temporaries"]
    full_lines = out.split("remat minimal")[0]  # full's two lines come first
    program = line(rf"  compiled in {NUMBER} s: arguments {NUMBER} GiB, outputs {NUMBER}, temporaries {NUMBER}, "
                   rf"aliased {NUMBER} -> program {NUMBER} GiB per device \({NUMBER} B/param\)", full_lines)[5]
    assert program == pytest.approx(report["policies"]["full"]["total"] / 2**30, abs=0.006)
    proc = run_bench_process("update_memory", *args, "--remat=some")
    assert proc.returncode != 0 and "--remat: ['some'] are not policies" in proc.stderr
    proc = run_bench_process("update_memory", *args[:-1], "--micro_batch=3")
    assert proc.returncode != 0 and "--micro_batch: 3 does not divide the 4 rows" in proc.stderr


@pytest.mark.slow
def test_group_scoring_scores_while_decoding_and_gets_the_same_rewards(tmp_path):
    """bench/group_scoring.py --cpu-smoke: both ways of scoring ran (their rewards are checked equal
    inside), and scoring a group at a time left less of the reward's time after the decode."""
    path = tmp_path / "gs.json"
    run_bench("group_scoring", "--cpu-smoke", f"--json={path}")
    report = json.loads(path.read_text())
    assert report["tokens"] > 0 and report["scoring_s"] > 0
    assert report["groups"]["reward_s"] < report["whole"]["reward_s"]
    assert report["whole"]["reward_s"] >= 0.9 * report["scoring_s"]  # whole: all of it after the decode


@pytest.mark.slow
def test_engine_refill_compares_refill_in_the_engine_with_rounds(tmp_path):
    """bench/engine_refill.py --cpu-smoke: both ways ran the same step; the engine drew one prompt per
    dropped group (never more than rounds of P), both filled the batch or reached the limit."""
    path = tmp_path / "er.json"
    run_bench("engine_refill", "--cpu-smoke", f"--json={path}")
    report = json.loads(path.read_text())
    engine, rounds = report["engine"], report["rounds"]
    assert report["rounds_over_engine"] > 0 and engine["times_s"] and rounds["times_s"]
    for way in (engine, rounds):
        assert all(c == 4 or d == 16 for c, d in zip(way["groups_counted"], way["prompts_drawn"]))
    assert all(e <= r for e, r in zip(engine["prompts_drawn"], rounds["prompts_drawn"]))
    assert engine["groups_counted"] == rounds["groups_counted"]  # the same prompts in the same order count


@pytest.mark.slow
def test_rollout_engine_compares_engine_and_static(tmp_path):
    """bench/rollout_engine.py --cpu-smoke: the JSON's names (the engine's speed-up, its work per
    token, its compiles after warm-up, both programs' compile times)."""
    path = tmp_path / "re.json"
    run_bench("rollout_engine", "--cpu-smoke", f"--json={path}")
    report = json.loads(path.read_text())
    assert report["engine_over_static"] > 0 and report["compiles_after_warmup"] == 0
    assert report["engine"]["row_steps_per_token"] < report["static"]["row_steps_per_token"]
    assert {"static_decode_s", "engine_chunk_s", "engine_chunk_loop_s", "engine_chunk_scan_s"} <= set(
        report["compile_seconds"])


@pytest.mark.slow
def test_decode_compile_times_a_tree_against_this_one(tmp_path):
    """bench/decode_compile.py --shapes smoke, this tree against itself: each program timed in its own
    process once per pair, one ratio per pair; a --before that holds no gd2po_jax is named."""
    directory, _ = tiny_checkpoint("qwen2")
    path = tmp_path / "dc.json"
    run_bench("decode_compile", f"--before={REPO}", f"--hf_dir={directory}", "--pairs=2", "--shapes=smoke",
              "--eos_ids=2", f"--json={path}")
    report = json.loads(path.read_text())
    for name in ("before_s", "chunk_s", "chunk_other_s", "before_over_chunk", "before_over_chunk_other"):
        assert len(report[name]) == 2 and all(value > 0 for value in report[name])
    assert {report["config"]["chunk_layers"], report["config"]["chunk_other_layers"]} == {"unrolled", "scan"}
    proc = run_bench_process("decode_compile", f"--before={tmp_path}", f"--hf_dir={directory}")
    assert proc.returncode == 2 and "--before must name a tree holding gd2po_jax" in proc.stderr
