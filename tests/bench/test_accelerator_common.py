"""bench/accelerator/common.py: the accelerator check's run shapes (the device's from its
--sampling_cases and --step_layers, the CPU smoke's miniatures) and its small measuring helpers."""

import numpy as np
import pytest
from absl import app

from bench.accelerator import common


def test_the_device_profile_reads_the_sampling_cases_and_the_update_parity_layers():
    profile = common.device_profile(["qwen2.5-0.5b:64", "qwen2.5-1.5b:256"], 3)
    assert profile.name == "device" and profile.sampling == (("qwen2.5-0.5b", 64), ("qwen2.5-1.5b", 256))
    assert profile.step_model.num_layers == 3
    assert profile.step_model.hidden_size == common.MODELS["qwen2.5-0.5b"].hidden_size
    for case in ("qwen2.5-0.5b", "qwen2.5-0.5b:x", "gpt2:8"):
        with pytest.raises(app.UsageError, match="MODEL:BATCH"):
            common.device_profile([case], 4)
    smoke = common.smoke_profile()
    assert smoke.name == "cpu-smoke" and {model for model, _ in smoke.sampling} == {"mini"}


def test_peak_flops_check_records_and_relative_error():
    assert common.peak_flops("NVIDIA H100 PCIe") == 756e12 and common.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert common.peak_flops("cpu") is None
    assert common.check("a", 1, 2, True) == {"name": "a", "value": 1, "limit": 2, "passed": True}
    assert common.check("b", 3, 2, np.False_, "why")["note"] == "why"
    assert common.rel_l2([3.0, 4.0], [3.0, 4.0]) == 0 and common.rel_l2([0.0, 0.0], [3.0, 4.0]) == 1.0
