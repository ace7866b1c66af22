"""Fix gemma4-fast-prefill (hpu_model_runner.py, v1/attention/backends/hpu_attn.py,
models/gemma4.py): --kv-sharing-fast-prefill on HPU.

Upstream, HpuGemma4Model runs vLLM's fast_prefill_forward, which asserts per-layer
dict metadata; the HPU runner passes one trimmed tuple and never builds the
fast-prefill metadata, so the flag fails. The fix: the runner gives a prompt batch
without cached context a plan (one decode-shaped row per prompt, its last token,
over the prompt's own blocks, with the exact sliding window), the adapter processes
it like decode metadata, and HpuGemma4Model.fast_prefill_forward runs the KV-shared
layers on those rows only and puts their output back on the sampled tokens.

CI part: the pure functions the fix adds, taken from its own fix.diff.
Checkout part (VLLM_GAUDI_SRC + vllm 0.30.0 importable): the real _form_prefill_batch,
_attach_fast_prefill, get_habana_paged_attn_buffers, trim_attn_metadata, the
metadata processor's decode path and HpuGemma4Model.fast_prefill_forward from the
patched files, driven by a toy two-stage model whose attention follows the HPU
backend's two branches (prompt: causal over the batch's own slots; decode: flat
paged attention over block_list / block_mapping / attn_bias). The sampled rows of
the fast path must equal every-token-every-layer. Then the same with vLLM 0.30.0's
real Gemma 4 decoder layers (the tiny random config, built on CPU) turned into
HpuGemma4Model by the patched file, with only the attention kernel emulated.
habana_frameworks is not needed for any of it; the HPU kernels themselves, HPU
graphs and warm-up are not run.
"""
import itertools
import os
import random
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gaudi_fixes_helpers as h  # noqa: E402
from gaudi_fixes_helpers import src  # noqa: E402,F401  (the checkout fixture)

FIX = "gemma4-fast-prefill"
RUNNER = "vllm_gaudi/v1/worker/hpu_model_runner.py"
ATTN_V1 = "vllm_gaudi/v1/attention/backends/hpu_attn.py"
MODEL = "vllm_gaudi/models/gemma4.py"


# ------------------------------------------------------------------ CI: pure functions
def _runner_helpers():
    return h.added_functions(FIX, RUNNER, "fast_prefill_eligible", "fast_prefill_blocks", "fast_prefill_index",
                             namespace={"Optional": __import__("typing").Optional})


def test_eligible_only_fresh_prompts_sampling_their_last_token():
    eligible, _, _ = _runner_helpers()
    assert eligible([5, 3], [0, 0], [[4], [2]])
    assert not eligible([5, 3], [0, 128], [[4], [2]])      # a prefix-cache hit or a later chunk
    assert not eligible([5], [0], [[]])                     # a partial chunk: nothing sampled
    assert not eligible([5], [0], [[3, 4]])                 # several logits rows
    assert not eligible([5], [0], [[3]])                    # a row that is not the last token
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
def test_blocks_cover_exactly_the_attended_positions(block_size, window):
    _, blocks_fn, _ = _runner_helpers()
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
        assert _attended(wtables[0], wheads[0], usage_last, block_size) == where[max(0, seq_len - window):]
        assert all(head == 0 for head in wheads[0][1:])
    # without a sliding window no window tables
    assert blocks_fn([[7, 8]], [5], 4, None)[2:] == ([], [])


def test_index_gathers_rows_and_scatters_them_back():
    _, _, index = _runner_helpers()
    gather, scatter = index([4, 9, 13], 16, 4)
    assert gather == [4, 9, 13, 4]
    assert scatter == [-1] * 4 + [0] + [-1] * 4 + [1] + [-1] * 3 + [2] + [-1] * 2
    assert [gather[scatter[t]] for t in (4, 9, 13)] == [4, 9, 13]


def test_merge_and_rotary_helpers():
    torch = pytest.importorskip("torch")
    merge, prepare = h.added_functions(FIX, MODEL, "merge_fast_prefill_rows", "prepare_rotary_for_rows",
                                       namespace={"torch": torch})
    hidden = torch.arange(12.).view(6, 2)
    rows = -torch.arange(1., 7.).view(3, 2)
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
    layers = [torch.nn.ModuleDict({"rope": shared, "other": recomputing}), torch.nn.ModuleDict({"rope": shared}),
              torch.nn.ModuleDict({"rope": unprepared})]
    prepare(layers, torch.tensor([3, 7]))
    # the runner-prepared cache is re-pointed once; a module that recomputes, or has none, is left alone
    assert shared.calls == [[3, 7]] and recomputing.calls == [] and unprepared.calls == []


