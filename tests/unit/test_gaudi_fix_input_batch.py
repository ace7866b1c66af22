"""Fixes of vllm_gaudi/v1/worker/hpu_input_batch.py: sampling-rows-refresh, bad-words-index.

CI part: the pure functions each fix adds, taken from the fix's own fix.diff.
Checkout part (VLLM_GAUDI_SRC + vllm 0.30.0 importable): the real InputBatch on
CPU, upstream (the bug reproduces) and with the pack's fixes (it does not).
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gaudi_fixes_helpers as h  # noqa: E402
from gaudi_fixes_helpers import src  # noqa: E402,F401  (the checkout fixture)

PATH = "vllm_gaudi/v1/worker/hpu_input_batch.py"


# ------------------------------------------------------------------ CI: pure functions
def test_sampling_rows_to_copy():
    rows_to_copy = h.added_functions("sampling-rows-refresh", PATH, "sampling_rows_to_copy")
    # batch changed: every sampled row, in the caller's order, as upstream did
    assert rows_to_copy([2, 0, 2], {5}, skip_copy=False) == [2, 0, 2]
    # batch unchanged: only rows moved since their last copy, each once
    assert rows_to_copy([0, 1, 2], {1, 2, 7}, skip_copy=True) == [1, 2]
    assert rows_to_copy([0, 1], set(), skip_copy=True) == []
    assert rows_to_copy([3, 3], {3}, skip_copy=True) == [3]


def test_bad_words_by_row():
    by_row = h.added_functions("bad-words-index", PATH, "bad_words_by_row")
    persistent = {1: [[7]], 3: [[4, 5]]}
    assert by_row(persistent, [1]) == {0: [[7]]}             # a one-request prefill of row 1
    assert by_row(persistent, [0, 2]) == {}                   # nobody in this call has bad words
    assert by_row(persistent, [3, 0, 1]) == {0: [[4, 5]], 2: [[7]]}
    assert by_row(persistent, [1, 1]) == {0: [[7]], 1: [[7]]}  # padding repeats a request


# ------------------------------------------------------------------ checkout: real InputBatch
def _two_requests(mod):
    b = h.make_batch(mod)
    b.add_request(h.make_request(mod, "A", range(1, 11), temperature=0.5, top_k=3, top_p=0.5))
    b.add_request(h.make_request(mod, "B", range(11, 15), temperature=1.5, top_k=7, top_p=0.9))
    b.refresh_sampling_metadata()  # what _update_states does when the batch changed
    return b


def _params(meta):
    return meta.temperature.tolist(), meta.top_k.tolist(), meta.top_p.tolist()


def _reorder_then_sample(mod):
    """Step 1 adds A, B and samples both; step 2 changes nothing but reorders
    (what _ensure_decodes_first does when A is still a prompt chunk and B decodes)."""
    b = _two_requests(mod)
    b.make_selective_sampling_metadata([("A", []), ("B", [])], skip_copy=False)
    b.swap_states(0, 1)
    return b, b.make_selective_sampling_metadata([("B", [])], skip_copy=True)


def test_upstream_samples_with_stale_rows_after_reorder(src):
    _, meta = _reorder_then_sample(h.load_input_batch(src))
    assert _params(meta) == ([0.5], [3], [0.5]), "upstream: B sampled with A's parameters"


def test_fixed_samples_with_own_rows_after_reorder(src):
    b, meta = _reorder_then_sample(h.load_input_batch(src, ["sampling-rows-refresh"]))
    assert _params(meta) == ([1.5], [7], [pytest.approx(0.9)])
    meta = b.make_selective_sampling_metadata([("B", []), ("A", [])], skip_copy=True)
    assert _params(meta) == ([1.5, 0.5], [7, 3], [pytest.approx(0.9), 0.5])
    assert b.stale_sampling_rows == set()


def test_fixed_condense_rows(src):
    mod = h.load_input_batch(src, ["sampling-rows-refresh"])
    b = h.make_batch(mod)
    for i, temp in enumerate([0.3, 0.6, 0.9]):
        b.add_request(h.make_request(mod, f"R{i}", [1, 2, 3], temperature=temp))
    b.make_selective_sampling_metadata([("R0", []), ("R1", []), ("R2", [])], skip_copy=False)
    b.condense([b.remove_request("R0")])  # R2 moves into row 0
    meta = b.make_selective_sampling_metadata([("R2", []), ("R1", [])], skip_copy=True)
    assert meta.temperature.tolist() == [pytest.approx(0.9), pytest.approx(0.6)]


def _penalty_prompts(mod):
    b = h.make_batch(mod)
    b.add_request(h.make_request(mod, "A", [1, 2, 3], temperature=0.5, repetition_penalty=1.2))
    b.add_request(h.make_request(mod, "B", [4, 5], temperature=0.5, repetition_penalty=1.2))
    b.make_selective_sampling_metadata([("A", []), ("B", [])], skip_copy=True)  # builds the prompt cache
    b.swap_states(0, 1)
    return b.make_selective_sampling_metadata([("B", [])], skip_copy=True).prompt_token_ids.tolist()


def test_upstream_penalises_with_stale_prompt_cache(src):
    assert _penalty_prompts(h.load_input_batch(src)) == [[1, 2, 3]], "upstream: B penalised with A's prompt"


def test_fixed_penalises_with_own_prompt(src):
    assert _penalty_prompts(h.load_input_batch(src, ["sampling-rows-refresh"])) == [[4, 5, 32]]  # 32: vocab pad


def _bad_words_prefill(mod):
    """A decodes in row 0; B (bad word: token 5 after token 4) is sampled alone, as a prefill."""
    import torch
    from vllm.v1.sample.ops.bad_words import apply_bad_words
    b = h.make_batch(mod)
    b.add_request(h.make_request(mod, "A", [1, 2], output=[3], temperature=0.5))
    b.add_request(h.make_request(mod, "B", [4], temperature=0.5, bad_words_token_ids=[[4, 5], [9]]))
    meta = b.make_selective_sampling_metadata([("B", [4])], skip_copy=False)
    logits = torch.zeros(1, 32)
    apply_bad_words(logits, meta.bad_words_token_ids, meta.output_token_ids)  # what the Sampler calls
    return meta, logits


def test_upstream_bad_words_index_error(src):
    with pytest.raises(IndexError):
        _bad_words_prefill(h.load_input_batch(src))


@pytest.mark.parametrize("fixes", [["bad-words-index"], ["sampling-rows-refresh", "bad-words-index"]])
def test_fixed_bad_words_on_own_row(src, fixes):
    # alone, its first hunk lands at an offset (its line numbers count the earlier fix)
    meta, logits = _bad_words_prefill(h.load_input_batch(src, fixes, exact=len(fixes) > 1))
    assert meta.bad_words_token_ids == {0: [[4, 5], [9]]}
    assert torch_isinf(logits[0]) == [5, 9]


def torch_isinf(row):
    return [i for i, v in enumerate(row.tolist()) if v == float("-inf")]
