"""Fix logitsprocs-rows (vllm_gaudi/v1/worker/hpu_input_batch.py, hpu_model_runner.py):
min_p, logit_bias and min_tokens are applied.

Upstream never feeds the batch-update builder nor calls the logits processors'
update_state(), so vLLM's built-in MinP / LogitBias / MinTokens processors hold no
request and change nothing. The fix records adds / removals / swaps / condense moves
as vLLM's GPU input batch does, updates the processors once per step
(InputBatch.update_logitsprocs(): from sample_tokens, or from execute_model on a step
that schedules no tokens and so never reaches sample_tokens), and maps each row of a
selective batch's logits to the persistent-batch index the processors are keyed by.

All of it runs vllm-gaudi's own code from the checkout (VLLM_GAUDI_SRC + vllm 0.30.0):
the real InputBatch on CPU with vLLM's real built-in processors and Sampler, and the
runner's real step (tests/gaudi_runner.py) for the call sites.
"""

from tests import gaudi_fixes_helpers as h
from tests import gaudi_runner as gr
from tests.gaudi_fixes_helpers import src  # noqa: F401  (the checkout fixture)

BATCH = "vllm_gaudi/v1/worker/hpu_input_batch.py"
FIXED = ["sampling-rows-refresh", "bad-words-index", "logitsprocs-rows"]  # the pack's fixes of hpu_input_batch.py
VOCAB = 32


# ------------------------------------------------------------------ the function the fix adds
def test_first_row_of_each_index(src):
    (first,) = h.defs(src, BATCH, FIXED, ["first_row_of_each_index"])
    assert first([1]) == ([0], [1])  # a prefill of persistent row 1, sampled alone
    assert first([0, 1, 2]) == ([0, 1, 2], [0, 1, 2])
    assert first([2, 0]) == ([0, 1], [2, 0])
    assert first([3, 1, 3, 3]) == ([0, 1], [3, 1])  # padding repeats the first request
    assert first([]) == ([], [])


# ------------------------------------------------------------------ the runner's step: call sites
def _engine(fixes, table):
    return gr.Engine(h.gaudi_src_or_skip(), fixes, gr.logits_table(table, VOCAB))


def _greedy(**kw):
    from vllm.sampling_params import SamplingParams

    return SamplingParams(temperature=0.0, **kw)


def _bias_after_an_idle_step(fixes):
    """A runs and finishes. The next step schedules no tokens (vLLM still runs it to hand over the
    finished request; warm-up's clean-up step is one): execute_model returns before sample_tokens.
    Then B, with logit_bias, is added into the row A left. Returns B's tokens over two steps."""
    eng = _engine(fixes, {"A": {3: 5.0}, "B": {7: 5.0}})
    eng.step(new={"A": ([1, 2], _greedy(logit_bias={4: 100.0}), 2)})
    assert eng.step({}, finished=["A"]) == {}  # the idle step
    first = eng.step(new={"B": ([5, 6], _greedy(logit_bias={9: 100.0}), 2)})
    return first["B"] + eng.step({"B": 1})["B"]


def test_upstream_ignores_logit_bias_in_the_runner(src):
    assert _bias_after_an_idle_step([]) == [7, 7], "upstream: logit_bias ignored"


def test_fixed_logit_bias_after_an_idle_step(src):
    assert _bias_after_an_idle_step(h.gaudi_fixes()) == [9, 9]


def test_fixed_logit_bias_after_warm_up(src):
    """The runner's own warm-up sequence (_execute_dummy_scenario): a dummy step in warm-up mode,
    sample_tokens, then the clean-up step with no tokens; the first request served lands in the
    dummy's row."""
    eng = _engine(h.gaudi_fixes(), {"B": {7: 5.0}})
    runner = eng.runner
    dummy = eng.step(new={"0": ([1, 2, 3], _greedy(), 3)}, warmup=True)
    assert dummy == {"0": [0]}
    assert eng.step({}, finished=["0"], warmup=True) == {}
    assert runner.input_batch.num_reqs == 0
    assert eng.step(new={"B": ([5], _greedy(logit_bias={9: 100.0}), 1)}) == {"B": [9]}


# ------------------------------------------------------------------ the warm-up batch
RUNNER = "vllm_gaudi/v1/worker/hpu_model_runner.py"


def _warm_up_batch_step(fixes, logitsprocs):
    """warmup_model's batch when decode_buckets[-1][0] (8) exceeds --max-num-seqs (4): 8 rows,
    each given a request with min_p as warm-up's dummy requests fill it, then one step. Token 3
    leads by 3 nats: min_p 0.5 leaves it alone (unfiltered, each row would draw it 39% of the time)."""
    logits = gr.logits_table({}, VOCAB, default={3: 3.0})
    eng = gr.Engine(h.gaudi_src_or_skip(), fixes, logits, max_num_reqs=8, logitsprocs=logitsprocs)
    from vllm.sampling_params import SamplingParams

    new = {f"R{i}": ([1, 2], SamplingParams(temperature=1.0, min_p=0.5), 2) for i in range(8)}
    return eng.step(new=new, warmup=True)


