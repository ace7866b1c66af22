"""Every tensor the checkpoint holds, as the model class names it, with how transformers initialises it.

The model is built on the meta device (no memory); the names are those save_pretrained writes and
vLLM's gemma4_mm loader reads (tied lm_head left out, persistent buffers kept)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Init:
    """normal(0, std) with row `zero_row` zeroed, or every element `value`."""

    std: float = 0.0
    zero_row: int | None = None
    value: float | None = None


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    init: Init

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def meta_model(config):
    import torch
    from transformers import Gemma4ForConditionalGeneration

    with torch.device("meta"):
        return Gemma4ForConditionalGeneration(config)


def _init_of(module, attr: str, std: float) -> Init:
    """transformers' Gemma4PreTrainedModel._init_weights for one tensor, as a rule; unknown ones fail."""
    from torch import nn
    from transformers.models.gemma4 import modeling_gemma4 as g

    kind = type(module).__name__
    if isinstance(module, nn.Embedding):
        return Init(std=std, zero_row=module.padding_idx)
    if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d)):
        return Init(std=std) if attr == "weight" else Init(value=0.0)
    if "LayerNorm" in kind or "RMSNorm" in kind:
        return Init(value=1.0 if attr == "weight" else 0.0)
    if isinstance(module, g.Gemma4ClippableLinear):
        # No clipping: transformers' init; the published checkpoint's bounds are trained values.
        return Init(value=-math.inf if attr.endswith("_min") else math.inf)
    if (kind, attr) in {
        ("Gemma4VisionPatchEmbedder", "position_embedding_table"),
        ("Gemma4TextDecoderLayer", "layer_scalar"),
    }:
        return Init(value=1.0)
    if (kind, attr) == ("Gemma4AudioAttention", "per_dim_scale"):
        return Init(value=0.0)
    raise ValueError(f"no initialisation rule for {kind}.{attr}: add one that matches transformers' _init_weights")


def tensor_specs(model) -> list[TensorSpec]:
    """The checkpoint's tensors in the model's order, each once (a tied weight under its first name)."""
    std = model.config.initializer_range
    specs, seen = [], set()
    for prefix, module in model.named_modules():
        persistent = [
            (n, b) for n, b in module.named_buffers(recurse=False) if n not in module._non_persistent_buffers_set
        ]
        for attr, tensor in [*module.named_parameters(recurse=False), *persistent]:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            name = f"{prefix}.{attr}" if prefix else attr
            specs.append(TensorSpec(name, tuple(tensor.shape), _init_of(module, attr, std)))
    return specs


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())
