"""Fix cpu-compile-cache-load, on the real vLLM of the CPU image.

vLLM saves the model it compiled under VLLM_CACHE_ROOT and, at the next start, loads it back
(decorators._try_load_aot_compiled_fn), finishing with compiled_fn.finalize_loading(). That method
belongs to the artifact of vLLM's own backend (VLLM_COMPILE). The CPU platform compiles with
torch's inductor backend under DYNAMO_TRACE_ONCE, whose artifact has no such method: every load
failed with AttributeError, was logged as a WARNING ("Compiling model again due to a load
failure"), and the model was compiled again at every start, so a warm compile-cache volume saved
only part of the start-up (BENCHMARKS.md, "What a pod needs"). The probe compiles a small module
as that platform does and hands the artifact to vLLM's own loader. How the observations are made:
tests/fixes_helpers.py.
"""

import pytest

from tests import fixes_helpers as fx

pytestmark = pytest.mark.integration

DYNAMO_TRACE_ONCE = 2  # vllm.config.CompilationMode


@pytest.fixture(scope="module")
def obs(fix_observations):
    return {phase: fx.phase(fix_observations, phase)["compile_cache"] for phase in ("unpatched", "patched")}


def no_probe_error(data):
    assert "probe_error" not in data, data.get("probe_error")
    # The path the CPU platform takes: otherwise the probe tested another backend's artifact.
    assert data["mode"] == DYNAMO_TRACE_ONCE and data["backend"] == "inductor", data
    assert not data["has_finalize_loading"]
    return data


def test_unpatched_the_cpu_platforms_compiled_model_is_never_loaded_back(obs):
    data = no_probe_error(obs["unpatched"])
    assert not data["loaded"]
    (warning,) = data["warnings"]
    assert "Compiling model again due to a load failure" in warning and "finalize_loading" in warning


def test_patched_it_is_loaded_and_computes_what_the_module_does(obs):
    data = no_probe_error(obs["patched"])
    assert data["loaded"] and data["warnings"] == []
    assert data["max_abs_diff"] == 0.0
