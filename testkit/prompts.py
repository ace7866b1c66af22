"""The token ids vLLM 0.30.0 feeds the model for each scripted request, made without vLLM, and the
model inputs transformers needs for the same request (pixels, audio features).

How vLLM builds them, step by step (sources in vLLM 0.30.0):
- chat: messages become the "openai" content format (vllm/entrypoints/chat_utils.py,
  `_parse_chat_message_content`: string content -> one text part, image_url/input_audio parts ->
  {"type": "image"|"audio"}, a tool message's text parts joined; `_postprocess_messages`: an
  assistant tool call's JSON `arguments` -> a dict); the chat template renders them with
  add_generation_prompt=True and the request's tools and chat_template_kwargs
  (vllm/renderers/hf.py, `safe_apply_chat_template`); the text is tokenized with
  add_special_tokens=False (ChatCompletionRequest.add_special_tokens defaults to False), so the
  template's own bos_token is the only <bos>.
- multimodal: each <|image|> / <|audio|> the template wrote becomes begin + N soft tokens + end
  (vllm/model_executor/models/gemma4_mm.py, `_get_prompt_updates`, `get_image_repl`,
  `get_audio_repl`); N is what the HF processor gives the same media.
- completions: the text is tokenized with add_special_tokens=True (CompletionRequest default),
  which adds <bos> only through the BOS tokenizer copy the images bake.

The template is the one the CPU image serves with: the recipe's `--chat-template` (vLLM's
examples/tool_chat_template_gemma4.jinja, from the pinned source release), which wins over the
tokenizer's own. The folder's own template (tiny_gemma4.CHAT_TEMPLATE) is what vLLM renders with
when the launch names none, and what transformers' apply_chat_template uses.
"""

from __future__ import annotations

import base64
import copy
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

from testkit import tiny_gemma4

from .exchanges import CHAT, Exchange

IDS = tiny_gemma4.CONTROL_IDS
TARGET = "xeon6"  # the CPU tier: the target that serves the tiny model


@dataclass
class Prompt:
    """One training/evaluation sequence: prompt ids, the ids the model must generate, media."""

    exchange: str
    template: str  # "served" | "folder" | "completion" | "completion_without_bos"
    prompt_ids: list[int]
    target_ids: list[int]  # the output's ids followed by the stop id
    media: dict = field(default_factory=dict)  # keyword arguments for the model's forward


def served_template() -> str:
    """The --chat-template the CPU image's launch passes, as the image holds it."""
    from gemma4_images.build import pypi
    from gemma4_images.spec import matrix, upstream
    from gemma4_images.spec.image_code import gemma4_serve

    m = matrix.load_default(TARGET)  # the CPU image the smoke serves
    launch = gemma4_serve.compose(m.recipe(TARGET), {}, [])
    rel = gemma4_serve.flag_value(launch, "--chat-template")
    if rel is None:
        raise RuntimeError(f"{TARGET}'s launch names no --chat-template: {' '.join(launch)}")
    staged = {p.relative_to(upstream.STAGE).as_posix(): p for p in pypi.stage(m)}
    return staged[rel].read_text(encoding="utf-8")


def templates() -> dict[str, str]:
    return {"served": served_template(), "folder": tiny_gemma4.CHAT_TEMPLATE}


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def conversation(messages: list[dict]) -> list[dict]:
    """Messages as vLLM hands them to an "openai"-format chat template."""
    out = []
    for message in copy.deepcopy(messages):
        content = message.get("content")
        parts = [] if content is None else [{"type": "text", "text": content}] if isinstance(content, str) else content
        parsed = []
        for part in parts:
            kind = part["type"]
            parsed.append(
                {"type": "text", "text": part["text"]}
                if kind == "text"
                else {"type": "image"}
                if kind == "image_url"
                else {"type": "audio"}
            )
        msg = {"role": message["role"], "content": parsed}
        if message["role"] == "tool":
            msg["content"] = "\n".join(p["text"] for p in parsed)
            if "tool_call_id" in message:
                msg["tool_call_id"] = message["tool_call_id"]
        if message["role"] == "assistant" and message.get("tool_calls") is not None:
            msg["tool_calls"] = message["tool_calls"]
            for call in msg["tool_calls"]:
                args = call["function"].get("arguments")
                call["function"]["arguments"] = json.loads(args) if isinstance(args, str) and args else args or {}
        if isinstance(message.get("name"), str):
            msg["name"] = message["name"]
        out.append(msg)
    return out


