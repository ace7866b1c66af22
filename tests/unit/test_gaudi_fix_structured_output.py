"""Fixes structured-output-rows and so-row-owners (vllm_gaudi/v1/worker/hpu_model_runner.py):
structured-output steps sample, mask and report each logits row as its own request's.

In sample_tokens' structured-output path the logits are cat(decode rows, prefill rows that
have logits); a partial prompt chunk has no row. Upstream samples those rows with the
requests prompt_req_ids + decode_req_ids (the wrong order, and one request too many next to
a partial chunk), files their logprobs under decode + prompt ids, and apply_grammar_bitmask
places each mask at the request's persistent-batch index, so a partial chunk ahead of a
prefill shifts that prefill's mask onto the next row (or past the end).
structured-output-rows samples and reports by the row owners (structured_output_row_owners);
so-row-owners places the masks by the same list.

Everything runs vllm-gaudi's own code from the checkout (VLLM_GAUDI_SRC + vllm 0.30.0 and
xgrammar): the runner's real step (tests/gaudi_runner.py), and the real apply_grammar_bitmask
alone on CPU logits with xgrammar's CPU kernel (what it calls).
"""

import types

import pytest

from tests import gaudi_fixes_helpers as h
from tests import gaudi_runner as gr

RUNNER = "vllm_gaudi/v1/worker/hpu_model_runner.py"
SOR = ["sampling-rows-refresh", "structured-output-rows"]
FIXED = ["structured-output-rows", "so-row-owners"]


@pytest.fixture(scope="module")
def src():
    src = h.checkout_or_skip()
    h.import_or_skip("xgrammar")
    return src


# ------------------------------------------------------------------ the functions the fixes add
def test_structured_output_row_owners(src):
    (owners,) = h.defs(src, RUNNER, SOR, ["structured_output_row_owners"])
    # logits = cat(decode rows, prefill rows with logits); P1 is a partial chunk without logits
    assert owners(["D0", "D1"], ["P0", "P2"]) == ["D0", "D1", "P0", "P2"]
    assert owners([], ["P0"]) == ["P0"] and owners(("D0",), ()) == ["D0"]


def test_grammar_bitmask_rows(src):
    (rows,) = h.defs(src, RUNNER, FIXED, ["grammar_bitmask_rows"])
    # persistent batch [D0, Pp (partial chunk), P1, P2]; logits rows [D0, P1, P2];
    # the scheduler leaves the partial chunk out of the structured-output ids
    assert rows(["D0", "P1", "P2"], ["D0", "P1"], {}) == [(0, 0), (1, 1)]
    # bitmask order differs from the row order
    assert rows(["D0", "P1", "P2"], ["P2", "D0"], {}) == [(2, 0), (0, 1)]
    # a request without a logits row: no mask placed, its bitmask row skipped
    assert rows(["D0", "P1"], ["X", "P1"], {}) == [(1, 1)]
    # spec tokens: 1 + k bitmask rows per request; each of its logits rows takes one, in order
    assert rows(["A", "A", "A", "B"], ["A", "B"], {"A": [5, 6]}) == [(0, 0), (1, 1), (2, 2), (3, 3)]
    # one logits row per request (the HPU structured-output path): the first mask row
    assert rows(["A", "B"], ["A", "B"], {"A": [5, 6]}) == [(0, 0), (1, 3)]
    assert rows([], ["A"], {}) == []


# ------------------------------------------------------------------ the runner's step
LOGITS = {"D": {3: 5.0, 4: 4.0}, "Q": {9: 5.0}, "P": {7: 5.0, 8: 4.0}}


def _grammar(allowed):
    """GrammarOutput for requests {req_id: the one token its grammar allows}, vocab 32."""
    import numpy as np
    from vllm.v1.core.sched.output import GrammarOutput

    ids = list(allowed)
    bitmask = np.zeros((len(ids), 1), dtype=np.int32)
    for row, req_id in enumerate(ids):
        bitmask[row, 0] = np.int32(np.uint32(1 << allowed[req_id]).view(np.int32))
    return GrammarOutput(ids, bitmask)


def _structured_step(fixes, partial_chunk, allowed):
    """D decodes; P (a 2-token prompt, temperature 0.7 with a seed) completes its prompt; with
    partial_chunk, Q (12 tokens) sits between them mid-prompt, a chunk without logits. D is greedy.
    Every request asks for 1 logprob. Returns (sampled, the sampler's temperatures by row,
    {req_id: the logprob token ids reported for it})."""
    from vllm.sampling_params import SamplingParams

    eng = gr.Engine(h.gaudi_src_or_skip(), fixes, gr.logits_table(LOGITS))
    eng.step(new={"D": ([1, 2], SamplingParams(temperature=0.0, logprobs=1), 2)})
    schedule = {"D": 1}
    if partial_chunk:
        eng.step({"D": 1}, new={"Q": (list(range(1, 13)), SamplingParams(temperature=0.0, logprobs=1), 4)})
        schedule["Q"] = 4
    sampled = eng.step(
        schedule, new={"P": ([4, 5], SamplingParams(temperature=0.7, seed=3, logprobs=1), 2)}, grammar=_grammar(allowed)
    )
    ((_, meta),) = eng.runner.sampler_calls  # one sampling call for the combined logits
    out = eng.last_output
    logprobs = {r: out.logprobs.logprob_token_ids[out.req_id_to_index[r]].tolist() for r in sampled}
    return sampled, [round(t, 3) for t in meta.temperature.tolist()], logprobs


