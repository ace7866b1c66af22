"""A tiny, randomly initialised Gemma 4 E2B IT look-alike for offline tests.

``python -m testkit.tiny_gemma4 OUT_DIR [--seed N]`` writes a model folder that vLLM and
transformers load exactly as they load ``google/gemma-4-E2B-it``: the same architecture class
(``Gemma4ForConditionalGeneration``, with per-layer embeddings, KV sharing, sliding and full
attention layers, double-wide MLPs and vision/audio towers), shrunk to ~0.7M parameters, plus a
~500-token tokenizer that keeps Gemma 4's control-token ids and its instruct-tokenizer flaw
(raw prompts get no ``<bos>``; only the chat template emits it).

Nothing is downloaded. The tokenizer never depends on the seed; the weights do, and the same seed
gives byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

VOCAB_SIZE = 512

# Control tokens at the ids the real Gemma 4 tokenizer gives them, so code that hard-codes ids
# (eos [1, 106], the tool and reasoning parsers' markers) behaves as it would on the real model.
CONTROL_IDS = {
    "<pad>": 0,
    "<eos>": 1,
    "<bos>": 2,
    "<unk>": 3,
    "<mask>": 4,
    "<|tool>": 46,
    "<tool|>": 47,
    "<|tool_call>": 48,
    "<tool_call|>": 49,
    "<|tool_response>": 50,
    "<tool_response|>": 51,
    '<|"|>': 52,
    "<|think|>": 98,
    "<|channel>": 100,
    "<channel|>": 101,
    "<|turn>": 105,
    "<turn|>": 106,
    # Multimodal markers. The real ids are 255999/256000 (begin image/audio) and 258880-258884
    # (image/audio soft tokens, end image/audio, video), i.e. near the top of the vocabulary;
    # same shape here.
    "<|image>": 255,
    "<|audio>": 256,
    "<|image|>": 507,
    "<|audio|>": 508,
    "<image|>": 509,
    "<audio|>": 510,
    "<|video|>": 511,
}
NEWLINE_ID = 107  # "\n" is an ordinary (non-special) token at 107 in the real vocabulary too.

# Named tokens the Gemma4Processor and parsers look up on the tokenizer (same keys as upstream).
NAMED_TOKENS = {
    "image_token": "<|image|>",
    "boi_token": "<|image>",
    "eoi_token": "<image|>",
    "audio_token": "<|audio|>",
    "boa_token": "<|audio>",
    "eoa_token": "<audio|>",
    "sot_token": "<|turn>",
    "eot_token": "<turn|>",
    "soc_token": "<|channel>",
    "eoc_token": "<channel|>",
    "think_token": "<|think|>",
    "escape_token": '<|"|>',
    "std_token": "<|tool>",
    "etd_token": "<tool|>",
    "stc_token": "<|tool_call>",
    "etc_token": "<tool_call|>",
    "str_token": "<|tool_response>",
    "etr_token": "<tool_response|>",
}

# Words whose left-to-right merges fill the vocabulary left over after bytes and characters, so
# chat scaffolding and common test prompts are a few tokens rather than one per character.
MERGE_WORDS = [
    "user",
    "model",
    "system",
    "▁the",
    "call",
    "Hello",
    "ing",
    "▁is",
    "▁and",
    "▁of",
    "▁to",
    "▁a",
    "thought",
    "▁weather",
]

# Our own template in Gemma 4's turn format. Like the real one it starts with bos_token, which is
# why a tokenizer that *also* adds <bos> on encode would double it on vLLM's chat path.
CHAT_TEMPLATE = """\
{{- bos_token -}}
{%- set system = messages[0]['content'] if messages and messages[0]['role'] in ['system', 'developer'] else none -%}
{%- if system is not none or tools or enable_thinking -%}
<|turn>system
{% if enable_thinking %}<|think|>{% endif -%}
{%- if system is string %}{{ system }}{% elif system %}{% for p in system %}{{ p['text'] }}{% endfor %}{% endif -%}
{%- for tool in tools or [] %}{% set f = tool['function'] if tool['function'] is defined else tool -%}
<|tool>declaration:{{ f['name'] }}{{ {'description': f['description'], 'parameters': f['parameters']} | tojson }}<tool|>
{%- endfor %}<turn|>
{% endif -%}
{#- Loop over `messages` itself and over message['content'] so vLLM detects the OpenAI content format. -#}
{%- for message in messages -%}
{%- if not (loop.first and system is not none) -%}
<|turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}
{% if message['role'] == 'tool' %}<|tool_response>response:{{ message['name'] or 'tool' }}{value:<|"|>{% endif -%}
{%- if message['content'] is string %}{{ message['content'] }}
{%- elif message['content'] %}{% for part in message['content'] -%}
{%- if part['type'] == 'text' %}{{ part['text'] }}
{%- elif part['type'] in ['image', 'image_url'] %}<|image|>
{%- elif part['type'] in ['audio', 'input_audio', 'audio_url'] %}<|audio|>
{%- elif part['type'] in ['video', 'video_url'] %}<|video|>{% endif -%}
{%- endfor %}{% endif -%}
{%- if message['role'] == 'tool' %}<|"|>}<tool_response|>{% endif -%}
{%- for call in message['tool_calls'] or [] %}{% set f = call['function'] if call['function'] is defined else call -%}
<|tool_call>call:{{ f['name'] }}{ {%- if f['arguments'] is string %}{{ f['arguments'] }}{% else -%}
{%- for k, v in f['arguments'].items() %}{{ k }}:{% if v is string %}<|"|>{{ v }}<|"|>{% else %}{{ v | tojson }}{% endif %}{{ ',' if not loop.last }}{% endfor -%}
{%- endif %}}<tool_call|>
{%- endfor %}<turn|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|turn>model
{% endif -%}
"""


def _text_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Gemma-style byte-fallback BPE vocabulary: every byte, printable ASCII, then merges."""
    taken = set(CONTROL_IDS.values()) | {NEWLINE_ID}
    unused = [i for i in range(NEWLINE_ID) if i not in taken]
    free = iter(i for i in range(NEWLINE_ID, VOCAB_SIZE) if i not in taken)
    vocab = dict(CONTROL_IDS)
    vocab["\n"] = NEWLINE_ID
    # Gaps between control ids are <unusedN> placeholders, as in the real tokenizer.
    vocab.update({f"<unused{n}>": i for n, i in enumerate(unused)})
    # Byte fallback makes any UTF-8 text encodable; characters keep ASCII to one token each.
    for piece in [f"<0x{b:02X}>" for b in range(256)] + ["\t", "▁"] + [chr(c) for c in range(0x21, 0x7F)]:
        vocab[piece] = next(free)
    merges: list[tuple[str, str]] = []
    for word in MERGE_WORDS:
        for end in range(2, len(word) + 1):
            left, right = word[: end - 1], word[end - 1]
            if word[:end] in vocab:
                continue
            try:
                vocab[word[:end]] = next(free)
            except StopIteration:
                return vocab, merges
            merges.append((left, right))
    return vocab, merges


def build_tokenizer(vocab_and_merges=None, control_ids=CONTROL_IDS):
    """The backend tokenizer, laid out like GemmaTokenizer rebuilds it on load: the tiny vocabulary
    unless another (testkit.e2b_shape's full-size one) is given with its control tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    vocab, merges = vocab_and_merges or _text_vocab()
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    # Same normalizer/pre-tokenizer/decoder as transformers' GemmaTokenizer, which replaces
    # whatever tokenizer.json says with these when tokenizer_class is GemmaTokenizer.
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    # THE FLAW, as shipped by the instruct repo: a post-processor that adds nothing, so
    # encode("hi") has no <bos>. patches/gemma4-bos-tokenizer exists to fix exactly this.
    tok.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1", special_tokens=[])
    specials = sorted((i, t) for t, i in vocab.items() if t in control_ids or t.startswith("<unused"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for _, t in specials])
    return tok


def tokenizer_config() -> dict:
    return {
        "backend": "tokenizers",
        "tokenizer_class": "GemmaTokenizer",
        "processor_class": "Gemma4Processor",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "mask_token": "<mask>",
        "add_bos_token": False,  # the flaw, stated explicitly (upstream just omits the key)
        "add_eos_token": False,
        **NAMED_TOKENS,
        # Exactly what Gemma4Processor.__init__ re-adds; anything else listed here would be
        # silently replaced by it, so the other markers are named tokens above instead.
        "extra_special_tokens": ["<|video|>"],
        "padding_side": "left",
        "model_max_length": 131072,
        "chat_template": CHAT_TEMPLATE,
    }


def model_config():
    """Gemma 4 E2B's structure (35 layers in 4:1 sliding:full, last 20 KV-shared) in 4 layers."""
    from transformers import Gemma4Config

    ids = CONTROL_IDS
    text = dict(
        vocab_size=VOCAB_SIZE,
        vocab_size_per_layer_input=VOCAB_SIZE,
        hidden_size=64,
        hidden_size_per_layer_input=16,
        intermediate_size=128,
        num_hidden_layers=4,
        # Both layer types must occur before the KV-shared tail: the shared layers reuse the cache
        # of the last earlier layer of their own type.
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        global_head_dim=64,
        sliding_window=128,
        num_kv_shared_layers=2,
        use_double_wide_mlp=True,
        final_logit_softcapping=30.0,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=1,
    )
    vision = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        # Upstream's 10240-entry position table is 2/3 of the tiny model; 1024 still covers the
        # longest side an image can get within the 280-token budget (840 patches).
        position_embedding_size=1024,
        default_output_length=280,  # vLLM sizes image placeholders from this
    )
    audio = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, output_proj_dims=64)
    return Gemma4Config(
        text_config=text,
        vision_config=vision,
        audio_config=audio,
        boi_token_id=ids["<|image>"],
        eoi_token_id=ids["<image|>"],
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        boa_token_id=ids["<|audio>"],
        eoa_token_index=ids["<audio|>"],
        audio_token_id=ids["<|audio|>"],
        architectures=["Gemma4ForConditionalGeneration"],
    )


