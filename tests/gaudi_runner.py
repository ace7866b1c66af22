"""The HPU model runner's own step on CPU: vllm-gaudi's real execute_model, _update_states,
sample_tokens (with _ensure_decodes_first, _get_prompts_and_decodes, _run_sampling,
apply_grammar_bitmask, _build_logprobs_output) and InputBatch, compiled from a checkout
with the pack's fixes applied (or without them), driven by vLLM 0.30.0's real
SchedulerOutput, Sampler and logits processors.

STAND-INS, each because the real one needs a Gaudi, and none of them decides anything
the fixes change:
- the model (`_prepare_inputs`, `_execute_model_generic`): each prompt is its own prefill
  batch (the recipe's prompt batch cap 1: `_can_merge_prefill_contents` is False, no data
  parallel padding), whose logits rows are the ones the runner's real
  `_extract_prefill_batch_contents` asks for (a chunk that does not finish its prompt gets
  one under async scheduling or structured output, else none); the decodes are one batch
  padded to a power of two by repeating the first decode (what a decode bucket does); each
  row's logits are `logits_of(req_id)` from the test;
- `htorch.core.mark_step` is a no-op, the profiler is off, and KV transfer, LoRA and
  multimodal inputs are absent;
- `vllm_gaudi.utils` is the checkout's own async_h2d_* on CPU (gaudi_fixes_helpers);
- the sampler is vLLM's Sampler with TopKTopPSampler.forward = forward_native: what vLLM
  picks on a platform that is neither CUDA, CPU, XPU nor ROCm, i.e. on HPU
  (vllm/v1/sample/ops/topk_topp_sampler.py, TopKTopPSampler.__init__); on this CPU it
  would pick forward_cpu. A recorder keeps each call's SamplingMetadata and logits.
- torch.tensor(pin_memory=True) drops pin_memory (no accelerator here), and torch.hpu's
  streams and events (the async output copy) do nothing: the tensors are on the CPU already.
"""

import contextlib
import dataclasses
import itertools
import os
import sys
import types
import typing

from tests import gaudi_fixes_helpers as h

RUNNER = "vllm_gaudi/v1/worker/hpu_model_runner.py"
PATCHES = "vllm_gaudi/patches.py"
RUNNER_METHODS = [
    "execute_model",
    "run_defragmenter",
    "_update_states",
    "sample_tokens",
    "_ensure_decodes_first",
    "_extract_prefill_batch_contents",
    "_get_attention_group_id_for_hybrid",
    "_resolve_block",
    "_is_prompt",
    "is_decoder_only",
    "_get_prompts_and_decodes",
    "_generate_req_id_output_token_ids_lst",
    "_prepare_sampling",
    "_run_sampling",
    "apply_grammar_bitmask",
    "_build_logprobs_output",
    "_get_prompt_logprobs_dict",
    "_gather_prompt_logprobs_hpu",
]
RUNNER_FUNCTIONS = [
    "empty_list",
    "BatchContents",
    "PromptDecodeInfo",
    "PrefillInputData",
    "DecodeInputData",
    "Mergeable",
    "shallow_tuple",
    "flatten",
    "ensure_multi_token_decodes_last",
    "structured_output_row_owners",
    "grammar_bitmask_rows",
    "round_up",
    "AsyncHPUModelRunnerOutput",
]


def cpu_torch():
    """torch, but torch.tensor(pin_memory=True) works without an accelerator."""
    import torch

    class CpuTorch(types.ModuleType):
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def tensor(*args, pin_memory=False, **kwargs):
            return torch.tensor(*args, **kwargs)

    class Event:
        def record(self):
            pass

        def synchronize(self):
            pass

    class Stream:
        def wait_stream(self, other):
            pass

    cpu = CpuTorch("torch")
    cpu.hpu = types.SimpleNamespace(
        Event=Event, Stream=Stream, current_stream=Stream, stream=lambda s: contextlib.nullcontext()
    )
    return cpu