def test_call_sites():
    runner = h.added(FIX, RUNNER)
    assert "self._attach_fast_prefill(attn_metadata, *fast_prefill_blocks_in, logits_rows, target_bs * target_seq)" \
        in runner
    assert "fast_prefill = self.metadata_processor.process_metadata(fast_prefill," in runner
    assert "'fast_prefill_gather', 'fast_prefill_scatter'" in runner
    assert "mask = mask | (offsets < window_head.unsqueeze(-1))" in runner
    assert "fast_prefill_metadata: Optional[\"HPUAttentionMetadataV1\"] = None" in h.added(FIX, ATTN_V1)


# ------------------------------------------------------------------ checkout: the real code on a toy model
BLOCK, WINDOW, DIM, NUM_BLOCKS = 4, 6, 8, 40


class _Bucketing:
    """Decode buckets: batch sizes rounded up to a power of two, blocks to a multiple of 8."""

    def find_decode_bucket(self, batch_size, num_blocks, seed_buckets=False):
        return (1 << max(0, batch_size - 1).bit_length(), 1, -(-max(num_blocks, 1) // 8) * 8)


def _runner(src, fixes, contiguous_pa):
    import collections
    import dataclasses
    import types
    import typing

    import torch
    from vllm.v1.attention.backend import AttentionMetadata

    base = {"torch": torch, "itertools": itertools, "collections": collections, "math": __import__("math"),
            "dataclass": dataclasses.dataclass, "field": dataclasses.field, "Optional": typing.Optional,
            "Callable": typing.Callable, "Any": typing.Any, "AttentionMetadata": AttentionMetadata,
            "async_h2d_copy": h._cpu_utils_stub(src).async_h2d_copy, "is_fake_hpu": lambda: True}
    base.update(h.defs_from_file(src, "vllm_gaudi/extension/utils.py", (), ["pad_list", "align_and_pad"], base))
    base.update(h.defs_from_file(src, "vllm_gaudi/attention/ops/hpu_paged_attn.py", (),
                                 ["HPUPagedAttentionMetadata"], base))
    base.update(h.defs_from_file(src, "vllm_gaudi/attention/backends/hpu_attn.py", (), ["HPUAttentionMetadata"],
                                 base))
    base.update(h.defs_from_file(src, ATTN_V1, fixes, ["HPUAttentionMetadataV1"], base))
    names = ["_TYPE_CACHE", "empty_list", "BatchContents", "PrefillInputData", "flatten", "gather_list", "round_up",
             "subtuple", "custom_tuple_replace", "trim_attn_metadata", "fast_prefill_eligible", "fast_prefill_blocks",
             "fast_prefill_index"]
    ns = dict(base, **h.defs_from_file(src, RUNNER, fixes, names, base))
    methods = h.defs_from_file(src, RUNNER, fixes, ["_form_prefill_batch", "_fast_prefill_enabled",
                                                    "_attach_fast_prefill", "get_habana_paged_attn_buffers",
                                                    "_bucketize_2d_prompt", "_get_prompt_bucketing_fn"],
                               ns, cls="HPUModelRunner")
    processor = h.defs_from_file(src, RUNNER, fixes, ["_set_block_mapping", "process_metadata"], ns,
                                 cls="HPUAttentionMetadataProcessor")
    runner = type("Runner", (), methods)()
    runner.__dict__.update(
        profiler=types.SimpleNamespace(enabled=False), attn_block_size=BLOCK, block_size=BLOCK,
        sliding_window=WINDOW, interleaved_sliding_window=True, _get_model_type=lambda: "gemma4",
        use_merged_prefill=False, max_prefill_batch_size=8, get_dp_padding=lambda n: 0, uses_mrope=False,
        logits_rounding=1, num_mamba_like_layers=0, device="cpu", pin_memory=False, use_contiguous_pa=contiguous_pa,
        bucketing_manager=types.SimpleNamespace(find_prompt_bucket=lambda bs, seq, ctx: (bs, -(-seq // 8) * 8, ctx),
                                                find_decode_bucket=_Bucketing().find_decode_bucket),
        _PAD_SLOT_ID=NUM_BLOCKS * BLOCK, _PAD_BLOCK_ID=NUM_BLOCKS, model_config=types.SimpleNamespace(
            dtype=torch.float64), cache_config=types.SimpleNamespace(kv_sharing_fast_prefill=True),
        shared_kv_cache_layers={"cross.0": "self.0"}, kv_caches=[object()],
        parallel_config=types.SimpleNamespace(data_parallel_size=1))
    proc = type("Processor", (), processor)()
    proc.__dict__.update(block_size=BLOCK, interleaved_sliding_window=True, sliding_window=WINDOW)
    return ns, runner, proc


def _hpu_attention(meta, q, k_cache, v_cache, sliding, scale=1.0):
    """What HPUAttentionImpl computes, in plain torch (its kernels need a Gaudi).

    q: [tokens, heads, dim]; caches: [slots, kv heads, dim], already holding the
    batch's K/V. A prompt batch attends causally over the batch's own slots
    (within WINDOW on a sliding layer); a decode-shaped batch does flat paged
    attention over block_list / block_mapping / attn_bias (window_* when sliding).
    """
    import torch

    group = q.shape[1] // k_cache.shape[1]

    def attend(query, keys, values, bias=None):
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", query, keys) * scale
        if bias is not None:
            scores = scores + bias.to(scores.dtype)
        return torch.einsum("hn,nhd->hd", torch.softmax(scores, -1), values)

    out = torch.zeros_like(q)
    if meta.is_prompt:
        batch, seq = meta.slot_mapping.shape
        for t in range(batch * seq):
            b, s = divmod(t, seq)
            if s < int(meta.seq_lens_tensor[b]):
                keys = meta.slot_mapping[b, (max(0, s - WINDOW + 1) if sliding else 0):s + 1].long()
                out[t] = attend(q[t], k_cache[keys], v_cache[keys])
        return out
    blocks, mapping, bias = ((meta.window_block_list, meta.window_block_mapping, meta.window_attn_bias)
                             if sliding else (meta.block_list, meta.block_mapping, meta.attn_bias))
    slots = (blocks.clamp(min=0).unsqueeze(-1) * BLOCK + torch.arange(BLOCK)).long()  # [blocks, BLOCK]
    for row in range(q.shape[0]):
        mine = mapping[:, row] > 0
        if mine.any():
            flat = slots[mine].reshape(-1)
            out[row] = attend(q[row], k_cache[flat], v_cache[flat], bias[mine].reshape(-1))
    return out


def _toy_layers(cache):
    """A two-stage toy with the KV-sharing shape of Gemma 4's YOCO split.

    The first stage writes K/V of every token to `cache` at the prompt slots (the
    KV-sharing targets); each second-stage layer (one full, one sliding) reads
    the cache like the HPU attention backend: a prompt batch attends causally over
    the batch's own slots, a decode-shaped batch does flat paged attention over
    block_list / block_mapping / attn_bias (window_* for the sliding layer).
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
            out = _hpu_attention(get_forward_context().attn_metadata, q, cache["k"], cache["v"], self.sliding)
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


def _gemma4_model_class(src, fixes):
    """HpuGemma4Model from models/gemma4.py (with `fixes` applied), imported on CPU."""
    import types
    code = compile(h.file_text(src, MODEL, fixes), os.path.join(src, MODEL), "exec")
    module = types.ModuleType("hpu_gemma4_under_test")
    exec(code, module.__dict__)
    return module.HpuGemma4Model


def _prompt_batch(ns, lens, context_lens=None, seed=1):
    rnd = random.Random(seed)
    free = rnd.sample(range(NUM_BLOCKS), NUM_BLOCKS)
    blocks, token_ids = [], []
    for n, ctx in zip(lens, context_lens or [0] * len(lens)):
        blocks.append([free.pop() for _ in range(-(-(ctx + n) // BLOCK))])
        token_ids.append([rnd.randrange(50) for _ in range(n)])
    return ns["BatchContents"](req_ids=[f"r{i}" for i in range(len(lens))], token_ids=token_ids,
                               context_lens=list(context_lens or [0] * len(lens)), prompt_lens=list(lens),
                               blocks=blocks, logits_positions=[[n - 1] for n in lens])


def _run(src, fixes, lens, contiguous_pa=True, context_lens=None):
    """(full path output, fast path output, logits rows, trimmed metadata) for one prompt batch."""
    import torch
    from vllm.forward_context import ForwardContext, override_forward_context

    ns, runner, proc = _runner(src, fixes, contiguous_pa)
    batch = runner._form_prefill_batch(_prompt_batch(ns, lens, context_lens))
    meta = ns["trim_attn_metadata"](batch.attn_metadata[0])
    if getattr(meta, "fast_prefill_metadata", None) is not None:
        # what the patched HpuModelAdapter.forward does with it
        rows = proc.process_metadata(meta.fast_prefill_metadata, meta.fast_prefill_gather.size(0), 1, "cpu",
                                     torch.float64)
        meta = ns["custom_tuple_replace"](meta, "TrimmedAttentionMetadata", fast_prefill_metadata=rows)
    input_ids = batch.token_ids[0].reshape(-1).long()  # flatten_input: Gemma 4 runs on [tokens]
    positions = batch.position_ids[0].long()           # [batch, seq], as the adapter passes them
    logits = batch.logits_indices[0].long()
    model_cls = _gemma4_model_class(src, fixes)
    outputs = []
    for fast in (False, True):
        cache = {"k": torch.zeros((NUM_BLOCKS + 1) * BLOCK, 1, DIM, dtype=torch.float64)}
        cache["v"] = cache["k"].clone()
        first, second = _toy_layers(cache)
        model = model_cls.__new__(model_cls)
        torch.nn.Module.__init__(model)
        model.self_decoder, model.cross_decoder = first, second
        with override_forward_context(ForwardContext(no_compile_layers={}, attn_metadata=meta, slot_mapping={})):
            if fast:
                outputs.append(model.fast_prefill_forward(input_ids, positions))
            else:  # every token through every layer: the path without --kv-sharing-fast-prefill
                x, per_layer = first(input_ids, positions.reshape(-1))
                outputs.append(second(positions.reshape(-1), x, per_layer))
    return outputs[0], outputs[1], logits, meta


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


def test_the_sliding_window_is_the_prompt_window(src):
    """A prompt longer than the window, not block-aligned: the first block of its
    window starts before the window; the head mask keeps those slots out."""
    import torch
    full, fast, logits, meta = _run(src, h.gaudi_fixes(), [WINDOW + BLOCK + 3])
    head = meta.fast_prefill_metadata.window_block_head
    assert head is not None and int(head[0]) == (BLOCK + 3) % BLOCK
    torch.testing.assert_close(fast[logits], full[logits], rtol=1e-12, atol=1e-12)


def test_cached_context_takes_the_full_path(src):
    import torch
    full, fast, logits, meta = _run(src, h.gaudi_fixes(), [5, 6], context_lens=[0, 8])
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


# ------------------------------------------------------------------ checkout: real Gemma 4 layers
class _HpuLikeAttention:
    """Stands in for a Gemma 4 layer's vLLM Attention module: a prompt batch writes K/V at
    its slots (KV-sharing targets only), then both branches are _hpu_attention's.
    KV-shared layers read their target's cache."""

    @staticmethod
    def make(attn, cache):
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
                k_cache, v_cache = cache.setdefault(target, (torch.zeros(shape, dtype=q.dtype),
                                                             torch.zeros(shape, dtype=q.dtype)))
                if meta.is_prompt and k is not None and attn.kv_sharing_target_layer_name is None:
                    slots = meta.slot_mapping.reshape(-1).long()
                    ok = slots >= 0
                    k_cache[slots[ok]] = k.view(-1, kv_heads, dim)[ok]
                    v_cache[slots[ok]] = v.view(-1, kv_heads, dim)[ok]
                return _hpu_attention(meta, q, k_cache, v_cache, sliding, scale).reshape(-1, heads * dim)

        return Attention()


def _hpu_like_rope(rope):
    """Make a vLLM rotary module cache its rows the way HPURotaryEmbedding does: the model
    runner prepares cos/sin for the batch's positions once per forward (prepare_cos_sin),
    and forward then uses that cache, not the positions it is given, unless it was
    prepared with recompute_cos_sin. A cache for other rows fails, as HPU's kernel would."""
    import types

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
    import types

    import torch
    import vllm.model_executor.models.gemma4 as upstream
    from vllm.config import CacheConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from gemma4_images import tiny_model

    cfg = VllmConfig(model_config=ModelConfig(model=str(tiny_model.ensure()), dtype="float32", max_model_len=256,
                                              enforce_eager=True),
                     cache_config=CacheConfig(kv_sharing_fast_prefill=True))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    saved_run_layers = upstream._run_decoder_layers
    with set_current_vllm_config(cfg):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(1, 1)
        model = upstream.Gemma4Model(vllm_config=cfg, prefix="model")
        code = compile(h.file_text(src, MODEL, h.gaudi_fixes()), os.path.join(src, MODEL), "exec")
        module = types.ModuleType("hpu_gemma4_real_layers")
        exec(code, module.__dict__)
        module._apply_hpu_gemma4_patches(types.SimpleNamespace(model=model))
        gen = torch.Generator().manual_seed(0)
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen) * 0.2
            param.data.copy_(1 + noise if name.endswith("norm.weight") else noise)
        process_weights_after_loading(model, cfg.model_config, torch.device("cpu"))  # what the loader does next
        cache = {}
        for layer in model.layers:
            layer.self_attn.attn = _HpuLikeAttention.make(layer.self_attn.attn, cache)
        for rope in {id(layer.self_attn.rotary_emb): layer.self_attn.rotary_emb for layer in model.layers}.values():
            _hpu_like_rope(rope)
        yield cfg, model, cache
    upstream._run_decoder_layers = saved_run_layers


@pytest.mark.parametrize("lens", [[7], [7, 3, 10], [1, 13, 6, 4, 9]], ids=["one", "three", "five"])
def test_real_gemma4_layers_sample_the_same_rows(src, real_gemma4, lens):
    """The real Gemma 4 decoder layers (PLE, per-type RoPE with HPU's per-forward cos/sin
    cache, q-only KV-shared attention, double-wide MLPs) through HpuGemma4Model: the fast
    path's sampled rows equal the full 4-layer path's, with the plan the real runner code
    builds."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import ForwardContext, override_forward_context

    cfg, model, cache = real_gemma4
    assert type(model).__name__ == "HpuGemma4Model" and model.fast_prefill_enabled
    ns, runner, proc = _runner(src, h.gaudi_fixes(), contiguous_pa=True)
    batch = runner._form_prefill_batch(_prompt_batch(ns, lens, seed=len(lens)))
    meta = ns["trim_attn_metadata"](batch.attn_metadata[0])
    rows = proc.process_metadata(meta.fast_prefill_metadata, meta.fast_prefill_gather.size(0), 1, "cpu",
                                 torch.float32)
    meta = ns["custom_tuple_replace"](meta, "TrimmedAttentionMetadata", fast_prefill_metadata=rows)
    # vLLM's CPU embedding and RoPE reject the -1 the runner pads with (HPU's kernels take it);
    # padding rows are never sampled
    input_ids = batch.token_ids[0].reshape(-1).long().clamp(min=0)
    positions = batch.position_ids[0].long().clamp(min=0)
    logits = batch.logits_indices[0].long()
    outputs = {}
    with set_current_vllm_config(cfg), torch.no_grad():
        for fast in (False, True):
            cache.clear()
            model.fast_prefill_enabled = fast
            with override_forward_context(ForwardContext(no_compile_layers={}, attn_metadata=meta, slot_mapping={})):
                # HpuModelAdapter.forward: the first rotary module's cache, for every token of the batch
                first_rope = model.layers[0].self_attn.rotary_emb
                first_rope.prepare_cos_sin(positions, recompute_cos_sin=False)
                try:
                    outputs[fast] = model(input_ids, positions, None)
                finally:
                    del first_rope.sin
    model.fast_prefill_enabled = True
    torch.testing.assert_close(outputs[True][logits], outputs[False][logits], rtol=1e-4, atol=1e-5)
    assert outputs[False][logits].abs().max() > 0.1  # not a trivially small output
