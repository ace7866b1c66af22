"""Fixes of vllm_gaudi/v1/worker/hpu_input_batch.py: sampling-rows-refresh, bad-words-index.

Everything runs vllm-gaudi's own code from the checkout (VLLM_GAUDI_SRC, vllm 0.30.0):
the real InputBatch on CPU, and the runner's real step (tests/gaudi_runner.py) where the
symptom shows in the runner, upstream (the bug reproduces) and with the pack's fixes.
"""

import pytest

from tests import gaudi_fixes_helpers as h
from tests import gaudi_runner as gr
from tests.gaudi_fixes_helpers import src  # noqa: F401  (the checkout fixture)

PATH = "vllm_gaudi/v1/worker/hpu_input_batch.py"
BATCH_FIXES = ["sampling-rows-refresh", "bad-words-index", "logitsprocs-rows"]  # the pack's fixes of this file


# ------------------------------------------------------------------ the functions the fixes add
def test_sampling_rows_to_copy(src):
    (rows_to_copy,) = h.defs(src, PATH, BATCH_FIXES, ["sampling_rows_to_copy"])
    # batch changed: every sampled row, in the caller's order, as upstream did
    assert rows_to_copy([2, 0, 2], {5}, skip_copy=False) == [2, 0, 2]
    # batch unchanged: only rows moved since their last copy, each once
    assert rows_to_copy([0, 1, 2], {1, 2, 7}, skip_copy=True) == [1, 2]
    assert rows_to_copy([0, 1], set(), skip_copy=True) == []
    assert rows_to_copy([3, 3], {3}, skip_copy=True) == [3]


def test_bad_words_by_row(src):
    (by_row,) = h.defs(src, PATH, BATCH_FIXES, ["bad_words_by_row"])
    persistent = {1: [[7]], 3: [[4, 5]]}
    assert by_row(persistent, [1]) == {0: [[7]]}  # a one-request prefill of row 1
    assert by_row(persistent, [0, 2]) == {}  # nobody in this call has bad words
    assert by_row(persistent, [3, 0, 1]) == {0: [[4, 5]], 2: [[7]]}
    assert by_row(persistent, [1, 1]) == {0: [[7]], 1: [[7]]}  # padding repeats a request


# ------------------------------------------------------------------ the runner's step
def _reorder_without_batch_change(fixes):
    """P_a (12-token prompt) and P_b (8 tokens) prefill in chunks of 4. Step 2 completes P_b
    (sampled, the batch unchanged: the cached prompt ids are built); step 3 completes P_a while
    P_b decodes, so _ensure_decodes_first swaps them, again without a batch change. Returns the
    SamplingMetadata the sampler got for P_b's decode in step 3."""
    from vllm.sampling_params import SamplingParams

    eng = gr.Engine(h.gaudi_src_or_skip(), fixes, gr.logits_table({}))
    eng.step(
        new={
            "Pa": (list(range(1, 13)), SamplingParams(temperature=0.5, top_k=3, top_p=0.5, repetition_penalty=1.2), 4),
            "Pb": (list(range(13, 21)), SamplingParams(temperature=1.5, top_k=7, top_p=0.9, repetition_penalty=1.2), 4),
        }
    )
    eng.step({"Pa": 4, "Pb": 4})
    eng.step({"Pa": 4, "Pb": 1})
    assert eng.runner.input_batch.req_ids[:2] == ["Pb", "Pa"], "step 3 should have swapped the rows"
    decode_logits, decode_meta = eng.runner.sampler_calls[1]  # after the prefill's call, the decode's
    assert decode_logits.shape[0] == 1
    return decode_meta


def _params(meta):
    return meta.temperature.tolist(), meta.top_k.tolist(), [round(p, 3) for p in meta.top_p.tolist()]


def test_upstream_samples_a_swapped_row_with_stale_parameters(src):
    meta = _reorder_without_batch_change([])
    assert _params(meta) == ([0.5], [3], [0.5]), "upstream: P_b sampled with P_a's temperature/top_k/top_p"
    assert meta.prompt_token_ids.tolist() == [list(range(1, 13))], "upstream: P_b penalised with P_a's prompt"


def test_fixed_samples_a_swapped_row_with_its_own_parameters(src):
    meta = _reorder_without_batch_change(h.gaudi_fixes())
    assert _params(meta) == ([1.5], [7], [0.9])
    assert meta.prompt_token_ids.tolist() == [list(range(13, 21)) + [32] * 4]  # 32: the vocab-size pad


def _bad_words_prefill(fixes):
    """A decodes in row 0; B (bad words: 5 after 4, and 9) is a prefill sampled alone."""
    from vllm.sampling_params import SamplingParams

    eng = gr.Engine(h.gaudi_src_or_skip(), fixes, gr.logits_table({"A": {3: 5.0}, "B": {9: 5.0, 2: 1.0}}))
    eng.step(new={"A": ([1, 2], SamplingParams(temperature=0.0), 2)})
    params = SamplingParams(temperature=0.0)
    params._bad_words_token_ids = [[4, 5], [9]]  # what update_from_tokenizer() sets from bad_words
    return eng.step({"A": 1}, new={"B": ([4], params, 1)})


def test_upstream_bad_words_index_error(src):
    with pytest.raises(IndexError):  # in the engine core: the whole server stops
        _bad_words_prefill([])


def test_fixed_bad_words_on_own_row(src):
    assert _bad_words_prefill(h.gaudi_fixes()) == {"A": [3], "B": [2]}  # 9 banned on B's own row


@pytest.mark.parametrize("fixes", [["bad-words-index"], ["sampling-rows-refresh", "bad-words-index"]])
def test_fixed_bad_words_real_input_batch(src, fixes):
    """The same on the InputBatch alone, bad-words-index with and without the fix before it."""
    import torch
    from vllm.v1.sample.ops.bad_words import apply_bad_words

    # alone, its hunks land at an offset (their line numbers count the earlier fix)
    mod = h.load_input_batch(src, fixes, exact=len(fixes) > 1)
    b = h.make_batch(mod)
    b.add_request(h.make_request(mod, "A", [1, 2], output=[3], temperature=0.5))
    b.add_request(h.make_request(mod, "B", [4], temperature=0.5, bad_words_token_ids=[[4, 5], [9]]))
    meta = b.make_selective_sampling_metadata([("B", [4])], skip_copy=False)
    logits = torch.zeros(1, 32)
    apply_bad_words(logits, meta.bad_words_token_ids, meta.output_token_ids)  # what the Sampler calls
    assert meta.bad_words_token_ids == {0: [[4, 5], [9]]}
    assert [i for i, v in enumerate(logits[0].tolist()) if v == float("-inf")] == [5, 9]
