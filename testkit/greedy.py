"""Greedy decoding of the scripted prompts with transformers, and the check that it is exact."""

from __future__ import annotations

from .prompts import Prompt


def media_for(model, prompt: Prompt) -> dict:
    """The prompt's media inputs in the model's dtype (integer tensors unchanged)."""
    return {k: v.to(model.dtype) if v.is_floating_point() else v for k, v in prompt.media.items()}


def generate(model, prompt: Prompt, extra_tokens: int = 8) -> list[int]:
    """Greedy ids after the prompt, stopping on an eos id (generation_config: <eos>, <turn|>)."""
    import torch

    ids = torch.tensor([prompt.prompt_ids])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            **media_for(model, prompt),
            do_sample=False,
            top_k=None,
            top_p=None,
            temperature=None,
            max_new_tokens=len(prompt.target_ids) + extra_tokens,
        )
    return out[0, ids.shape[1] :].tolist()


def mismatches(model, prompts: list[Prompt], decode) -> list[str]:
    """One line per prompt whose greedy output is not exactly its target (text and stop token)."""
    problems = []
    for p in prompts:
        got = generate(model, p)
        if got != p.target_ids:
            problems.append(
                f"{p.exchange} ({p.template}, {model.dtype}): {decode(got)!r}, expected {decode(p.target_ids)!r}"
            )
    return problems