def test_upstream_warm_up_batch_above_max_num_seqs_overruns_min_p(src):
    """Upstream sizes the warm-up batch's processors by max_num_seqs; with the batch changes
    reaching them, the fifth add indexes past MinP's arrays."""
    import pytest

    with pytest.raises(IndexError, match="index 4 is out of bounds"):
        _warm_up_batch_step(h.gaudi_fixes(), gr.processors(max_num_seqs=4))


def _real_config(max_num_seqs):
    import types

    from vllm.config import SchedulerConfig, VllmConfig

    config = VllmConfig(
        scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs, max_model_len=64, is_encoder_decoder=False)
    )
    config.model_config = types.SimpleNamespace(logits_processors=None)  # no model here; no custom processors
    return config


def test_fixed_warm_up_batch_processors_have_its_rows(src):
    """logitsprocs_for_rows, which warmup_model's batch now takes its processors from, with
    vLLM's real build_logitsprocs and a real VllmConfig: processors for 8 rows, the config
    untouched, and every row of the warm-up step sampled with its min_p."""
    import copy

    import torch
    from vllm.v1.sample.logits_processor import build_logitsprocs

    (for_rows,) = h.defs(
        src,
        RUNNER,
        h.gaudi_fixes(),
        ["logitsprocs_for_rows"],
        {"copy": copy, "torch": torch, "build_logitsprocs": build_logitsprocs, "VllmConfig": object},
    )
    config = _real_config(4)
    procs = for_rows(config, 8, torch.device("cpu"), False, False)
    assert config.scheduler_config.max_num_seqs == 4, "the engine's own config is not changed"
    assert _warm_up_batch_step(h.gaudi_fixes(), procs) == {f"R{i}": [3] for i in range(8)}
    same = for_rows(config, 4, torch.device("cpu"), False, False)  # the runner's own batch: as before
    assert [type(p).__name__ for p in same.all] == [type(p).__name__ for p in procs.all]


def test_fixed_min_tokens_through_the_runner(src):
    """min_tokens 2 with stop token 7, which the logits favour: the first two tokens are the
    runner-up; the runner grows output_token_ids itself (sync scheduling)."""
    eng = _engine(h.gaudi_fixes(), {"B": {7: 5.0, 11: 4.0}})
    got = eng.step(new={"B": ([4], _greedy(min_tokens=2, stop_token_ids=[7]), 1)})["B"]
    for _ in range(2):
        got += eng.step({"B": 1})["B"]
    assert got == [11, 11, 7]


# ------------------------------------------------------------------ the real InputBatch + processors
def _batch(mod, *requests):
    b = h.make_batch(mod, vocab_size=VOCAB, logitsprocs=gr.processors())
    for req in requests:
        b.add_request(req)
    b.refresh_sampling_metadata()  # what _update_states does when the batch changed
    return b


def _step(b):
    """What the patched sample_tokens does before sampling; upstream has no such call."""
    if hasattr(b, "update_logitsprocs"):
        b.update_logitsprocs()


def _sample(b, req_ids, logits):
    from vllm.v1.sample.sampler import Sampler

    meta = b.make_selective_sampling_metadata(
        [(r, b.req_output_token_ids[b.req_id_to_index[r]]) for r in req_ids], skip_copy=False
    )
    return Sampler()(logits.clone(), meta).sampled_token_ids.flatten().tolist()


def _logits(rows, best):
    import torch

    logits = torch.zeros(rows, VOCAB)
    for row, token in enumerate(best):
        logits[row, token] = 10.0
    return logits


def _bias_case(mod):
    """A decodes in row 0; B (greedy, logit_bias +100 on token 5) is a prefill sampled alone."""
    a = h.make_request(mod, "A", [1, 2], output=[3], temperature=0.0)
    b_req = h.make_request(mod, "B", [4], temperature=0.0, logit_bias={5: 100.0})
    b = _batch(mod, a, b_req)
    _step(b)
    return _sample(b, ["B"], _logits(1, [9])), _sample(b, ["A", "B"], _logits(2, [9, 9]))


def test_upstream_ignores_logit_bias(src):
    alone, both = _bias_case(h.load_input_batch(src))
    assert alone == [9] and both == [9, 9], "upstream: logit_bias ignored"


def test_fixed_logit_bias_on_own_row(src):
    alone, both = _bias_case(h.load_input_batch(src, FIXED))
    assert alone == [5]  # selective batch: B is row 0 here, persistent row 1
    assert both == [9, 5]  # A untouched


