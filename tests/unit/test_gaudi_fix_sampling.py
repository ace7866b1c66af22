"""Fixes of the HPU sampler path (vllm_gaudi/patches.py, hpu_model_runner.py):
gather-logprobs-int32 and seeded-sampling.

gather-logprobs-int32: in lazy mode an int64 torch.cat of the logprob token ids corrupts them
(HPU only). On CPU the ids come out the same either way, so the tests record the ATen ops the
gather functions dispatch (what the device would be given) and require every integer
concatenation to be int32, besides equal results to vLLM's own Sampler.gather_logprobs.

seeded-sampling: a seeded request draws no noise with a torch.Generator (a device generator
can segfault the worker in lazy mode; drawing on the host cost 8.7 ms per seeded row per step
at Gemma 4's vocabulary). It carries SeededDraws(seed); its row is sampled on the device by
inverse CDF from one uniform that is a pure function of (seed, how many times it sampled).

Everything runs vllm-gaudi's own code from the checkout (VLLM_GAUDI_SRC + vllm 0.30.0):
patches.py executed as a module with the pack's fixes, its real apply() plugin hook, and the
runner's real step (tests/gaudi_runner.py).
"""

import pytest

from tests import gaudi_fixes_helpers as h
from tests import gaudi_runner as gr
from tests.gaudi_fixes_helpers import src  # noqa: F401  (the checkout fixture)

PATCHES = "vllm_gaudi/patches.py"
RUNNER = "vllm_gaudi/v1/worker/hpu_model_runner.py"
VOCAB = 32


@pytest.fixture(scope="module")
def patches(src):
    """patches.py with every fix of the pack, as a module."""
    return gr.load_patches_module(src, h.gaudi_fixes())