def processor_config() -> dict:
    """processor_config.json in transformers 5's nested layout, with upstream's values.

    Written as data so that generating the folder needs neither Pillow nor torchvision;
    loading the processor (as vLLM does) needs both.
    """
    vision = dict(
        do_convert_rgb=True,
        do_rescale=True,
        do_resize=True,
        do_normalize=False,
        image_mean=[0.0, 0.0, 0.0],
        image_std=[1.0, 1.0, 1.0],
        patch_size=16,
        pooling_kernel_size=3,
        resample=3,
        rescale_factor=1 / 255,
    )
    return {
        "processor_class": "Gemma4Processor",
        "image_seq_length": 280,
        "audio_seq_length": 750,
        "audio_ms_per_token": 40,
        "image_processor": dict(
            vision, image_processor_type="Gemma4ImageProcessor", image_seq_length=280, max_soft_tokens=280
        ),
        "video_processor": dict(
            vision,
            video_processor_type="Gemma4VideoProcessor",
            do_normalize=True,
            do_sample_frames=True,
            num_frames=32,
            max_soft_tokens=70,
            return_metadata=False,
        ),
        "feature_extractor": dict(
            feature_extractor_type="Gemma4AudioFeatureExtractor",
            feature_size=128,
            sampling_rate=16000,
            padding_value=0.0,
            return_attention_mask=True,
            frame_length_ms=20.0,
            hop_length_ms=10.0,
            min_frequency=0.0,
            max_frequency=8000.0,
            mel_floor=1e-3,
            padding_side="right",
        ),
    }


