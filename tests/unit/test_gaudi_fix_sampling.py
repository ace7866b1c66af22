"""Fixes of the HPU sampler path (vllm_gaudi/patches.py, hpu_model_runner.py):
gather-logprobs-int32 and seeded-sampling.

Their symptoms (an int64 concat corrupting ids, a device generator segfaulting)
happen only on HPU in lazy mode. On CPU these tests show that the changed code
computes what vLLM's own code computes, and test the pure functions the fixes add.
"""
import ast
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gaudi_fixes_helpers as h  # noqa: E402
from gaudi_fixes_helpers import src  # noqa: E402,F401  (the checkout fixture)

torch = pytest.importorskip("torch")
PATCHES = "vllm_gaudi/patches.py"


# ------------------------------------------------------------------ CI: pure functions
def test_int32_logprob_token_ids():
    concat = h.added_functions("gather-logprobs-int32", PATCHES, "int32_logprob_token_ids",
                               namespace={"torch": torch})
    token_ids = torch.tensor([[262143], [5]], dtype=torch.int64)  # Gemma 4 vocab is 262144
    topk = torch.tensor([[1, 262000], [7, 8]], dtype=torch.int64)
    out = concat(token_ids, topk)
    assert out.dtype == torch.int32
    assert out.tolist() == [[262143, 1, 262000], [5, 7, 8]]


def test_seeded_exponential_noise():
    noise_fn = h.added_functions("seeded-sampling", PATCHES, "seeded_exponential_noise",
                                 namespace={"torch": torch})
    gens = {3: torch.Generator().manual_seed(7), 0: torch.Generator().manual_seed(11)}
    rows, noise = noise_fn(gens, 16, torch.float32)
    assert rows == [0, 3] and noise.shape == (2, 16) and noise.device.type == "cpu"
    assert (noise > 0).all()
    # each row is exactly what q[row].exponential_(generator) draws on a CPU tensor
    for n, seed in enumerate([11, 7]):
        ref = torch.empty(16).exponential_(generator=torch.Generator().manual_seed(seed))
        assert torch.equal(noise[n], ref)
    _, again = noise_fn({0: torch.Generator().manual_seed(11)}, 16, torch.float64)
    assert again.dtype == torch.float64


def test_seeded_sampling_generator_is_cpu_unless_spec_decode():
    added = [line for lines in h.added_lines("seeded-sampling", "vllm_gaudi/v1/worker/hpu_model_runner.py")
             for line in lines if "torch.Generator(" in line]
    assert len(added) == 1
    expr = ast.parse(added[0].split("=", 1)[1].strip()).body[0].value
    device = expr.keywords[0].value  # device=<a if spec else "cpu">
    assert isinstance(device, ast.IfExp) and device.orelse.value == "cpu"


# ------------------------------------------------------------------ checkout: patched functions vs vLLM
@pytest.fixture(scope="module")
def patched(src):
    return h.defs_from_file(src, PATCHES, ["gather-logprobs-int32", "seeded-sampling"],
                            ["int32_logprob_token_ids", "_hpu_gather_logprobs", "seeded_exponential_noise",
                             "_hpu_random_sample"], {"torch": torch})


def test_patched_gather_logprobs_matches_vllm(patched):
    from vllm.v1.sample.sampler import Sampler
    torch.manual_seed(0)
    logprobs = torch.randn(5, 50).log_softmax(-1)
    sampled = torch.tensor([3, 49, 0, 17, 17], dtype=torch.int64)
    ours = patched["_hpu_gather_logprobs"](logprobs, 4, sampled)
    ref = Sampler.gather_logprobs(logprobs, 4, sampled)
    assert ours.logprob_token_ids.dtype == torch.int32
    assert torch.equal(ours.logprob_token_ids, ref.logprob_token_ids)
    assert torch.equal(ours.logprobs, ref.logprobs)
    assert torch.equal(ours.selected_token_ranks, ref.selected_token_ranks)


@pytest.mark.parametrize("fp64", [False, True])
@pytest.mark.parametrize("seeded", [[], [1], [0, 2], [0, 1, 2, 3]])
def test_patched_random_sample_matches_vllm_on_cpu(patched, seeded, fp64):
    from vllm.v1.sample.ops.topk_topp_sampler import random_sample
    probs = torch.rand(4, 64).softmax(-1)

    def run(fn):
        torch.manual_seed(123)  # the unseeded rows' noise
        gens = {i: torch.Generator().manual_seed(1000 + i) for i in seeded}
        return fn(probs.clone(), gens, fp64)
    assert torch.equal(run(patched["_hpu_random_sample"]), run(random_sample))


def test_patched_seeded_row_independent_of_batch(patched):
    probs = torch.full((3, 256), 1 / 256)
    alone = patched["_hpu_random_sample"](probs[:1].clone(), {0: torch.Generator().manual_seed(5)})
    mixed = patched["_hpu_random_sample"](probs.clone(), {2: torch.Generator().manual_seed(5)})
    assert alone.tolist()[0] == mixed.tolist()[2]


# ------------------------------------------------------------------ structured-output-rows
def test_structured_output_row_owners():
    owners = h.added_functions("structured-output-rows", "vllm_gaudi/v1/worker/hpu_model_runner.py",
                               "structured_output_row_owners")
    # logits = cat(decode rows, prefill rows with logits); P1 is a partial chunk without logits
    decode, prompts, prefill_logits = ["D0", "D1"], ["P0", "P1", "P2"], ["P0", "P2"]
    rows = owners(decode, prefill_logits)
    assert rows == ["D0", "D1", "P0", "P2"]
    assert rows != prompts + decode  # what upstream passed: wrong order and one row too many
    assert owners([], ["P0"]) == ["P0"] and owners(("D0",), ()) == ["D0"]
