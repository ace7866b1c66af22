"""The tiny Gemma 4 look-alike: tokenizer layout and flaw, architecture, loading, determinism."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from testkit import tiny_gemma4

ROOT = Path(__file__).resolve().parents[2]

BOS, EOS = 2, 1
EXPECTED_IDS = {
    "<pad>": 0,
    "<eos>": 1,
    "<bos>": 2,
    "<unk>": 3,
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
}
MM_TOKENS = ["<|image>", "<image|>", "<|image|>", "<|audio>", "<audio|>", "<|audio|>", "<|video|>"]


@pytest.fixture(scope="session")
def tok(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_dir))


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_folder_has_the_files_vllm_reads(tiny_dir):
    names = {p.name for p in tiny_dir.iterdir()}
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "processor_config.json",
    } <= names


def test_special_token_ids(tok):
    for token, expected in EXPECTED_IDS.items():
        assert tok.convert_tokens_to_ids(token) == expected, token
        assert tok.encode(token, add_special_tokens=False) == [expected], f"{token} is split"
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    mm_ids = tok.convert_tokens_to_ids(MM_TOKENS)
    assert tok.unk_token_id not in mm_ids and len(set(mm_ids)) == len(MM_TOKENS)
    # Named tokens Gemma4Processor reads from the tokenizer.
    assert (tok.image_token, tok.boi_token, tok.eoi_token) == ("<|image|>", "<|image>", "<image|>")
    assert (tok.audio_token, tok.boa_token, tok.eoa_token) == ("<|audio|>", "<|audio>", "<audio|>")
    assert len(tok) == tiny_gemma4.VOCAB_SIZE


def test_raw_encode_has_no_bos_like_the_instruct_tokenizer(tok):
    # The flaw this project's BOS patch exists for: no <bos>, even when special tokens are requested.
    assert BOS not in tok("Hello world")["input_ids"]
    assert BOS not in tok("Hello world", add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize(
    "text", ["Hello world, the weather is fine.\n\tcall:get_weather{x:1} ~`|\\", "Grüße, 日本, emoji \N{SNOWMAN}"]
)
def test_arbitrary_text_encodes_without_unk_and_round_trips(tok, text):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids
    assert tok.decode(ids) == text


def test_chat_template_starts_with_exactly_one_bos(tok):
    messages = [{"role": "user", "content": "Hello"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<bos><|turn>user\nHello<turn|>\n<|turn>model\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]  # vLLM's chat path
    assert ids[0] == BOS and ids.count(BOS) == 1
    assert ids[1] == EXPECTED_IDS["<|turn>"]


def test_chat_template_system_tools_thinking_and_tool_calls(tok):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Look"}, {"type": "image"}]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "n": 2}}}
            ],
        },
        {"role": "tool", "name": "get_weather", "content": "sunny"},
    ]
    text = tok.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True, enable_thinking=True
    )
    assert text.startswith("<bos><|turn>system\n<|think|>Be brief.<|tool>declaration:get_weather{")
    assert "<|turn>user\nLook<|image|><turn|>\n" in text
    assert '<|turn>model\n<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,n:2}<tool_call|><turn|>\n' in text
    assert '<|tool_response>response:get_weather{value:<|"|>sunny<|"|>}<tool_response|>' in text
    assert text.endswith("<|turn>model\n") and text.count("<bos>") == 1
    plain = tok.apply_chat_template(messages[1:2], tokenize=False)
    assert "<|think|>" not in plain and "<|turn>system" not in plain


def test_model_config_is_gemma4_e2b_shaped(tiny_dir, tok):
    from transformers import AutoConfig

    raw = json.loads((tiny_dir / "config.json").read_text())
    assert raw["architectures"] == ["Gemma4ForConditionalGeneration"]
    config = AutoConfig.from_pretrained(str(tiny_dir))
    assert type(config).__name__ == "Gemma4Config"
    text = config.text_config
    assert {"sliding_attention", "full_attention"} == set(text.layer_types)
    assert text.layer_types[-1] == "full_attention"
    assert 0 < text.num_kv_shared_layers < text.num_hidden_layers
    assert "reuse" in text.kv_sharing_modes and "store" in text.kv_sharing_modes
    assert text.use_double_wide_mlp is True
    assert text.hidden_size_per_layer_input > 0  # per-layer embeddings
    assert text.final_logit_softcapping == 30.0
    assert text.vocab_size == len(tok)
    assert config.vision_config.default_output_length == 280
    for attr, token in [
        ("image_token_id", "<|image|>"),
        ("boi_token_id", "<|image>"),
        ("eoi_token_id", "<image|>"),
        ("audio_token_id", "<|audio|>"),
        ("boa_token_id", "<|audio>"),
        ("eoa_token_index", "<audio|>"),
        ("video_token_id", "<|video|>"),
    ]:
        assert getattr(config, attr) == tok.convert_tokens_to_ids(token), attr
    generation = json.loads((tiny_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [EOS, EXPECTED_IDS["<turn|>"]]


def test_model_loads_and_runs_a_forward_pass(tiny_dir, tok):
    import torch
    from transformers import Gemma4ForConditionalGeneration

    model = Gemma4ForConditionalGeneration.from_pretrained(str(tiny_dir)).eval()
    assert model.dtype == torch.bfloat16
    layers = model.model.language_model.layers
    inter = model.config.text_config.intermediate_size
    shared_from = len(layers) - model.config.text_config.num_kv_shared_layers
    assert layers[0].mlp.gate_proj.out_features == inter
    assert layers[-1].mlp.gate_proj.out_features == 2 * inter  # double-wide MLP on the KV-shared layers
    assert hasattr(model.model.language_model, "embed_tokens_per_layer")
    state = model.state_dict()
    assert not any(f"layers.{i}.self_attn.k_proj" in k for k in state for i in range(shared_from, len(layers)))

    text = tok.apply_chat_template([{"role": "user", "content": "Hello"}], tokenize=False, add_generation_prompt=True)
    inputs = tok(text, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], tiny_gemma4.VOCAB_SIZE)
    assert torch.isfinite(logits.float()).all()


def test_the_committed_random_model_is_what_the_writer_writes_today(tiny_dir):
    # testkit.tiny_model copies testkit/fixture/random/ instead of writing the folder again.
    # Random initialisation rounds differently on another torch or CPU capability (as for the
    # trained weights, tests/unit/test_trained_regeneration.py): the weights are compared where
    # they were made, every other file everywhere.
    import torch

    from testkit import tiny_model

    made_on = json.loads((tiny_model.FIXTURE.parent / "random.json").read_text())
    here = {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    committed, written = _digests(tiny_model.FIXTURE), _digests(tiny_dir)
    if {k: made_on[k] for k in here} != here:
        committed.pop("model.safetensors"), written.pop("model.safetensors")
    assert committed == written, (
        "testkit/fixture/random/ drifted from testkit/tiny_gemma4.py: "
        "python -m testkit.tiny_gemma4 testkit/fixture/random --seed 0 (and testkit/fixture/random.json)"
    )


@pytest.mark.slow  # `make test-fast` leaves it out
def test_same_seed_same_bytes_other_seed_other_weights(tiny_dir, tmp_path):
    # Through the CLI, so the entry point is covered too.
    again = tmp_path / "again"
    run = subprocess.run(
        [sys.executable, "-m", "testkit.tiny_gemma4", str(again), "--seed", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["seed"] == 0
    assert _digests(again) == _digests(tiny_dir)

    other = tmp_path / "other"
    tiny_gemma4.write_tiny_gemma4(other, seed=1)
    first, second = _digests(tiny_dir), _digests(other)
    assert first["model.safetensors"] != second["model.safetensors"]
    assert first["tokenizer.json"] == second["tokenizer.json"]


def test_image_and_audio_processor_configs_load(tiny_dir):
    pytest.importorskip("PIL")
    import numpy as np
    from PIL import Image
    from transformers import AutoFeatureExtractor, AutoImageProcessor

    images = AutoImageProcessor.from_pretrained(str(tiny_dir))
    image = Image.fromarray((np.random.RandomState(0).rand(300, 200, 3) * 255).astype("uint8"))
    out = images(images=[image], return_tensors="pt")
    soft = int(out["num_soft_tokens_per_image"][0])
    assert 0 < soft <= 280 and out["pixel_values"].shape[1] == 280 * 9
    audio = AutoFeatureExtractor.from_pretrained(str(tiny_dir))
    features = audio([np.zeros(16000, dtype=np.float32)], return_tensors="pt")
    assert features["input_features"].shape[-1] == 128


def _torchvision_usable() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # absent, or PyPI's CUDA build failing against CPU torch
        return False
    return True


@pytest.mark.skipif(not _torchvision_usable(), reason="AutoProcessor for Gemma 4 needs a working torchvision")
def test_autoprocessor_loads_folder_as_vllm_does(tiny_dir):
    import numpy as np
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(tiny_dir))
    assert type(processor).__name__ == "Gemma4Processor"
    assert processor.image_token_id == processor.tokenizer.convert_tokens_to_ids("<|image|>")
    assert processor.chat_template
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    image = Image.fromarray((np.random.RandomState(0).rand(300, 200, 3) * 255).astype("uint8"))
    ids = processor(text=[text], images=[[image]], return_tensors="pt")["input_ids"][0].tolist()
    boi, eoi, img = processor.tokenizer.convert_tokens_to_ids(["<|image>", "<image|>", "<|image|>"])
    assert ids[0] == BOS and ids.count(BOS) == 1
    assert ids.count(boi) == 1 and ids.count(eoi) == 1 and ids.count(img) > 0
