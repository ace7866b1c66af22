"""Fix gemma4-fast-prefill (hpu_model_runner.py, v1/attention/backends/hpu_attn.py,
attention/backends/hpu_attn.py, models/gemma4.py): --kv-sharing-fast-prefill on HPU.

Upstream, HpuGemma4Model runs vLLM's fast_prefill_forward, which asserts per-layer dict
metadata; the HPU runner passes one trimmed tuple and never builds the fast-prefill
metadata, so the flag fails. The fix: the runner gives a prompt batch without cached
context a plan (one decode-shaped row per prompt, its last token, over the prompt's own
blocks, with the exact sliding window), whose shapes depend only on the prompt bucket (the
block lists keep physical ids and are padded to the bucket's capacity, so warm-up compiles
every shape served); HpuModelAdapter.forward processes it like decode metadata; the decode
attention fetches its blocks by id; HpuGemma4Model.fast_prefill_forward runs the KV-shared
layers on those rows only and puts their output back on the sampled tokens.

Everything runs vllm-gaudi's own code from the checkout (VLLM_GAUDI_SRC + vllm 0.30.0),
compiled from the patched files: the runner's _form_prefill_batch, _attach_fast_prefill and
get_habana_paged_attn_buffers, trim_attn_metadata, HpuModelAdapter.forward with the metadata
processor, the decode branch of HPUAttentionImpl.forward with the flat paged attention of
vllm_gaudi/extension/ops.py and VLLMKVCache's fetch (contiguous PA or not), and
HpuGemma4Model.fast_prefill_forward. STAND-INS: the prompt branch of the attention (FusedSDPA
is an HPU kernel; _prompt_attention computes what it computes: causal, within the window on
sliding layers), a toy two-stage model with Gemma 4's KV-sharing shape, or vLLM 0.30.0's real
Gemma 4 decoder layers (the tiny random config) with HPU RoPE's per-forward cos/sin cache
emulated; get_config() (a namespace with the flags these paths read); set_forward_context
(it installs the metadata, as vLLM's does) and set_hpu_dp_metadata (no data parallelism).
Not run: the HPU kernels themselves, HPU graphs, warm-up itself. Merged prefill: only that it turns fast prefill off.
"""

import contextlib
import itertools
import logging
import random
import types

import pytest

from tests import gaudi_fixes_helpers as h
from tests.gaudi_fixes_helpers import src  # noqa: F401  (the checkout fixture)

FIX = "gemma4-fast-prefill"
RUNNER = "vllm_gaudi/v1/worker/hpu_model_runner.py"
ATTN_V1 = "vllm_gaudi/v1/attention/backends/hpu_attn.py"
ATTN_IMPL = "vllm_gaudi/attention/backends/hpu_attn.py"
MODEL = "vllm_gaudi/models/gemma4.py"
BLOCK, WINDOW, DIM, NUM_BLOCKS = 4, 6, 8, 40
LOGGER = "hpu_model_runner_under_test"


# ------------------------------------------------------------------ the functions the fix adds
def _runner_helpers(src):
    import typing

    return h.defs(
        src,
        RUNNER,
        h.gaudi_fixes(),
        [
            "fast_prefill_eligible",
            "fast_prefill_blocks",
            "fast_prefill_index",
            "fast_prefill_plan_shape",
            "fast_prefill_paged_lists",
        ],
        {"Optional": typing.Optional},
    )


def test_eligible_only_fresh_prompts_sampling_their_last_token(src):
    eligible = _runner_helpers(src)[0]
    assert eligible([5, 3], [0, 0], [[4], [2]])
    assert not eligible([5, 3], [0, 128], [[4], [2]])  # a prefix-cache hit or a later chunk
    assert not eligible([5], [0], [[]])  # a partial chunk: nothing sampled
    assert not eligible([5], [0], [[3, 4]])  # several logits rows
    assert not eligible([5], [0], [[3]])  # a row that is not the last token
    assert not eligible([], [], [])


def _attended(tables, heads, usage_last, block_size):
    """(block, offset) slots a decode row reads: all of its blocks, minus the head
    of the first, minus the slots past the last token in the last."""
    slots = []
    for i, blk in enumerate(tables):
        lo = heads[i] if heads else 0
        hi = usage_last if i == len(tables) - 1 else block_size
        slots += [(blk, off) for off in range(lo, hi)]
    return slots