def write_tiny_gemma4(out_dir: str | Path, seed: int = 0) -> dict:
    """Write the model folder; returns a small summary (paths, parameter count, seconds)."""
    import torch
    from transformers import Gemma4ForConditionalGeneration, GenerationConfig

    start = time.monotonic()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration(model_config()).eval()
    # bfloat16: the dtype of the real checkpoint and what the recipes serve (--dtype bfloat16).
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=2,
        pad_token_id=0,
        eos_token_id=[CONTROL_IDS["<eos>"], CONTROL_IDS["<turn|>"]],
        # Upstream's sampling defaults; vLLM applies them unless a request overrides them.
        do_sample=True,
        temperature=1.0,
        top_k=64,
        top_p=0.95,
    )
    model.save_pretrained(out, safe_serialization=True)

    write_tokenizer_files(out, build_tokenizer())

    return {
        "out_dir": str(out),
        "seed": seed,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": "bfloat16",
        "bytes": sum(f.stat().st_size for f in out.iterdir() if f.is_file()),
        "seconds": round(time.monotonic() - start, 2),
    }


def write_tokenizer_files(out: Path, tokenizer) -> None:
    """tokenizer.json, its configuration, the chat template and processor_config.json in out."""
    tokenizer.save(str(out / "tokenizer.json"))
    config = tokenizer_config()
    _write_json(out / "tokenizer_config.json", config)
    _write_json(
        out / "special_tokens_map.json",
        {k: config[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token", "mask_token")}
        | {"additional_special_tokens": config["extra_special_tokens"]},
    )
    # transformers 5 and AutoProcessor read the template from this file; older readers from the
    # tokenizer_config key. Both come from the one constant.
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    _write_json(out / "processor_config.json", processor_config())


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(json.dumps(write_tiny_gemma4(args.out_dir, seed=args.seed), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