# ------------------------------------------------------------------ gather-logprobs-int32
class _CatRecorder:
    """Records the dtypes going into every aten.cat dispatched while active."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        calls = self.calls = []

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                import torch

                if func.overloadpacket == torch.ops.aten.cat:
                    calls.append([t.dtype for t in args[0]])
                return func(*args, **(kwargs or {}))

        self.mode = Mode()

    def integer_cats(self):
        import torch

        return [dtypes for dtypes in self.calls if not dtypes[0].is_floating_point and dtypes[0] != torch.bool]


def _logprobs_case():
    import torch

    torch.manual_seed(0)
    logprobs = torch.randn(5, 50).log_softmax(-1)
    return logprobs, torch.tensor([3, 49, 0, 17, 17], dtype=torch.int64)


def _gathered_by(fn, *args):
    recorder = _CatRecorder()
    with recorder.mode:
        out = fn(*args)
    return out, recorder.integer_cats()


def _assert_same_as_vllm(out, logprobs, sampled, num):
    import torch
    from vllm.v1.sample.sampler import Sampler

    ref = Sampler.gather_logprobs(logprobs, num, sampled)
    assert out.logprob_token_ids.dtype == torch.int32
    assert torch.equal(out.logprob_token_ids, ref.logprob_token_ids)
    assert torch.equal(out.logprobs, ref.logprobs)
    assert torch.equal(out.selected_token_ranks.to(ref.selected_token_ranks.dtype), ref.selected_token_ranks)


def _sampler_gather(src, fixes):
    module = gr.load_patches_module(src, fixes)
    logprobs, sampled = _logprobs_case()
    out, cats = _gathered_by(module._hpu_gather_logprobs, logprobs, 4, sampled)
    _assert_same_as_vllm(out, logprobs, sampled, 4)
    return cats


def _prompt_gather(src, fixes):
    import torch
    from vllm.v1.outputs import LogprobsTensors

    method = h.defs_from_file(
        src,
        RUNNER,
        fixes,
        ["_gather_prompt_logprobs_hpu"],
        {"torch": torch, "LogprobsTensors": LogprobsTensors},
        cls="HPUModelRunner",
    )
    logprobs, targets = _logprobs_case()
    out, cats = _gathered_by(method["_gather_prompt_logprobs_hpu"], None, logprobs, 4, targets)
    _assert_same_as_vllm(out, logprobs, targets, 4)
    return cats


@pytest.mark.parametrize("gather", [_sampler_gather, _prompt_gather], ids=["sampled", "prompt"])
def test_upstream_concatenates_the_ids_in_int64(src, gather):
    assert gather(src, []) == [[h_torch().int64, h_torch().int64]]


@pytest.mark.parametrize("gather", [_sampler_gather, _prompt_gather], ids=["sampled", "prompt"])
def test_fixed_concatenates_the_ids_in_int32(src, gather):
    assert gather(src, h.gaudi_fixes()) == [[h_torch().int32, h_torch().int32]]


def h_torch():
    import torch

    return torch


def test_fixed_logprobs_through_the_runner(src):
    """top_logprobs of a sampled token come back with the right ids (vocab ids beyond 2**16 too)."""
    from vllm.sampling_params import SamplingParams

    eng = gr.Engine(
        src,
        h.gaudi_fixes(),
        gr.logits_table({"A": {70000: 9.0, 70001: 8.0, 5: 7.0}}, vocab_size=70010),
        vocab_size=70010,
    )
    assert eng.step(new={"A": ([1, 2], SamplingParams(temperature=0.0, logprobs=2), 2)}) == {"A": [70000]}
    out = eng.last_output
    assert out.logprobs.logprob_token_ids[out.req_id_to_index["A"]].tolist() == [70000, 70000, 70001]


# ------------------------------------------------------------------ seeded-sampling: the pieces
def test_seeded_uniform_is_splitmix64(patches):
    # SplitMix64 seeded with 0 first outputs 0xE220A8397B1DCDAF (Steele, Lea, Flood 2014; Vigna's
    # splitmix64.c; Java's SplittableRandom): the top 24 bits, plus one, over 2**24
    assert patches.seeded_uniform(0, 0) == ((0xE220A8397B1DCDAF >> 40) + 1) / 2**24
    draws = [patches.seeded_uniform(seed, k) for seed in (0, 1, -1, 2**63) for k in range(200)]
    assert all(0 < u <= 1 and (u * 2**24).is_integer() for u in draws)
    assert len(set(draws)) == len(draws)  # no repeats across seeds and draws
    assert abs(sum(draws) / len(draws) - 0.5) < 0.03


def _probs(rows, vocab, seed, top_k=None):
    import torch

    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * 3
    if top_k:
        cut = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < cut, float("-inf"))
    return logits.softmax(-1)


@pytest.mark.parametrize("vocab", [32, 1000, 262144])
def test_inverse_cdf_sample_takes_the_interval_holding_the_uniform(patches, vocab):
    """Against torch.searchsorted over the same integer weights (probabilities in 2**-30 units):
    the first token whose cumulative weight reaches the target, u x total rounded up, for
    uniforms across (0, 1] and both ends. The target is taken in float32, so it is u x total to
    within 2**-23 of the total (vLLM's float32 exponential noise has the same resolution)."""
    import torch

    probs = _probs(6, vocab, seed=vocab)
    weights = probs.mul(float(1 << 30)).to(torch.int32).to(torch.int64)
    cdf, total = weights.cumsum(-1), weights.sum(-1, keepdim=True)
    for uniforms in ([2**-24] * 6, [1.0] * 6, [0.5, 0.25, 0.999, 0.001, 0.7, 0.3]):
        u = torch.tensor(uniforms)
        target = torch.minimum((u.unsqueeze(-1) * total.float()).ceil().long(), total)
        assert ((target - u.double().unsqueeze(-1) * total).abs() <= total * 2**-23 + 1).all()
        expected = torch.searchsorted(cdf, target).squeeze(-1)
        assert torch.equal(patches.inverse_cdf_sample(probs.clone(), u), expected)


def test_inverse_cdf_sample_never_takes_a_token_of_probability_zero(patches):
    import torch

    probs = _probs(4, 4096, seed=1, top_k=5)
    allowed = [set(torch.nonzero(row).flatten().tolist()) for row in probs]
    for k in range(2000):
        u = torch.tensor([(k + 1) / 2000, (k * 7919 % 2000 + 1) / 2000, 2**-24, 1.0])
        for row, token in enumerate(patches.inverse_cdf_sample(probs, u).tolist()):
            assert token in allowed[row]


def test_inverse_cdf_sample_follows_the_probabilities(patches):
    """Evenly spaced uniforms give each token a share equal to its probability (to 1/N)."""
    import torch

    probs = torch.tensor([[0.5, 0.0, 0.25, 0.125, 0.0625, 0.0625]])
    n = 4096
    tokens = [patches.inverse_cdf_sample(probs, torch.tensor([(k + 1) / n]))[0].item() for k in range(n)]
    shares = [tokens.count(t) / n for t in range(6)]
    assert shares == pytest.approx(probs[0].tolist(), abs=1 / n)


def _exact_chances(patches, probs, tokens):
    """Each token's exact chance under inverse_cdf_sample: the uniforms are the 2**24 multiples of
    2**-24 and the token drawn never falls as the uniform grows, so the uniforms that draw token t
    run from the first that draws t or more to the first that draws past t. Both ends are found by
    bisection, all tokens at once, with the real function."""
    import torch

    bounds = sorted({b for t in tokens for b in (t, t + 1)})
    lo = torch.ones(len(bounds), dtype=torch.int64)
    hi = torch.full((len(bounds),), (1 << 24) + 1, dtype=torch.int64)  # first k drawing >= bound
    want = torch.tensor(bounds)
    while (lo < hi).any():
        mid = (lo + hi) // 2
        drawn = patches.inverse_cdf_sample(probs.expand(len(bounds), -1), mid.clamp(max=1 << 24).float() / (1 << 24))
        reached = (drawn >= want) | (mid > 1 << 24)
        hi, lo = torch.where(reached, mid, hi), torch.where(reached, lo, mid + 1)
    first = dict(zip(bounds, lo.tolist()))
    return {t: (first[t + 1] - first[t]) / (1 << 24) for t in tokens}


def test_inverse_cdf_sample_chances_are_what_its_docstring_says(patches):
    """At Gemma 4's 262144 tokens, with weights that each lose almost a whole 2**-30 unit to the
    integer truncation, a token's exact chance is its probability scaled by up to
    1 / (1 - vocab x 2**-30) (1 + 2**-12 here), give or take 2**-23: relative, not 2**-23
    absolute (the big token is off by far more than that); a token under 2**-30 is never drawn."""
    import torch

    vocab = 262144
    probs = torch.full((1, vocab), 2047.99 / (1 << 30))
    probs[0, 1] = 2**-31  # under one weight unit
    probs[0, 0] = 1 - probs[0, 1:].double().sum().item()  # the big token, about one half
    total = probs.mul(float(1 << 30)).to(torch.int32).to(torch.int64).sum().item()
    assert 1 - total / (1 << 30) > 0.98 * vocab * 2**-30, "the weights truly fall short"
    tokens = [0, 1, 2, 3, vocab // 2, vocab - 2, vocab - 1]
    chances = _exact_chances(patches, probs, tokens)
    scale = 1 / (1 - vocab * 2**-30)
    for t in tokens:
        p = probs[0, t].item()
        assert p - 2**-23 <= chances[t] <= p * scale + 2**-23, (t, p, chances[t])
    assert chances[1] == 0.0
    assert abs(chances[0] - probs[0, 0].item()) > 2**-14, "the error is relative: far above 2**-23"


def _seeded(patches, seed):
    return patches.SeededDraws(seed)


def test_random_sample_seeded_rows_do_not_depend_on_their_neighbours(patches):
    """The same seed gives the same tokens alone, next to other rows, and repeated as padding
    (one draw per call, however many rows repeat it)."""
    import torch

    probs = _probs(3, 4096, seed=5)
    alone, crowded = _seeded(patches, 42), _seeded(patches, 42)
    other = _seeded(patches, 7)
    got_alone, got_crowded = [], []
    for _ in range(5):
        got_alone += patches._hpu_random_sample(probs[:1].clone(), {0: alone}).tolist()
        # rows: the seeded request, an unseeded one, the seeded request again (padding), another seed
        batch = torch.cat([probs[:1], probs[1:2], probs[:1], probs[2:3]])
        out = patches._hpu_random_sample(batch.clone(), {0: crowded, 2: crowded, 3: other}).tolist()
        assert out[0] == out[2]
        got_crowded.append(out[0])
    assert got_alone == got_crowded
    assert alone.draws == crowded.draws == 5
    assert len(set(got_alone)) > 1  # the draws move on


def test_random_sample_unseeded_rows_are_vllms(patches):
    """Rows without a seed, and rows with a torch.Generator (speculative decoding keeps device
    generators), sample exactly what vLLM's random_sample samples."""
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import random_sample

    probs = _probs(4, 512, seed=9)

    def run(fn, with_draws):
        torch.manual_seed(123)  # the unseeded rows' noise
        gens = {1: torch.Generator().manual_seed(1001)}
        if with_draws:
            gens[3] = _seeded(patches, 5)
        return fn(probs.clone(), gens)

    ours, theirs = run(patches._hpu_random_sample, True), run(random_sample, False)
    assert ours[:3].tolist() == theirs[:3].tolist()


# ------------------------------------------------------------------ seeded-sampling: registration
def test_the_plugin_hook_installs_the_seeded_sampler(src, patches, monkeypatch):
    """vllm-gaudi's own apply() (run at platform registration) hooks vLLM's load_general_plugins;
    once vLLM calls that, TopKTopPSampler.forward_native (the sampler on HPU) samples a
    SeededDraws row with the pack's sampler. The hook's other patches need HPU modules and
    torch internals: they are stood in by no-ops; the sampler ones are the module's own."""
    import types

    import torch
    import vllm.plugins
    import vllm.v1.sample.ops.topk_topp_sampler as tts

    monkeypatch.setattr(vllm.plugins, "load_general_plugins", lambda: None)
    monkeypatch.setattr(tts, "random_sample", tts.random_sample)
    ns = dict(vars(patches))
    for name in [n for n in ns if n.startswith("_patch_") and n != "_patch_random_sample"]:
        ns[name] = lambda: None
    ns["torch"] = types.SimpleNamespace(accelerator=types.SimpleNamespace(), _C=types.SimpleNamespace())
    apply = h.defs_from_file(src, PATCHES, h.gaudi_fixes(), ["apply"], ns)["apply"]
    apply()
    vllm.plugins.load_general_plugins()  # what vLLM runs in every process once the platform is up
    assert tts.random_sample is patches._hpu_random_sample

    sampler = tts.TopKTopPSampler()
    probs_logits = torch.randn(2, 64)
    draws = _seeded(patches, 11)
    tokens, _ = sampler.forward_native(probs_logits.clone(), {1: draws}, None, None)
    expected = patches.inverse_cdf_sample(probs_logits[1:].softmax(-1), torch.tensor([patches.seeded_uniform(11, 0)]))
    assert tokens[1].item() == expected.item() and draws.draws == 1


# ------------------------------------------------------------------ seeded-sampling: the runner
def _seeded_tokens(fixes, neighbours, steps=4):
    """S (seed 1234, temperature 1, flat logits over the vocabulary) prefills, then decodes;
    `neighbours` unseeded requests decode beside it, so the decode batch is padded (bucket 4,
    the padding repeats S, the first decode)."""
    from vllm.sampling_params import SamplingParams

    eng = gr.Engine(h.gaudi_src_or_skip(), fixes, gr.logits_table({}, VOCAB))
    new = {"S": ([1, 2], SamplingParams(temperature=1.0, seed=1234), 2)}
    new.update({f"N{i}": ([3], SamplingParams(temperature=1.0), 1) for i in range(neighbours)})
    tokens = eng.step(new=new)["S"]
    for _ in range(steps - 1):
        tokens += eng.decode_all()["S"]
    return eng, tokens


def test_upstream_seeded_tokens_depend_on_the_padding(src):
    _, alone = _seeded_tokens([], 0)
    _, padded = _seeded_tokens([], 2)
    assert alone != padded, "upstream: a padded row advances the seed's generator once more per step"


def test_fixed_seeded_tokens_are_the_seeds_own(src, patches):
    import torch

    eng, alone = _seeded_tokens(h.gaudi_fixes(), 0)
    _, padded = _seeded_tokens(h.gaudi_fixes(), 2)
    assert alone == padded
    # no generator object: draw k is inverse_cdf_sample of the flat distribution at seeded_uniform(1234, k)
    assert type(eng.runner.requests["S"].generator).__name__ == "SeededDraws"
    flat = torch.full((1, VOCAB), 1 / VOCAB)
    assert alone == [
        patches.inverse_cdf_sample(flat, torch.tensor([patches.seeded_uniform(1234, k)])).item() for k in range(4)
    ]


def _chunked_seeded_tokens(fixes, chunks, count=5):
    """S (seed 1234, temperature 1, flat logits), its 6-token prompt prefilled in `chunks` (the
    tokens each step schedules) under async scheduling, vLLM 0.30.0's default on HPU without
    speculative decoding; then decoded. Its first `count` tokens, and the rows each chunk's
    sampler call saw."""
    from vllm.sampling_params import SamplingParams

    eng = gr.Engine(h.gaudi_src_or_skip(), fixes, gr.logits_table({}, VOCAB), async_scheduling=True)
    first, *rest = chunks
    tokens = eng.step(new={"S": (list(range(1, 7)), SamplingParams(temperature=1.0, seed=1234), first)}).get("S", [])
    rows = [len(eng.runner.sampler_calls[0][0])]
    for n in rest:
        tokens += eng.step({"S": n}).get("S", [])
        rows.append(len(eng.runner.sampler_calls[0][0]))
    while len(tokens) < count:
        tokens += eng.decode_all()["S"]
    return tokens, rows


def _seeds_own(patches, count):
    import torch

    flat = torch.full((1, VOCAB), 1 / VOCAB)
    return [
        patches.inverse_cdf_sample(flat, torch.tensor([patches.seeded_uniform(1234, k)])).item() for k in range(count)
    ]


def test_fixed_seeded_tokens_do_not_depend_on_the_prompt_chunks(src, patches):
    """The partial first chunk gets a logits row (the runner's real _extract_prefill_batch_contents:
    "Discard partial prefill logit for async scheduling"), sampled and thrown away. Its draw must be
    given back, as vLLM's GPU runner rewinds its generator: how a prompt is chunked depends on the
    token budget it shares with other requests, so otherwise a seed answers differently under load."""
    one, rows_one = _chunked_seeded_tokens(h.gaudi_fixes(), [6])
    two, rows_two = _chunked_seeded_tokens(h.gaudi_fixes(), [4, 2])
    three, _ = _chunked_seeded_tokens(h.gaudi_fixes(), [2, 2, 2])
    assert rows_one == [1] and rows_two == [1, 1], "each chunk's row is sampled, the partial one too"
    assert one == two == three == _seeds_own(patches, 5)


def test_fixed_speculative_decoding_keeps_a_device_generator(src):
    """The rejection sampler draws with a torch.Generator: under speculative decoding the runner
    still makes one, seeded."""
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    fixes = h.gaudi_fixes()
    mod = h.load_input_batch(src, fixes)
    runner = gr.runner_class(src, fixes, mod)(h.make_batch(mod), gr.logits_table({}), VOCAB, speculative=True)
    new = NewRequestData(
        req_id="S",
        prompt_token_ids=[1],
        mm_features=[],
        sampling_params=SamplingParams(temperature=1.0, seed=99),
        pooling_params=None,
        block_ids=([1],),
        num_computed_tokens=0,
        lora_request=None,
    )
    runner._update_states(
        SchedulerOutput(
            scheduled_new_reqs=[new],
            scheduled_cached_reqs=CachedRequestData.make_empty(),
            num_scheduled_tokens={"S": 1},
            total_num_scheduled_tokens=1,
            scheduled_spec_decode_tokens={},
            scheduled_encoder_inputs={},
            num_common_prefix_blocks=[0],
            finished_req_ids=set(),
            free_encoder_mm_hashes=[],
        )
    )
    generator = runner.requests["S"].generator
    assert isinstance(generator, torch.Generator) and generator.initial_seed() == 99