def processors(max_num_seqs=4):
    """vLLM 0.30.0's built-in logits processors, as build_logitsprocs makes them for a sampling model."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.logits_processor.builtin import (
        LogitBiasLogitsProcessor,
        MinPLogitsProcessor,
        MinTokensLogitsProcessor,
    )

    config = types.SimpleNamespace(scheduler_config=types.SimpleNamespace(max_num_seqs=max_num_seqs))
    return LogitsProcessors(
        [
            MinPLogitsProcessor(config, "cpu", False),
            LogitBiasLogitsProcessor(config, "cpu", False),
            MinTokensLogitsProcessor(config, "cpu", False),
        ]
    )


def load_patches_module(src, fixes):
    """vllm_gaudi/patches.py of the checkout with `fixes` applied, executed as a module (it
    imports only torch and vLLM at the top)."""
    module = types.ModuleType("vllm_gaudi.patches")
    module.__file__ = os.path.join(src, PATCHES)
    exec(h.compile_patched(h.file_text(src, PATCHES, fixes), src, PATCHES, fixes), module.__dict__)
    return module


def native_sampler():
    from vllm.v1.sample.sampler import Sampler

    sampler = Sampler()
    sampler.topk_topp_sampler.forward = sampler.topk_topp_sampler.forward_native  # what HPU gets (see above)
    return sampler


class _Rows:
    """Stand-in attention metadata: which request each logits row of a batch belongs to."""

    def __init__(self, req_ids):
        self.req_ids = list(req_ids)


class Runner:
    """HPUModelRunner's methods (RUNNER_METHODS, compiled from the checkout) on a CPU object."""

    def __init__(self, input_batch, logits_of, vocab_size, async_scheduling=False, speculative=False):
        self.input_batch, self.logits_of, self.vocab_size = input_batch, logits_of, vocab_size
        self.requests, self.encoder_cache, self._compact_gdn_group_ids = {}, {}, []
        self.uses_mrope, self.is_pooling_model, self.device = False, False, "cpu"
        self.use_async_scheduling = async_scheduling
        self.use_structured_output = False  # sample_tokens sets it each step, after _prepare_inputs
        self.async_output_copy_stream = self._ns["torch"].hpu.Stream()
        self.attn_block_size, self.num_mamba_like_layers = 16, 0  # h.make_batch's block size; no mamba
        self.speculative_config = object() if speculative else None
        self.vllm_config = types.SimpleNamespace(speculative_config=self.speculative_config)
        self.kv_caches, self.max_model_len = [], 64
        self.use_aux_hidden_state_outputs = self.is_driver_worker = False
        self.profiler = types.SimpleNamespace(
            enabled=False,
            record_event=lambda *a: contextlib.nullcontext(),
            start=lambda *a: None,
            end=lambda *a: None,
            get_timestamp_us=lambda: 0,
        )
        self.sampler_calls = []
        sampler = native_sampler()

        def record(logits, sampling_metadata):
            self.sampler_calls.append((logits.clone(), sampling_metadata))
            return sampler(logits=logits, sampling_metadata=sampling_metadata)

        self.sampler = record
        self.scheduler_output = None

    # ---- stand-ins (see the module docstring)
    def maybe_setup_kv_connector(self, scheduler_output):
        pass

    def maybe_wait_for_kv_save(self):
        pass

    def get_finished_kv_transfers(self, scheduler_output):
        return set(), set()

    def _get_model_mm_inputs(self, *args, **kwargs):
        return None, None

    def _configure_lora(self, *args, **kwargs):
        return None, None

    def _can_merge_prefill_contents(self, lhs, rhs):
        return False

    def get_dp_padding(self, num_batches):
        return 0

    def _prepare_inputs(self, scheduler_output, num_prefills, num_decodes, warmup_mode):
        import torch

        ns = self._ns
        ids = self.input_batch.req_ids
        decode = None
        if num_decodes:
            rows = ids[:num_decodes]
            bucket = 1 << (num_decodes - 1).bit_length()
            padded = rows + [rows[0]] * (bucket - num_decodes)
            decode = ns["DecodeInputData"](
                num_decodes=num_decodes,
                token_ids=torch.zeros(bucket, 1, dtype=torch.long),
                position_ids=torch.zeros(bucket, 1, dtype=torch.long),
                attn_metadata=_Rows(padded),
                logits_indices=torch.arange(bucket),
            )
        prefill = ns["PrefillInputData"]()
        scheduled_tokens = [scheduler_output.num_scheduled_tokens[r] for r in ids]
        contents, _ = self._extract_prefill_batch_contents(num_prefills, num_decodes, scheduled_tokens, warmup_mode)
        for content in contents:
            if not content.req_ids:
                continue
            (req_id,), (positions,) = content.req_ids, content.logits_positions
            scheduled = scheduler_output.num_scheduled_tokens[req_id]
            logits_requests = [req_id] * len(positions)
            prefill.request_ids.append([req_id])
            prefill.prompt_lens.append([scheduled])
            prefill.token_ids.append(torch.zeros(1, scheduled, dtype=torch.long))
            prefill.position_ids.append(torch.zeros(1, scheduled, dtype=torch.long))
            prefill.attn_metadata.append(_Rows(logits_requests))
            prefill.logits_indices.append(torch.arange(len(logits_requests)))
            prefill.logits_requests.append(logits_requests)
        return (prefill, None), (decode, None)

    def _execute_model_generic(
        self,
        token_ids,
        position_ids,
        attn_metadata,
        logits_indices,
        kv_caches,
        lora_logits_mask,
        lora_mask,
        inputs_embeds=None,
        model_mm_kwargs=None,
        warmup_mode=False,
    ):
        import torch

        rows = attn_metadata.req_ids
        logits = torch.stack([self.logits_of(r).float() for r in rows]) if rows else torch.zeros(0, self.vocab_size)
        hidden = torch.zeros(len(rows), 1)
        return hidden, None, hidden, logits


