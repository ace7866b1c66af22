"""Fix so-row-owners (vllm_gaudi/v1/worker/hpu_model_runner.py): grammar masks on
the logits' own rows.

In sample_tokens' structured-output path the logits are cat(decode rows, prefill
rows that have logits); a partial prompt chunk has no row. Upstream
apply_grammar_bitmask places each mask at the request's persistent-batch index,
so a partial chunk ahead of a prefill shifts that prefill's mask onto the next
row (or past the end). The fix places masks by the same row-owner list the
sampling metadata uses (structured_output_row_owners, from structured-output-rows).

CI part: the added grammar_bitmask_rows(), taken from the fix's own fix.diff.
Checkout part (VLLM_GAUDI_SRC + vllm 0.30.0 and xgrammar importable): the real
apply_grammar_bitmask method, taken from hpu_model_runner.py upstream and with
the pack's fixes, run on CPU logits with xgrammar's CPU kernel (what it calls).
"""
import os
import sys
import types

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gaudi_fixes_helpers as h  # noqa: E402

RUNNER = "vllm_gaudi/v1/worker/hpu_model_runner.py"


# ------------------------------------------------------------------ CI: pure function
def test_grammar_bitmask_rows():
    rows = h.added_functions("so-row-owners", RUNNER, "grammar_bitmask_rows")
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


def test_apply_grammar_bitmask_gets_the_sampling_row_owners():
    """The call site passes the same list to apply_grammar_bitmask and _run_sampling."""
    assert "self.apply_grammar_bitmask(scheduler_output, grammar_output, logits, so_row_owners)" in \
        h.added("so-row-owners", RUNNER)


# ------------------------------------------------------------------ checkout: the real method on CPU
@pytest.fixture(scope="module")
def src():
    src = h.checkout_or_skip()
    pytest.importorskip("xgrammar")
    return src


VOCAB = 64


def _namespace():
    import numpy as np
    import torch
    import xgrammar.kernels.apply_token_bitmask_inplace_cpu as xgr_cpu
    from vllm.v1.core.sched.output import GrammarOutput

    class CpuTorch(types.ModuleType):
        """torch, but torch.tensor(pin_memory=True) works without an accelerator."""

        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def tensor(*args, pin_memory=False, **kwargs):
            return torch.tensor(*args, **kwargs)

    return {"np": np, "torch": CpuTorch("torch"), "xgr_cpu": xgr_cpu, "GrammarOutput": GrammarOutput}


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
FIXED = ["structured-output-rows", "so-row-owners"]


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