def _decode_media(part: dict):
    """The PIL image or float waveform vLLM decodes from a request part."""
    if part["type"] == "image_url":
        from PIL import Image

        data = base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
        return "image", Image.open(io.BytesIO(data)).convert("RGB")
    import wave

    import numpy as np

    with wave.open(io.BytesIO(base64.b64decode(part["input_audio"]["data"]))) as w:
        samples = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return "audio", samples.astype(np.float32) / 32768.0


class Renderer:
    """Prompt ids and model inputs for the scripted exchanges, from the model folder's tokenizer
    and processor configuration."""

    def __init__(self, folder: Path, chat_templates: dict[str, str] | None = None):
        from transformers import AutoFeatureExtractor, AutoImageProcessor

        self.tokenizer = load_tokenizer(folder)
        self.chat_templates = chat_templates if chat_templates is not None else templates()
        self.images = AutoImageProcessor.from_pretrained(str(folder))
        self.audio = AutoFeatureExtractor.from_pretrained(str(folder))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def target_ids(self, text: str, stop: str) -> list[int]:
        return self.encode(text) + [IDS[stop]]

    def chat_text(self, ex: Exchange, template: str) -> str:
        request = ex.request
        return self.tokenizer.apply_chat_template(
            conversation(request["messages"]),
            tools=request.get("tools"),
            chat_template=self.chat_templates[template],
            add_generation_prompt=True,
            tokenize=False,
            **request.get("chat_template_kwargs", {}),
        )

    def _media_inputs(self, ex: Exchange) -> tuple[list[tuple[str, int]], dict]:
        """(modality, soft tokens) per media part in prompt order, and the forward's media kwargs."""
        import torch

        counts, images, sounds = [], [], []
        for message in ex.request["messages"]:
            for part in message["content"] if isinstance(message.get("content"), list) else []:
                if part["type"] in ("image_url", "input_audio"):
                    kind, value = _decode_media(part)
                    (images if kind == "image" else sounds).append(value)
                    counts.append(kind)
        media, soft = {}, {"image": [], "audio": []}
        if images:
            out = self.images(images=images, return_tensors="pt")
            media.update(pixel_values=out["pixel_values"], image_position_ids=out["image_position_ids"])
            soft["image"] = [int(n) for n in out["num_soft_tokens_per_image"]]
        if sounds:
            out = self.audio(sounds, return_tensors="pt")
            media.update(input_features=out["input_features"], input_features_mask=out["input_features_mask"])
            soft["audio"] = [_audio_soft_tokens(mask) for mask in out["input_features_mask"]]
        order = {"image": iter(soft["image"]), "audio": iter(soft["audio"])}
        media = {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in media.items()}
        return [(kind, next(order[kind])) for kind in counts], media

    def prompts(self, ex: Exchange) -> list[Prompt]:
        """Every sequence the model must answer for this exchange."""
        if ex.path != CHAT:
            ids = self.encode(ex.request["prompt"])
            out = [Prompt(ex.name, "completion", [IDS["<bos>"], *ids], self.target_ids(ex.output, ex.stop))]
            if ex.output_without_bos is not None:
                out.append(
                    Prompt(ex.name, "completion_without_bos", ids, self.target_ids(ex.output_without_bos, ex.stop))
                )
            return out
        placeholders, media = self._media_inputs(ex)
        out = []
        for template in self.chat_templates:
            ids = expand(self.encode(self.chat_text(ex, template)), placeholders)
            out.append(Prompt(ex.name, template, ids, self.target_ids(ex.output, ex.stop), media))
        return out


def _audio_soft_tokens(mask) -> int:
    """Soft tokens of one clip: the feature mask through the audio tower's two stride-2 convolutions
    (transformers' Gemma4Processor.replace_audio_token; vLLM's _compute_audio_num_tokens agrees)."""
    for _ in range(2):
        mask = mask[::2][: (len(mask) - 1) // 2 + 1]
    return int(mask.sum())


def expand(ids: list[int], placeholders: list[tuple[str, int]]) -> list[int]:
    """Each <|image|> / <|audio|> the template wrote -> begin marker + N soft tokens + end marker."""
    markers = {"image": ("<|image>", "<|image|>", "<image|>"), "audio": ("<|audio>", "<|audio|>", "<audio|>")}
    token_kind = {IDS[m[1]]: kind for kind, m in markers.items()}
    pending = iter(placeholders)
    out = []
    for tid in ids:
        if tid not in token_kind:
            out.append(tid)
            continue
        kind, n = next(pending)
        if kind != token_kind[tid]:
            raise ValueError(f"the template wrote a {token_kind[tid]} placeholder where the request has {kind}")
        begin, soft, end = (IDS[t] for t in markers[kind])
        out += [begin, *[soft] * n, end]
    if next(pending, None) is not None:
        raise ValueError("the template wrote fewer media placeholders than the request carries")
    return out