def runner_class(src, fixes, batch_module, patches_module=None):
    """A Runner subclass carrying the real methods of HPUModelRunner (checkout + `fixes`)."""
    import numpy as np
    from vllm.sampling_params import SamplingType
    from vllm.v1.core.sched.output import GrammarOutput
    from vllm.v1.outputs import (
        EMPTY_MODEL_RUNNER_OUTPUT,
        AsyncModelRunnerOutput,
        KVConnectorOutput,
        LogprobsLists,
        LogprobsTensors,
        ModelRunnerOutput,
    )
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    xgr_cpu = __import__("xgrammar.kernels.apply_token_bitmask_inplace_cpu", fromlist=["_"])

    ns = {
        "torch": cpu_torch(),
        "np": np,
        "htorch": types.SimpleNamespace(core=types.SimpleNamespace(mark_step=lambda: None)),
        "SamplingType": SamplingType,
        "CachedRequestState": batch_module.CachedRequestState,
        "InputBatch": batch_module.InputBatch,
        "get_pp_group": lambda: types.SimpleNamespace(is_last_rank=True),
        "EMPTY_MODEL_RUNNER_OUTPUT": EMPTY_MODEL_RUNNER_OUTPUT,
        "has_kv_transfer_group": lambda: False,
        "set_forward_context": lambda *a, **k: contextlib.nullcontext(),
        "LMCacheConnectorMetadata": None,
        "ModelRunnerOutput": ModelRunnerOutput,
        "KVConnectorOutput": KVConnectorOutput,
        "AsyncModelRunnerOutput": AsyncModelRunnerOutput,
        "SamplingMetadata": SamplingMetadata,
        "LogprobsTensors": LogprobsTensors,
        "LogprobsLists": LogprobsLists,
        "GrammarOutput": GrammarOutput,
        "SpecDecodeMetadata": SpecDecodeMetadata,
        "xgr_cpu": xgr_cpu,
        "itertools": itertools,
        "dataclass": dataclasses.dataclass,
        "field": dataclasses.field,
        "fields": dataclasses.fields,
        "cast": typing.cast,
        "Optional": typing.Optional,
        "Union": typing.Union,
        "TypeAlias": typing.TypeAlias,
        "Callable": typing.Callable,
        "Mapping": typing.Mapping,
        "logger": __import__("logging").getLogger("hpu_model_runner_under_test"),
        "HPUAttentionMetadataV1": typing.Any,
    }  # only an annotation of DecodeInputData here
    ns.update(h.defs_from_file(src, RUNNER, fixes, RUNNER_FUNCTIONS, ns))
    methods = h.defs_from_file(src, RUNNER, fixes, RUNNER_METHODS, ns, cls="HPUModelRunner")
    missing = set(RUNNER_METHODS) - set(methods)
    assert not missing, f"hpu_model_runner.py lacks {missing}"
    cls = type("RunnerUnderTest", (Runner,), dict(methods, _ns=ns, _patches=patches_module))
    return cls