def test_upstream_samples_each_row_with_the_other_requests_parameters(src):
    _, temperatures, _ = _structured_step([], False, {"D": 3})
    assert temperatures == [0.7, -1.0], "upstream: the decode row sampled with P's temperature and P greedily"


def test_upstream_fails_next_to_a_partial_chunk(src):
    with pytest.raises(RuntimeError, match="must match the size"):  # in the engine core
        _structured_step([], True, {"D": 3})


@pytest.mark.parametrize("partial_chunk", [False, True], ids=["decode+prefill", "with-partial-chunk"])
def test_fixed_rows_sampled_and_reported_as_their_own(src, partial_chunk):
    # D greedy (-1 on HPU), P at 0.7; D's grammar allows only 4, its runner-up
    sampled, temperatures, logprobs = _structured_step(SOR, partial_chunk, {"D": 4})
    assert temperatures == [-1.0, 0.7]
    assert sampled == {"D": [4], "P": [7]}
    assert logprobs == {"D": [4, 4], "P": [7, 7]}  # [sampled, top-1] of each request's own row


def test_fixed_grammar_mask_on_its_own_row_next_to_a_partial_chunk(src):
    """The call site passes the sampling's row owners to apply_grammar_bitmask: P's grammar
    (only token 8, its runner-up) constrains P's row, D is free."""
    sampled, _, _ = _structured_step(h.gaudi_fixes(), True, {"P": 8})
    assert sampled == {"D": [3], "P": [8]}


def test_without_so_row_owners_the_mask_goes_past_the_logits(src):
    # with structured-output-rows only, apply_grammar_bitmask still uses persistent indices:
    # P (persistent 2) takes logits row 2, which does not exist next to the partial chunk
    with pytest.raises(IndexError):
        _structured_step(SOR, True, {"P": 8})


# ------------------------------------------------------------------ the real method alone on CPU
VOCAB = 64


def _namespace():
    import numpy as np
    import xgrammar.kernels.apply_token_bitmask_inplace_cpu as xgr_cpu
    from vllm.v1.core.sched.output import GrammarOutput

    return {"np": np, "torch": gr.cpu_torch(), "xgr_cpu": xgr_cpu, "GrammarOutput": GrammarOutput}


def _apply(src, fixes, req_id_to_index, so_ids, allowed, row_owners):
    """Run apply_grammar_bitmask on zero logits, one row per row owner; return
    for each row the allowed tokens (None: the row was not masked)."""
    import numpy as np
    import torch
    from vllm.v1.core.sched.output import GrammarOutput

    ns = _namespace()
    funcs = h.defs_from_file(src, RUNNER, fixes, ["grammar_bitmask_rows"], ns)
    ns.update(funcs)
    method = h.defs_from_file(src, RUNNER, fixes, ["apply_grammar_bitmask"], ns, cls="HPUModelRunner")
    apply = method["apply_grammar_bitmask"]
    bitmask = np.zeros((len(so_ids), VOCAB // 32), dtype=np.int32)
    for row, token in enumerate(allowed):
        bitmask[row, token // 32] = 1 << (token % 32)
    runner = types.SimpleNamespace(device="cpu", input_batch=types.SimpleNamespace(req_id_to_index=req_id_to_index))
    sched = types.SimpleNamespace(scheduled_spec_decode_tokens={})
    logits = torch.zeros(len(row_owners), VOCAB)
    args = [runner, sched, GrammarOutput(list(so_ids), bitmask), logits]
    if "grammar_bitmask_rows" in funcs:  # the fixed signature takes the row owners
        args.append(list(row_owners))
    apply(*args)
    out = []
    for row in logits:
        ok = [t for t in range(VOCAB) if row[t] != float("-inf")]
        out.append(None if len(ok) == VOCAB else ok)
    return out


# persistent batch [D0, Pp, P1, P2]: D0 decodes, Pp is a partial prompt chunk (no
# logits row, not in the grammar output), P1 and P2 complete their prompts.
BATCH = {"D0": 0, "Pp": 1, "P1": 2, "P2": 3}
OWNERS = ["D0", "P1", "P2"]  # structured_output_row_owners(decodes, prefill rows with logits)


def test_upstream_mask_lands_on_the_neighbours_row(src):
    rows = _apply(src, [], BATCH, ["D0", "P1"], [3, 7], OWNERS)
    assert rows == [[3], None, [7]], "upstream: P1's grammar constrains P2, and P1 is unconstrained"


def test_fixed_mask_on_own_row(src):
    assert _apply(src, FIXED, BATCH, ["D0", "P1"], [3, 7], OWNERS) == [[3], [7], None]


def test_upstream_mask_past_the_last_row(src):
    batch = {"D0": 0, "Pp": 1, "P1": 2}
    with pytest.raises(IndexError):
        _apply(src, [], batch, ["D0", "P1"], [3, 7], ["D0", "P1"])


def test_fixed_all_rows_structured(src):
    batch = {"D0": 0, "Pp": 1, "P1": 2}
    assert _apply(src, FIXED, batch, ["P1", "D0"], [7, 3], ["D0", "P1"]) == [[3], [7]]