def _min_p_case(mod):
    """B (min_p 0.5) sampled alone as row 0: tokens below half the top probability are cut."""
    import torch

    a = h.make_request(mod, "A", [1, 2], output=[3], temperature=1.0)
    b_req = h.make_request(mod, "B", [4], temperature=1.0, min_p=0.5)
    b = _batch(mod, a, b_req)
    _step(b)
    meta = b.make_selective_sampling_metadata([("B", [])], skip_copy=False)
    logits = torch.full((1, VOCAB), -5.0)
    logits[0, 3], logits[0, 4], logits[0, 8] = 2.0, 1.9, 1.0  # 8 is < 0.5 * p(3)
    for proc in meta.logitsprocs.argmax_invariant:
        logits = proc.apply(logits)
    return [t for t in range(VOCAB) if logits[0, t] != float("-inf")]


def test_upstream_ignores_min_p(src):
    assert len(_min_p_case(h.load_input_batch(src))) == VOCAB, "upstream: min_p ignored"


def test_fixed_min_p_on_own_row(src):
    assert _min_p_case(h.load_input_batch(src, FIXED)) == [3, 4]


def _min_tokens_case(mod, kept=True):
    """B: min_tokens 2, stop token 7, greedy, and its logits favour 7 at each step."""
    b_req = h.make_request(mod, "B", [4], temperature=0.0, min_tokens=2, stop_token_ids=[7])
    a = h.make_request(mod, "A", [1, 2], output=[3], temperature=0.0)
    b = _batch(mod, a, b_req)
    got = []
    for _ in range(3):
        if hasattr(b, "update_logitsprocs"):
            b.update_logitsprocs(output_token_ids_kept=kept)
        logits = _logits(1, [7])
        logits[0, 11] = 5.0  # the runner-up
        token = _sample(b, ["B"], logits)[0]
        got.append(token)
        b_req.output_token_ids.append(token)  # what sample_tokens does with the sampled token
    return got


def test_upstream_ignores_min_tokens(src):
    assert _min_tokens_case(h.load_input_batch(src)) == [7, 7, 7], "upstream: min_tokens ignored"


def test_fixed_min_tokens(src):
    assert _min_tokens_case(h.load_input_batch(src, FIXED)) == [11, 11, 7]


def test_fixed_min_tokens_off_without_output_tokens(src):
    # async scheduling: output_token_ids does not grow, so min_tokens is left off (as upstream)
    assert _min_tokens_case(h.load_input_batch(src, FIXED), kept=False) == [7, 7, 7]


def test_fixed_rows_follow_swap_and_condense(src):
    import torch

    mod = h.load_input_batch(src, FIXED)
    reqs = [
        h.make_request(mod, "A", [1], temperature=0.0),
        h.make_request(mod, "B", [1], temperature=0.0, logit_bias={5: 100.0}),
        h.make_request(mod, "C", [1], temperature=0.0, logit_bias={6: 100.0}),
    ]
    b = _batch(mod, *reqs)
    _step(b)
    assert _sample(b, ["A", "B", "C"], _logits(3, [9, 9, 9])) == [9, 5, 6]
    # step 2: A finishes (condense moves C into row 0), then a reorder swaps B and C
    b.condense([b.remove_request("A")])
    b.swap_states(0, 1)
    _step(b)
    assert (b.req_id_to_index["B"], b.req_id_to_index["C"]) == (0, 1)
    assert _sample(b, ["B", "C"], _logits(2, [9, 9])) == [5, 6]
    assert _sample(b, ["C"], _logits(1, [9])) == [6]
    # step 3: D is added into the freed row... here row 2; B is removed
    b.add_request(h.make_request(mod, "D", [1], temperature=0.0))
    b.condense([b.remove_request("B")])  # D (row 2) moves into row 0
    _step(b)
    assert b.req_id_to_index == {"D": 0, "C": 1}
    assert _sample(b, ["D", "C"], _logits(2, [9, 9])) == [9, 6]
    # a padded decode batch (the first request repeated) keeps the real rows right
    assert _sample(b, ["D", "C", "D"], _logits(3, [9, 9, 9]))[:2] == [9, 6]
    # step 4: C, the last row, finishes (nothing moves); its bias must go with it
    b.condense([b.remove_request("C")])
    _step(b)
    assert _sample(b, ["D"], _logits(1, [9])) == [9]
    b.add_request(h.make_request(mod, "E", [1], temperature=0.0))  # E takes row 1, C's old row
    _step(b)
    assert _sample(b, ["D", "E"], _logits(2, [9, 9])) == [9, 9]
    assert torch.is_tensor(b.make_selective_sampling_metadata([("E", [])]).temperature)