class Engine:
    """A scheduler stand-in that writes vLLM's real SchedulerOutput for each step and runs
    the runner's execute_model, then sample_tokens unless execute_model returned."""

    def __init__(
        self,
        src,
        fixes,
        logits_of,
        vocab_size=32,
        max_num_reqs=4,
        async_scheduling=False,
        speculative=False,
        logitsprocs=None,
    ):
        """logitsprocs: the batch's processors (default: processors(max_num_reqs), as the runner's
        own batch has them)."""
        self.batch_module = h.load_input_batch(src, fixes)
        self.patches = load_patches_module(src, fixes)
        batch = h.make_batch(
            self.batch_module,
            max_num_reqs=max_num_reqs,
            vocab_size=vocab_size,
            logitsprocs=logitsprocs or processors(max_num_reqs),
        )
        cls = runner_class(src, fixes, self.batch_module, self.patches)
        self.runner = cls(batch, logits_of, vocab_size, async_scheduling, speculative)
        self.computed, self.prompts, self.outputs = {}, {}, {}
        self._next_block = itertools.count(1)

    def step(self, schedule=None, new=None, finished=(), grammar=None, warmup=False):
        """schedule: {req_id: tokens} of running requests; new: {req_id: (prompt ids, SamplingParams,
        tokens)}; warmup: execute_model's warmup_mode. Returns {req_id: sampled ids} of this step."""
        from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

        schedule, new = dict(schedule or {}), dict(new or {})
        new_reqs = []
        for req_id, (prompt, params, tokens) in new.items():
            self.prompts[req_id], self.computed[req_id], self.outputs[req_id] = list(prompt), 0, []
            new_reqs.append(
                NewRequestData(
                    req_id=req_id,
                    prompt_token_ids=list(prompt),
                    mm_features=[],
                    sampling_params=params,
                    pooling_params=None,
                    block_ids=([next(self._next_block)],),
                    num_computed_tokens=0,
                    lora_request=None,
                )
            )
            schedule[req_id] = tokens
        cached = [r for r in schedule if r not in new]
        sched = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=CachedRequestData(
                req_ids=cached,
                resumed_req_ids=set(),
                new_token_ids=[[] for _ in cached],
                all_token_ids={},
                new_block_ids=[None for _ in cached],
                num_computed_tokens=[self.computed[r] for r in cached],
                num_output_tokens=[len(self.outputs[r]) for r in cached],
            ),
            num_scheduled_tokens=schedule,
            total_num_scheduled_tokens=sum(schedule.values()),
            scheduled_spec_decode_tokens={},
            scheduled_encoder_inputs={},
            num_common_prefix_blocks=[0],
            finished_req_ids=set(finished),
            free_encoder_mm_hashes=[],
        )
        for req_id in finished:
            self.computed.pop(req_id, None)
        self.runner.sampler_calls = []
        with self.installed():
            out = self.runner.execute_model(sched, warmup_mode=warmup)
            if out is None:
                out = self.runner.sample_tokens(grammar)
            if hasattr(out, "get_output"):  # async scheduling: the copy to the host, discarded rows cleared
                out = out.get_output()
        for req_id, tokens in schedule.items():
            self.computed[req_id] += tokens
        sampled = {}
        for req_id in schedule:
            index = out.req_id_to_index.get(req_id)
            ids = list(out.sampled_token_ids[index]) if index is not None and index < len(out.sampled_token_ids) else []
            if ids:
                sampled[req_id] = ids
                self.outputs[req_id] += ids
        self.last_output = out
        return sampled

    @contextlib.contextmanager
    def installed(self):
        """While the runner steps: the checkout's patches.py importable as vllm_gaudi.patches (the
        runner imports from it), and the sampler replacements of its plugin hook installed in vLLM
        as vllm-gaudi installs them on HPU (the hook itself is tested on its own), then vLLM's own
        put back."""
        import vllm.v1.sample.ops.logprobs as logprobs_mod
        import vllm.v1.sample.ops.topk_topp_sampler as tts
        import vllm.v1.sample.sampler as sampler_mod

        attrs = [
            (tts, "random_sample"),
            (sampler_mod.Sampler, "gather_logprobs"),
            (sampler_mod, "batched_count_greater_than"),
            (logprobs_mod, "batched_count_greater_than"),
        ]
        saved_attrs = [(obj, name, obj.__dict__[name]) for obj, name in attrs]
        saved_modules = {k: sys.modules.get(k) for k in ("vllm_gaudi", "vllm_gaudi.patches")}
        package = types.ModuleType("vllm_gaudi")
        package.__path__, package.patches = [], self.patches
        sys.modules["vllm_gaudi"], sys.modules["vllm_gaudi.patches"] = package, self.patches
        try:
            for name in ("_patch_batched_count_greater_than", "_patch_gather_logprobs", "_patch_random_sample"):
                if hasattr(self.patches, name):
                    getattr(self.patches, name)()
            yield
        finally:
            for obj, name, value in saved_attrs:
                setattr(obj, name, value)
            for key, value in saved_modules.items():
                if value is None:
                    sys.modules.pop(key, None)
                else:
                    sys.modules[key] = value

    def decode_all(self, finished=()):
        """One decode token for every running request."""
        return self.step({r: 1 for r in self.computed if r not in finished}, finished=finished)


def logits_table(table, vocab_size=32, default=None):
    """logits_of for the model stand-in: table[req_id] is {token: logit} (others 0)."""
    import torch

    def logits_of(req_id):
        row = torch.zeros(vocab_size)
        for token, value in table.get(req_id, default or {}).items():
            row[token] = value
        return row

    return logits_of