@pytest.mark.parametrize("block_size,window", [(4, 6), (4, 8), (128, 512), (16, 5)])
def test_blocks_cover_exactly_the_attended_positions(src, block_size, window):
    _, blocks_fn, _, shape_fn, _ = _runner_helpers(src)
    rnd = random.Random(block_size * 1000 + window)
    for _ in range(200):
        seq_len = rnd.randint(1, 6 * max(block_size, window))
        blocks = rnd.sample(range(10_000), -(-seq_len // block_size) + rnd.randint(0, 2))  # spare blocks too
        tables, slots, wtables, wheads = blocks_fn([blocks], [seq_len], block_size, window)
        where = [(blocks[p // block_size], p % block_size) for p in range(seq_len)]
        last = slots[0][0]
        assert last == blocks[(seq_len - 1) // block_size] * block_size + (seq_len - 1) % block_size
        usage_last = last % block_size + 1  # what get_habana_paged_attn_buffers derives from the slot
        assert _attended(tables[0], None, usage_last, block_size) == where
        assert _attended(wtables[0], wheads[0], usage_last, block_size) == where[max(0, seq_len - window) :]
        assert all(head == 0 for head in wheads[0][1:])
        # the plan of any bucket that holds the prompt has room for its blocks and its window
        for target_seq in (seq_len, seq_len + rnd.randint(1, 3 * block_size)):
            _, num_blocks, num_window = shape_fn(1, target_seq, block_size, window)
            assert len(tables[0]) <= num_blocks and len(wtables[0]) <= num_window
    # the window bound is reached: a prompt whose window straddles the most blocks
    assert shape_fn(1, 64, 4, 6) == (1, 16, 3)
    assert len(blocks_fn([list(range(16))], [9], 4, 6)[2][0]) == 3  # positions 3..8: blocks 0, 1, 2
    # without a sliding window no window tables
    assert blocks_fn([[7, 8]], [5], 4, None)[2:] == ([], [])


def test_paged_lists_keep_ids_and_pad_to_the_plan(src):
    *_, lists = _runner_helpers(src)
    blocks, groups, usage, head = lists([[300, 301], [7]], [[301 * 4 + 2], [7 * 4]], [[1, 0], [3]], 6, 4, 99)
    assert blocks == [300, 301, 7, 99, 99, 99]  # ids kept, in row order, then the pad block
    assert groups == [0, 0, 1, -1, -1, -1]
    assert usage == [4, 3, 1, 1, 1, 1]  # full blocks, then each row's last slot + 1
    assert head == [1, 0, 3, 0, 0, 0]
    with pytest.raises(AssertionError):
        lists([[1, 2, 3]], [[12]], None, 2, 4, 99)


def test_index_gathers_rows_and_scatters_them_back(src):
    index = _runner_helpers(src)[2]
    gather, scatter = index([4, 9, 13], 16, 4)
    assert gather == [4, 9, 13, 4]
    assert scatter == [-1] * 4 + [0] + [-1] * 4 + [1] + [-1] * 3 + [2] + [-1] * 2
    assert [gather[scatter[t]] for t in (4, 9, 13)] == [4, 9, 13]


def test_merge_and_rotary_helpers(src):
    import torch

    merge, prepare = h.defs(
        src, MODEL, h.gaudi_fixes(), ["merge_fast_prefill_rows", "prepare_rotary_for_rows"], {"torch": torch}
    )
    hidden = torch.arange(12.0).view(6, 2)
    rows = -torch.arange(1.0, 7.0).view(3, 2)
    out = merge(hidden, rows, torch.tensor([-1, 2, -1, 0, -1, -1]))
    assert out.tolist() == [[0, 1], [-5, -6], [4, 5], [-1, -2], [8, 9], [10, 11]]

    class Rope(torch.nn.Module):
        def __init__(self, recompute):
            super().__init__()
            self.recompute_cos_sin, self.calls = recompute, []
            self.register_buffer("sin", torch.zeros(1), persistent=False)

        def prepare_cos_sin(self, positions):
            self.calls.append(positions.tolist())

    shared, recomputing, unprepared = Rope(False), Rope(True), Rope(False)
    del unprepared.sin
    layers = [
        torch.nn.ModuleDict({"rope": shared, "other": recomputing}),
        torch.nn.ModuleDict({"rope": shared}),
        torch.nn.ModuleDict({"rope": unprepared}),
    ]
    prepare(layers, torch.tensor([3, 7]))
    # the runner-prepared cache is re-pointed once; a module that recomputes, or has none, is left alone
    assert shared.calls == [[3, 7]] and recomputing.calls == [] and unprepared.calls == []


# ------------------------------------------------------------------ the runner, the adapter, the kernels
def _config(contiguous_pa):
    """Stand-in get_config(): the flags the paths run here read, at their defaults on Gaudi 2
    (vllm_gaudi/extension/features.py), contiguous PA as the test asks."""
    return types.SimpleNamespace(
        use_contiguous_pa=contiguous_pa,
        fp32_softmax=False,
        fused_block_softmax=False,
        fused_block_softmax_adjustment=False,
        per_token_kv_scaling_support=False,
    )


def _pow2(n):
    return 1 << max(0, n - 1).bit_length()


def _runner(src, fixes, contiguous_pa, num_blocks=NUM_BLOCKS, block_bucket=lambda n: -(-max(n, 1) // 8) * 8):
    """The runner's prompt-batch code on an object carrying what it reads. Decode buckets:
    batch sizes to a power of two, blocks by block_bucket; prompt buckets: sequence to a
    multiple of 8."""
    import collections
    import dataclasses
    import typing

    import torch
    from vllm.logger import init_logger
    from vllm.v1.attention.backend import AttentionMetadata

    base = {
        "torch": torch,
        "itertools": itertools,
        "collections": collections,
        "math": __import__("math"),
        "dataclass": dataclasses.dataclass,
        "field": dataclasses.field,
        "Optional": typing.Optional,
        "Callable": typing.Callable,
        "Any": typing.Any,
        "AttentionMetadata": AttentionMetadata,
        "async_h2d_copy": h._cpu_utils_stub(src).async_h2d_copy,
        "is_fake_hpu": lambda: True,
        "logger": init_logger(LOGGER),  # vLLM's logger, as vllm_gaudi's is on HPU: it has warning_once
    }
    base.update(h.defs_from_file(src, "vllm_gaudi/extension/utils.py", (), ["pad_list", "align_and_pad"], base))
    base.update(
        h.defs_from_file(src, "vllm_gaudi/attention/ops/hpu_paged_attn.py", (), ["HPUPagedAttentionMetadata"], base)
    )
    base.update(h.defs_from_file(src, "vllm_gaudi/attention/backends/hpu_attn.py", (), ["HPUAttentionMetadata"], base))
    base.update(h.defs_from_file(src, ATTN_V1, fixes, ["HPUAttentionMetadataV1"], base))
    names = [
        "_TYPE_CACHE",
        "empty_list",
        "BatchContents",
        "PrefillInputData",
        "flatten",
        "gather_list",
        "round_up",
        "subtuple",
        "custom_tuple_replace",
        "trim_attn_metadata",
        "fast_prefill_eligible",
        "fast_prefill_blocks",
        "fast_prefill_index",
        "fast_prefill_plan_shape",
        "fast_prefill_paged_lists",
    ]
    ns = dict(base, **h.defs_from_file(src, RUNNER, fixes, names, base))
    methods = h.defs_from_file(
        src,
        RUNNER,
        fixes,
        [
            "_form_prefill_batch",
            "_fast_prefill_enabled",
            "_attach_fast_prefill",
            "get_habana_paged_attn_buffers",
            "_bucketize_2d_prompt",
            "_bucketize_merged_prompt",
            "_make_attn_bias",
            "_get_prompt_bucketing_fn",
        ],
        ns,
        cls="HPUModelRunner",
    )
    processor = h.defs_from_file(
        src,
        RUNNER,
        fixes,
        ["_set_attn_bias", "_set_attn_bias_for_sliding_window", "_set_block_mapping", "process_metadata"],
        ns,
        cls="HPUAttentionMetadataProcessor",
    )
    adapter = h.defs_from_file(
        src,
        RUNNER,
        fixes,
        ["forward", "_reset_rotary_cos_sin"],
        dict(
            ns,
            LoraMask=None,
            _mark_unbacked_dim0=lambda t: None,
            set_forward_context=_set_forward_context,
            set_hpu_dp_metadata=lambda *a: contextlib.nullcontext(),
        ),
        cls="HpuModelAdapter",
    )
    runner = type("Runner", (), methods)()
    runner.__dict__.update(
        profiler=types.SimpleNamespace(enabled=False),
        attn_block_size=BLOCK,
        block_size=BLOCK,
        sliding_window=WINDOW,
        interleaved_sliding_window=True,
        _get_model_type=lambda: "gemma4",
        use_merged_prefill=False,
        max_prefill_batch_size=8,
        get_dp_padding=lambda n: 0,
        uses_mrope=False,
        logits_rounding=1,
        num_mamba_like_layers=0,
        device="cpu",
        pin_memory=False,
        use_contiguous_pa=contiguous_pa,
        bucketing_manager=types.SimpleNamespace(
            find_prompt_bucket=lambda bs, seq, ctx: (bs, -(-seq // 8) * 8, ctx),
            find_decode_bucket=lambda bs, blocks, seed_buckets=False: (_pow2(bs), 1, block_bucket(blocks)),
        ),
        _PAD_SLOT_ID=num_blocks * BLOCK,
        _PAD_BLOCK_ID=num_blocks,
        model_config=types.SimpleNamespace(dtype=torch.float64),
        dtype=torch.float64,
        cache_config=types.SimpleNamespace(kv_sharing_fast_prefill=True),
        shared_kv_cache_layers={"cross.0": "self.0"},
        kv_caches=[object()],
        parallel_config=types.SimpleNamespace(data_parallel_size=1),
    )
    proc = type("Processor", (), processor)()
    proc.__dict__.update(
        block_size=BLOCK,
        interleaved_sliding_window=True,
        sliding_window=WINDOW,
        prefill_use_fusedsdpa=True,
        use_window_sdpa=False,
        slice_size=1024,
        slice_thld=8192,
    )
    return ns, runner, proc, type("Adapter", (), adapter)


def _set_forward_context(attn_metadata, vllm_config, **kwargs):
    """Stand-in for vLLM's set_forward_context (which needs a whole VllmConfig): installs the metadata."""
    from vllm.forward_context import ForwardContext, override_forward_context

    return override_forward_context(ForwardContext(no_compile_layers={}, attn_metadata=attn_metadata, slot_mapping={}))


def adapter_forward(adapter_cls, proc, model, input_ids, positions, meta, dtype, rope=None):
    """HpuModelAdapter.forward (the patched file's) on an adapter holding the real metadata
    processor; `model` stands in for the model wrapper it calls (Gemma4ForConditionalGeneration)."""
    adapter = adapter_cls()
    adapter.__dict__.update(
        metadata_processor=proc,
        pooling_model=False,
        flatten_input=True,
        dtype=dtype,
        model=model,
        recompute_cos_sin=False,
        vllm_config=None,
        dummy_num_input_tokens=None,
        dummy_num_tokens_across_dp_cpu=None,
        _rotary_embed_module=rope,
        _rotary_prepare_cos_sin=rope.prepare_cos_sin if rope is not None else None,
    )
    return adapter.forward(input_ids=input_ids, positions=positions, attn_metadata=meta)


def _decode_attention(src, fixes, contiguous_pa):
    """The decode branch of HPUAttentionImpl.forward (the patched file's), with the flat paged
    attention and KV fetch of vllm_gaudi/extension (ops.flat_pa, VLLMKVCache), on CPU.
    Returns attend(meta, q [rows, heads, dim], k_cache, v_cache, sliding, scale) -> [rows, heads, dim]."""
    import math
    import typing

    import torch
    from vllm.v1.attention.backend import AttentionType

    config = _config(contiguous_pa)
    ns = {"torch": torch, "math": math, "get_config": lambda: config, "Optional": typing.Optional, "Any": typing.Any}
    ns.update(
        h.defs_from_file(
            src,
            "vllm_gaudi/extension/utils.py",
            (),
            ["get_kv_fetch_extra_args", "Matmul", "B2BMatmul", "VLLMKVCache"],
            ns,
        )
    )
    ops = types.SimpleNamespace(
        **h.defs_from_file(
            src,
            "vllm_gaudi/extension/ops.py",
            (),
            ["grouped_max", "b2b_impl", "batch2block", "block2batch", "matmul_shape", "pipelined_pa", "flat_pa"],
            ns,
        )
    )
    paged = h.defs_from_file(
        src,
        "vllm_gaudi/attention/ops/hpu_paged_attn.py",
        (),
        ["HPUPagedAttention"],
        dict(ns, ops=ops, cache_ops=None, AttentionMetadataBuilder=object),
    )
    impl_ns = dict(
        ns,
        ops=ops,
        AttentionType=AttentionType,
        AttentionLayer=typing.Any,
        HPUAttentionMetadata=typing.Any,
        **paged,
        **h.defs_from_file(src, ATTN_IMPL, fixes, ["_set_fetch_by_id"], ns),
    )
    methods = h.defs_from_file(
        src, ATTN_IMPL, fixes, ["forward", "common_attention_args"], impl_ns, cls="HPUAttentionImpl"
    )

    def attend(meta, q, k_cache, v_cache, sliding, scale):
        rows, heads, dim = q.shape
        impl = type("Impl", (), methods)()
        impl.__dict__.update(
            attn_type=AttentionType.DECODER,
            use_merged_prefill=False,
            num_heads=heads,
            num_kv_heads=k_cache.shape[1],
            head_size=dim,
            kv_sharing_target_layer_name="shared",
            sliding_window=WINDOW if sliding else None,
            is_chunked_attention=False,
            alibi_slopes=None,
            prev_attn=None,
            scale=scale,
            k_cache=ns["VLLMKVCache"](),
            v_cache=ns["VLLMKVCache"](is_v_cache=True),
            matmul_qk=ns["Matmul"](),
            matmul_av=ns["Matmul"](),
            batch2block_matmul=ns["B2BMatmul"](),
            block2batch_matmul=ns["B2BMatmul"](),
            fused_scaled_dot_product_attention=None,
            softmax=None,
            sinks=None,
        )
        zeros = torch.zeros(rows, k_cache.shape[1] * dim, dtype=q.dtype)  # a KV-shared layer writes no K/V
        out = impl.forward(None, q.reshape(rows, heads * dim), zeros, zeros, (k_cache, v_cache, None, None), meta)
        return out.view(rows, heads, dim)

    return attend


def _prompt_attention(meta, q, k_cache, v_cache, sliding, scale):
    """STAND-IN for the prompt branch (FusedSDPA, an HPU kernel): each token attends causally
    over the batch's own slots, within WINDOW on a sliding layer."""
    import torch

    group = q.shape[1] // k_cache.shape[1]
    out = torch.zeros_like(q)
    batch, seq = meta.slot_mapping.shape
    for t in range(batch * seq):
        b, s = divmod(t, seq)
        if s < int(meta.seq_lens_tensor[b]):
            keys = meta.slot_mapping[b, (max(0, s - WINDOW + 1) if sliding else 0) : s + 1].long()
            k = k_cache[keys].repeat_interleave(group, dim=1)
            v = v_cache[keys].repeat_interleave(group, dim=1)
            weights = torch.softmax(torch.einsum("hd,nhd->hn", q[t], k) * scale, -1)
            out[t] = torch.einsum("hn,nhd->hd", weights, v)
    return out


def _attention(decode):
    def attend(meta, q, k_cache, v_cache, sliding, scale=1.0):
        return (_prompt_attention if meta.is_prompt else decode)(meta, q, k_cache, v_cache, sliding, scale)

    return attend


def _toy_layers(cache, attend):
    """A two-stage toy with the KV-sharing shape of Gemma 4's YOCO split.

    The first stage writes K/V of every token to `cache` at the prompt slots (the KV-sharing
    targets); each second-stage layer (one full, one sliding) reads the cache through
    `attend`: a prompt batch the prompt branch, the fast-prefill rows the real decode branch.
    """
    import torch
    from vllm.forward_context import get_forward_context

    gen = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    emb, pos_emb, w_in, w_k, w_v = rnd(50, DIM), rnd(64, DIM), rnd(DIM, DIM), rnd(DIM, DIM), rnd(DIM, DIM)

    class First(torch.nn.Module):
        def forward(self, input_ids, positions, inputs_embeds=None, per_layer_inputs=None):
            meta = get_forward_context().attn_metadata
            x = torch.tanh(emb[input_ids.clamp(min=0)] @ w_in + pos_emb[positions.clamp(min=0)])
            slots = meta.slot_mapping.reshape(-1)
            ok = slots >= 0
            cache["k"][slots[ok]] = (x[ok] @ w_k).unsqueeze(1)
            cache["v"][slots[ok]] = (x[ok] @ w_v).unsqueeze(1)
            return x, torch.stack([x, -x], dim=1)  # per-layer inputs, [tokens, layers, dim]

    class Shared(torch.nn.Module):
        def __init__(self, index, sliding):
            super().__init__()
            self.index, self.sliding, self.w_q, self.w_o = index, sliding, rnd(DIM, DIM), rnd(DIM, DIM)

        def forward(self, positions, x, per_layer):
            q = (x @ self.w_q + pos_emb[positions.clamp(min=0)] + per_layer[:, self.index]).unsqueeze(1)
            out = attend(get_forward_context().attn_metadata, q, cache["k"], cache["v"], self.sliding)
            return x + torch.tanh(out.squeeze(1) @ self.w_o)

    class Second(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.decoder_layers = torch.nn.ModuleList([Shared(0, False), Shared(1, True)])

        def forward(self, positions, x, per_layer, **kwargs):
            for layer in self.decoder_layers:
                x = layer(positions, x, per_layer)
            return x

    return First(), Second()


def _gemma4_module(src, fixes, name="hpu_gemma4_under_test"):
    """models/gemma4.py (with `fixes` applied), imported on CPU."""
    code = h.compile_patched(h.file_text(src, MODEL, fixes), src, MODEL, fixes)
    module = types.ModuleType(name)
    exec(code, module.__dict__)
    return module


def _prompt_batch(ns, lens, context_lens=None, seed=1, num_blocks=NUM_BLOCKS, blocks=None):
    rnd = random.Random(seed)
    free = rnd.sample(range(num_blocks), min(num_blocks, 64))
    token_ids, all_blocks = [], []
    for i, (n, ctx) in enumerate(zip(lens, context_lens or [0] * len(lens))):
        all_blocks.append(list(blocks[i]) if blocks else [free.pop() for _ in range(-(-(ctx + n) // BLOCK))])
        token_ids.append([rnd.randrange(50) for _ in range(n)])
    return ns["BatchContents"](
        req_ids=[f"r{i}" for i in range(len(lens))],
        token_ids=token_ids,
        context_lens=list(context_lens or [0] * len(lens)),
        prompt_lens=list(lens),
        blocks=all_blocks,
        logits_positions=[[n - 1] for n in lens],
    )


def _run(src, fixes, lens, contiguous_pa=True, context_lens=None, num_blocks=NUM_BLOCKS):
    """(full path output, fast path output, logits rows, metadata the model saw) for one prompt batch,
    both through HpuModelAdapter.forward."""
    import torch
    from vllm.forward_context import get_forward_context

    ns, runner, proc, adapter_cls = _runner(src, fixes, contiguous_pa, num_blocks)
    model_cls = _gemma4_module(src, fixes).HpuGemma4Model
    attend = _attention(_decode_attention(src, fixes, contiguous_pa))
    outputs, seen = [], []
    for fast in (False, True):
        # a fresh batch for each forward, as each step builds one (processing edits it in place)
        batch = runner._form_prefill_batch(_prompt_batch(ns, lens, context_lens, num_blocks=num_blocks))
        meta = ns["trim_attn_metadata"](batch.attn_metadata[0])
        input_ids = batch.token_ids[0].long()  # [batch, seq], as the runner passes them
        positions = batch.position_ids[0].long()
        logits = batch.logits_indices[0].long()
        cache = {"k": torch.zeros((num_blocks + 1) * BLOCK, 1, DIM, dtype=torch.float64)}
        cache["v"] = cache["k"].clone()
        first, second = _toy_layers(cache, attend)
        model = model_cls.__new__(model_cls)
        torch.nn.Module.__init__(model)
        model.self_decoder, model.cross_decoder = first, second

        def wrapper(input_ids, positions, **kwargs):  # STAND-IN for the model wrapper's forward
            seen.append(get_forward_context().attn_metadata)
            if fast:
                return model.fast_prefill_forward(input_ids, positions)
            x, per_layer = first(input_ids, positions.reshape(-1))  # every token through every layer
            return second(positions.reshape(-1), x, per_layer)

        outputs.append(adapter_forward(adapter_cls, proc, wrapper, input_ids, positions, meta, torch.float64))
    return outputs[0], outputs[1], logits, seen[1]


@pytest.mark.parametrize("contiguous_pa", [True, False], ids=["contiguous-pa", "scattered-pa"])
@pytest.mark.parametrize("lens", [[7], [7, 3, 10], [1, 13, 6, 4, 9]], ids=["one", "three", "five"])
def test_fast_prefill_rows_equal_the_full_model(src, lens, contiguous_pa):
    import torch

    full, fast, logits, meta = _run(src, h.gaudi_fixes(), lens, contiguous_pa)
    assert meta.fast_prefill_metadata is not None and not meta.fast_prefill_metadata.is_prompt
    torch.testing.assert_close(fast[logits], full[logits], rtol=1e-12, atol=1e-12)
    # every other token keeps the first stage's output: the shared layers did not run on it
    others = torch.ones(full.shape[0], dtype=torch.bool)
    others[logits] = False
    assert not torch.allclose(fast[others], full[others])


def test_fast_prefill_rows_on_high_block_ids(src):
    """Prompts on blocks anywhere in a 4096-block cache under contiguous PA: the rows read their
    blocks by id (a contiguous-PA fetch would read blocks 0..n-1)."""
    import torch

    full, fast, logits, _ = _run(src, h.gaudi_fixes(), [7, 13, 5], True, num_blocks=4096)
    torch.testing.assert_close(fast[logits], full[logits], rtol=1e-12, atol=1e-12)


def test_the_sliding_window_is_the_prompt_window(src):
    """A prompt longer than the window, not block-aligned: the first block of its
    window starts before the window; the head mask keeps those slots out."""
    import torch

    full, fast, logits, meta = _run(src, h.gaudi_fixes(), [WINDOW + BLOCK + 3])
    head = meta.fast_prefill_metadata.window_block_head
    assert head is not None and int(head[0]) == (BLOCK + 3) % BLOCK
    torch.testing.assert_close(fast[logits], full[logits], rtol=1e-12, atol=1e-12)


def test_cached_context_takes_the_full_path(src):
    """A prompt with cached context (one: the processor's prompt path with context handles one
    prompt per batch, the recipe's cap) gets no plan."""
    import torch

    full, fast, logits, meta = _run(src, h.gaudi_fixes(), [6], context_lens=[8])
    assert meta.fast_prefill_metadata is None
    torch.testing.assert_close(fast, full, rtol=0, atol=0)


def test_upstream_fast_prefill_fails_on_hpu_metadata(src):
    """The symptom: without the fix, the model's fast prefill cannot read HPU metadata."""
    fixes = [f for f in h.gaudi_fixes() if f != FIX]
    with pytest.raises(AssertionError) as failure:
        _run(src, fixes, [7, 3])
    where = failure.traceback[-1]
    # vLLM's Gemma 4 fast_prefill_forward: `assert isinstance(attn_metadata, dict)`
    assert str(where.path).endswith("vllm/model_executor/models/gemma4.py")
    assert "isinstance(attn_metadata, dict)" in str(where.statement)


# ------------------------------------------------------------------ the plan's shapes
def _plan_shapes(src, fixes, placements, lens):
    """The shape of every tensor of the processed plan (what HpuModelAdapter.forward hands the
    model) for one prompt batch on the given physical blocks: a 4096-block cache, contiguous PA
    (the recipe's --no-enable-prefix-caching), power-of-two block buckets."""
    import torch
    from vllm.forward_context import get_forward_context

    ns, runner, proc, adapter_cls = _runner(src, fixes, True, 4096, block_bucket=_pow2)
    batch = runner._form_prefill_batch(_prompt_batch(ns, lens, num_blocks=4096, blocks=placements))
    meta = ns["trim_attn_metadata"](batch.attn_metadata[0])
    seen = []
    adapter_forward(
        adapter_cls,
        proc,
        lambda **kw: seen.append(get_forward_context().attn_metadata),
        batch.token_ids[0].long(),
        batch.position_ids[0].long(),
        meta,
        torch.float64,
    )
    plan = seen[0].fast_prefill_metadata
    shapes = {f: tuple(getattr(plan, f).shape) for f in plan._fields if torch.is_tensor(getattr(plan, f))}
    for f in ("fast_prefill_gather", "fast_prefill_scatter"):
        shapes[f] = tuple(getattr(seen[0], f).shape)
    return shapes


def test_plan_shapes_do_not_depend_on_where_the_blocks_are(src, caplog):
    """One 7-token prompt (bucket (1, 8), 2 blocks of 4) on blocks 0 (what warm-up's dummy
    prompts use, _prepare_dummy_scenario: block_id 0), 8, 300, 2000 and scattered: every tensor of
    the plan has the same shape, so the bucket's warm-up compiled it. Upstream's contiguous
    layout sized the block list by the highest id: 1, 16, 512, 2048."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    warm_up = _plan_shapes(src, h.gaudi_fixes(), [[0, 0]], [7])
    assert warm_up["block_list"] == (2,) and warm_up["window_block_list"] == (2,)
    # the debug line a Gaudi run reads the same shapes from (see fix.json "gaudi_checks")
    assert caplog.messages[-1] == (
        "fast prefill plan for prompt bucket (1, 8): 1 rows, block_list 2, window_block_list 2"
    )
    for blocks in ([8, 9], [300, 301], [2000, 2001], [4095, 17]):
        assert _plan_shapes(src, h.gaudi_fixes(), [blocks], [7]) == warm_up, f"prompt on blocks {blocks}"
    # a batch of 3 prompts in bucket (3, 16): a function of the bucket only
    many = _plan_shapes(src, h.gaudi_fixes(), [[1, 2, 3], [4000, 4001], [77]], [12, 5, 2])
    assert many == _plan_shapes(src, h.gaudi_fixes(), [[0, 0, 0], [0, 0], [0]], [12, 5, 2])
    assert many["block_list"] == (12,) and many["fast_prefill_gather"] == (3,)


# ------------------------------------------------------------------ merged prefill
@contextlib.contextmanager
def _hpu_is_the_cpu():
    """STAND-IN: no HPU here. The merged path sends its attention bias `.to('hpu')`; it stays on
    the CPU."""
    import torch

    to = torch.Tensor.to

    def on_cpu(self, *args, **kwargs):
        return to(self, *("cpu" if a == "hpu" else a for a in args), **kwargs)

    torch.Tensor.to = on_cpu
    try:
        yield
    finally:
        torch.Tensor.to = to


def _merged_prompt_batch(fixes, lens):
    """The runner's real _form_prefill_batch under VLLM_MERGED_PREFILL: the prompts become one
    sequence, bucket (1, sum of their tokens)."""
    ns, runner, _, _ = _runner(h.gaudi_src_or_skip(), fixes, True)
    runner.use_merged_prefill = True
    with _hpu_is_the_cpu():
        return runner._form_prefill_batch(_prompt_batch(ns, lens))


def test_merged_prefill_turns_fast_prefill_off_with_one_warning(src, caplog):
    """Left on, fast prefill crashed the engine core at the first merged batch of two prompts
    (`AssertionError: fast prefill: 5 blocks, the plan holds 4`: each prompt needs its own blocks,
    more than the plan's one-row bucket for the merged sequence holds)."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    for lens in ([9, 2, 3], [5, 5]):
        batch = _merged_prompt_batch(h.gaudi_fixes(), lens)
        meta = batch.attn_metadata[0]
        assert meta.fast_prefill_metadata is None and batch.token_ids[0].shape[0] == 1, "one merged sequence, no plan"
    warned = [r.getMessage() for r in caplog.records if "kv-sharing-fast-prefill" in r.getMessage()]
    assert warned == [
        "--kv-sharing-fast-prefill is off: VLLM_MERGED_PREFILL merges the prompts of a batch into one sequence, "
        "which the fast prefill plan does not cover; every layer runs on every prompt token"
    ]


# ------------------------------------------------------------------ vLLM's real Gemma 4 layers
class _HpuLikeAttention:
    """Stands in for a Gemma 4 layer's vLLM Attention module: a prompt batch writes K/V at its
    slots (KV-sharing targets only), then attends through _attention (the prompt branch's
    stand-in, or the real decode branch). KV-shared layers read their target's cache."""

    @staticmethod
    def make(attn, cache, attend):
        import torch
        from vllm.forward_context import get_forward_context

        target = attn.kv_sharing_target_layer_name or attn.layer_name
        heads, kv_heads, dim = attn.num_heads, attn.num_kv_heads, attn.head_size
        sliding, scale = attn.sliding_window is not None, attn.impl.scale

        class Attention(torch.nn.Module):
            def forward(self, q, k, v):
                meta = get_forward_context().attn_metadata
                q = q.view(-1, heads, dim)
                shape = ((NUM_BLOCKS + 1) * BLOCK, kv_heads, dim)
                k_cache, v_cache = cache.setdefault(
                    target, (torch.zeros(shape, dtype=q.dtype), torch.zeros(shape, dtype=q.dtype))
                )
                if meta.is_prompt and k is not None and attn.kv_sharing_target_layer_name is None:
                    slots = meta.slot_mapping.reshape(-1).long()
                    ok = slots >= 0
                    k_cache[slots[ok]] = k.view(-1, kv_heads, dim)[ok]
                    v_cache[slots[ok]] = v.view(-1, kv_heads, dim)[ok]
                return attend(meta, q, k_cache, v_cache, sliding, scale).reshape(-1, heads * dim)

        return Attention()


def _hpu_like_rope(rope):
    """Make a vLLM rotary module cache its rows the way HPURotaryEmbedding does: the adapter
    prepares cos/sin for the batch's positions once per forward (prepare_cos_sin), and forward
    then uses that cache, not the positions it is given, unless it was prepared with
    recompute_cos_sin. A cache for other rows fails, as HPU's kernel would."""
    native = rope.forward

    def prepare_cos_sin(self, positions, offsets=None, recompute_cos_sin=False):
        self.recompute_cos_sin = recompute_cos_sin
        self.register_buffer("sin", positions.reshape(-1).clone(), persistent=False)

    def forward(self, positions, query, key=None):
        if not hasattr(self, "sin") or self.recompute_cos_sin:
            self.prepare_cos_sin(positions, recompute_cos_sin=True)
        rows = query.reshape(query.shape[0], -1).shape[0]
        if self.sin.numel() != rows:
            raise RuntimeError(f"cos/sin prepared for {self.sin.numel()} positions, query has {rows} rows")
        return native(self.sin, query, key)

    rope.prepare_cos_sin = types.MethodType(prepare_cos_sin, rope)
    rope.forward = types.MethodType(forward, rope)


@pytest.fixture(scope="module")
def real_gemma4(src):
    """The tiny random Gemma 4 (4 layers, the last 2 KV-shared) built by vLLM 0.30.0 on CPU,
    turned into vllm-gaudi's HpuGemma4Model by the patched models/gemma4.py's own
    _apply_hpu_gemma4_patches, random weights, HPU-like attention in place of vLLM's."""
    import socket

    import torch
    import vllm.model_executor.models.gemma4 as upstream
    from vllm.config import CacheConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    from testkit import tiny_model

    cfg = VllmConfig(
        model_config=ModelConfig(
            model=str(tiny_model.ensure()), dtype="float32", max_model_len=256, enforce_eager=True
        ),
        cache_config=CacheConfig(kv_sharing_fast_prefill=True),
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    saved_run_layers = upstream._run_decoder_layers
    with set_current_vllm_config(cfg):
        init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo", distributed_init_method=f"tcp://127.0.0.1:{port}"
        )
        initialize_model_parallel(1, 1)
        model = upstream.Gemma4Model(vllm_config=cfg, prefix="model")
        _gemma4_module(src, h.gaudi_fixes(), "hpu_gemma4_real_layers")._apply_hpu_gemma4_patches(
            types.SimpleNamespace(model=model)
        )
        gen = torch.Generator().manual_seed(0)
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen) * 0.2
            param.data.copy_(1 + noise if name.endswith("norm.weight") else noise)
        process_weights_after_loading(model, cfg.model_config, torch.device("cpu"))  # what the loader does next
        cache = {}
        attend = _attention(_decode_attention(src, h.gaudi_fixes(), True))
        for layer in model.layers:
            layer.self_attn.attn = _HpuLikeAttention.make(layer.self_attn.attn, cache, attend)
        for rope in {id(layer.self_attn.rotary_emb): layer.self_attn.rotary_emb for layer in model.layers}.values():
            _hpu_like_rope(rope)
        yield cfg, model, cache
    upstream._run_decoder_layers = saved_run_layers


@pytest.mark.parametrize("lens", [[7], [7, 3, 10], [1, 13, 6, 4, 9]], ids=["one", "three", "five"])
def test_real_gemma4_layers_sample_the_same_rows(src, real_gemma4, lens):
    """The real Gemma 4 decoder layers (PLE, per-type RoPE with HPU's per-forward cos/sin
    cache, q-only KV-shared attention, double-wide MLPs) through HpuModelAdapter.forward and
    HpuGemma4Model: the fast path's sampled rows equal the full 4-layer path's, with the plan
    the real runner code builds."""
    import torch
    from vllm.config import set_current_vllm_config

    cfg, model, cache = real_gemma4
    assert type(model).__name__ == "HpuGemma4Model" and model.fast_prefill_enabled
    ns, runner, proc, adapter_cls = _runner(src, h.gaudi_fixes(), contiguous_pa=True)
    first_rope = model.layers[0].self_attn.rotary_emb  # the adapter's _rotary_embed_module

    def wrapper(input_ids, positions, **kwargs):  # STAND-IN for the model wrapper's forward
        return model(input_ids, positions, None)

    outputs = {}
    with set_current_vllm_config(cfg), torch.no_grad():
        for fast in (False, True):
            batch = runner._form_prefill_batch(_prompt_batch(ns, lens, seed=len(lens)))
            meta = ns["trim_attn_metadata"](batch.attn_metadata[0])
            # vLLM's CPU embedding and RoPE reject the -1 the runner pads with (HPU's kernels take it);
            # padding rows are never sampled
            input_ids = batch.token_ids[0].long().clamp(min=0)
            positions = batch.position_ids[0].long().clamp(min=0)
            logits = batch.logits_indices[0].long()
            cache.clear()
            model.fast_prefill_enabled = fast
            outputs[fast] = adapter_forward(
                adapter_cls, proc, wrapper, input_ids, positions, meta, torch.float32, rope=first_rope
            )
    model.fast_prefill_enabled = True
    torch.testing.assert_close(outputs[True][logits], outputs[False][logits], rtol=1e-4, atol=1e-5)
    assert outputs[False][logits].abs().max() > 0.1  # not a trivially small output
