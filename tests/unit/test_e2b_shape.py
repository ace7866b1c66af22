"""Random weights of E2B's shape (testkit.e2b_shape): E2B's configuration, the recipe's size, the tensors
vLLM loads, transformers' initialisation, the shards, the 262,144-entry tokenizer, and the room check.
Nothing here writes the 10 GB folder but the `fullsize` test."""

from __future__ import annotations

import json
import math
import re
from functools import cache

import pytest

from testkit import tiny_gemma4
from testkit.e2b_shape import cache as e2b_cache
from testkit.e2b_shape import facts, folder, shards, tensors, vocab
from testkit.tiny_model import FIXTURE

FIGURES = facts.facts()["figures"]
# The recipe gives both figures to one decimal (5.1B, 10.2 GB): half a unit of the last place.
ROUNDING = 0.05e9


@cache
def e2b() -> folder.Plan:
    return folder.Plan()


def shapes() -> dict[str, tuple[int, ...]]:
    return {spec.name: spec.shape for spec in e2b().specs}


def pattern(name: str) -> str:
    return re.sub(r"\.\d+\.", ".N.", name)


def test_text_layers_are_e2bs():
    """35 layers, full attention every fifth (head_dim 512) else sliding (256), the last 20 reuse K/V and
    have double-wide MLPs, 8 query heads and 1 KV head."""
    s = shapes()
    lm = "model.language_model"
    assert sum(1 for n in s if re.fullmatch(rf"{lm}\.layers\.\d+\.input_layernorm\.weight", n)) == 35
    for i in range(35):
        head_dim = 512 if i % 5 == 4 else 256
        assert s[f"{lm}.layers.{i}.self_attn.q_proj.weight"] == (8 * head_dim, 1536)
        assert (f"{lm}.layers.{i}.self_attn.k_proj.weight" in s) == (i < 15)
        if i < 15:
            assert s[f"{lm}.layers.{i}.self_attn.k_proj.weight"] == (head_dim, 1536)
        assert s[f"{lm}.layers.{i}.mlp.gate_proj.weight"] == ((12288 if i >= 15 else 6144), 1536)
    assert s[f"{lm}.embed_tokens.weight"] == (262144, 1536)
    assert s[f"{lm}.embed_tokens_per_layer.weight"] == (262144, 35 * 256)
    assert "lm_head.weight" not in s  # tied to embed_tokens, as the published checkpoint has it


def test_config_is_e2bs():
    text = e2b().config.text_config
    assert text.layer_types == (["sliding_attention"] * 4 + ["full_attention"]) * 7
    assert (text.sliding_window, text.num_kv_shared_layers, text.final_logit_softcapping) == (512, 20, 30.0)
    assert text.rope_parameters["full_attention"] == {
        "rope_type": "proportional",
        "partial_rotary_factor": 0.25,
        "rope_theta": 1e6,
    }
    assert text.rope_parameters["sliding_attention"] == {"rope_type": "default", "rope_theta": 1e4}
    assert e2b().config.tie_word_embeddings


def test_vision_and_audio_towers_are_e2bs():
    s = shapes()
    vision, audio = "model.vision_tower.encoder.layers", "model.audio_tower.layers"
    assert len({n.split(".")[4] for n in s if n.startswith(vision + ".")}) == 16
    assert s[f"{vision}.0.mlp.gate_proj.linear.weight"] == (3072, 768)
    assert s["model.vision_tower.patch_embedder.position_embedding_table"] == (2, 10240, 768)
    assert f"{vision}.0.self_attn.q_proj.input_min" in s  # E2B's vision linears are clipped
    assert len({n.split(".")[3] for n in s if n.startswith(audio + ".")}) == 12
    assert s[f"{audio}.0.self_attn.q_proj.linear.weight"] == (1024, 1024)
    assert s["model.audio_tower.output_proj.weight"] == (1536, 1024)
    assert s["model.embed_audio.embedding_projection.weight"] == (1536, 1536)
    assert s["model.embed_vision.embedding_projection.weight"] == (1536, 768)


def test_size_is_the_recipes():
    """5.1B parameters with the per-layer embeddings and a 10.2 GB bf16 checkpoint (recipe 000)."""
    assert abs(e2b().parameters - FIGURES["parameters"]) < ROUNDING, e2b().parameters
    assert abs(e2b().weight_bytes - FIGURES["checkpoint_bytes"]) < ROUNDING, e2b().weight_bytes


def test_tensor_names_are_those_vllm_loads_from_the_tiny_model():
    """The same names as the tiny model's safetensors (which vLLM's gemma4_mm loader takes), layer numbers
    aside; E2B adds only the clip bounds of its vision linears."""
    from safetensors import safe_open

    with safe_open(str(FIXTURE / "model.safetensors"), "pt") as f:
        tiny = {pattern(n) for n in f.keys()}
    ours = {pattern(n) for n in shapes()}
    assert tiny <= ours, sorted(tiny - ours)
    extra = ours - tiny
    assert extra and all(re.fullmatch(r"model\.vision_tower\..*\.(input|output)_(min|max)", n) for n in extra)


def test_initialisation_is_transformers():
    """Generated for the tiny configuration, every tensor is what transformers' init gave the committed
    fixture: constants equal (norms 1, clip bounds +-inf, ...), random ones normal(0, 0.02) with the
    padding row zero."""
    import torch
    from safetensors import safe_open

    specs = tensors.tensor_specs(tensors.meta_model(tiny_gemma4.model_config()))
    with safe_open(str(FIXTURE / "model.safetensors"), "pt") as f:
        assert {s.name for s in specs} == set(f.keys())
        for spec in specs:
            ours = torch.cat([part.reshape(-1) for part in shards.chunks(spec, seed=0)]).reshape(spec.shape)
            theirs = f.get_tensor(spec.name)
            if spec.init.value is not None:
                assert torch.equal(ours, theirs), spec.name
                continue
            assert theirs.float().std().item() == pytest.approx(spec.init.std, rel=0.15), spec.name
            assert ours.float().std().item() == pytest.approx(spec.init.std, rel=0.15), spec.name
            assert zero_rows(ours) == zero_rows(theirs), spec.name


def zero_rows(t) -> list[int]:
    return [i for i, row in enumerate(t) if t.dim() > 1 and not row.any()]


def test_values_depend_on_seed_and_name_not_on_order():
    import torch

    a, b = (tensors.TensorSpec(name, (4, 3), tensors.Init(std=0.02)) for name in ("a.weight", "b.weight"))

    def values(spec, seed=0):
        return torch.cat(list(shards.chunks(spec, seed)))

    a_first, b_second = values(a), values(b)
    b_first, a_second = values(b), values(a)
    assert a_first.equal(a_second) and b_first.equal(b_second)
    assert not a_first.equal(b_first) and not a_first.equal(values(a, seed=1))


def test_shards_hold_every_tensor(tmp_path):
    """Tensors streamed into shards of a size limit read back through the index with safetensors, values
    and all; a tensor over the limit gets a shard of its own."""
    import torch
    from safetensors import safe_open

    specs = tensors.tensor_specs(tensors.meta_model(tiny_gemma4.model_config()))
    biggest = max(specs, key=lambda s: s.numel)
    limit = biggest.numel * shards.BYTES_PER_VALUE - 1
    index = shards.write_checkpoint(tmp_path, specs, seed=3, max_bytes=limit)
    assert json.loads((tmp_path / shards.INDEX).read_text()) == index
    assert index["metadata"]["total_size"] == sum(s.numel for s in specs) * shards.BYTES_PER_VALUE
    files = set(index["weight_map"].values())
    assert len(files) > 1 and [n for n, f in index["weight_map"].items() if f == index["weight_map"][biggest.name]] == [
        biggest.name
    ]
    for file in files:
        assert (tmp_path / file).stat().st_size <= limit or file == index["weight_map"][biggest.name]
    for spec in specs:
        with safe_open(str(tmp_path / index["weight_map"][spec.name]), "pt") as f:
            got = f.get_tensor(spec.name)
        assert got.dtype == torch.bfloat16 and tuple(got.shape) == spec.shape
        assert torch.equal(got.reshape(-1), torch.cat([p.reshape(-1) for p in shards.chunks(spec, 3)]))


@cache
def e2b_tokenizer():
    return vocab.build_tokenizer()


@pytest.mark.slow
def test_tokenizer_has_e2bs_size_and_control_ids():
    tok = e2b_tokenizer()
    assert tok.get_vocab_size() == 262144 == e2b().config.text_config.vocab_size
    assert {t: tok.token_to_id(t) for t in facts.control_ids()} == facts.control_ids()
    assert tok.token_to_id("\n") == 107
    config = e2b().config
    assert [tok.id_to_token(i) for i in (config.boi_token_id, config.image_token_id, config.eoa_token_index)] == [
        "<|image>",
        "<|image|>",
        "<audio|>",
    ]


@pytest.mark.slow
def test_every_id_decodes_and_any_text_round_trips():
    tok = e2b_tokenizer()
    texts = tok.decode_batch([[i] for i in range(262144)], skip_special_tokens=False)
    assert all(texts) and len(set(texts)) > 250_000
    for text in ["Hello, world!", "naïve café — 東京 👋", "tab\there\nnew line  two spaces"]:
        assert tok.decode(tok.encode(text).ids) == text
    # Words become pieces of several letters, not one token a character.
    assert len(tok.encode("hello world, the weather is fine").ids) <= 16


@pytest.mark.slow
def test_transformers_reads_the_tokenizer_files(tmp_path):
    from transformers import AutoTokenizer

    tiny_gemma4.write_tokenizer_files(tmp_path, e2b_tokenizer())
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(tok) == 262144
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt == "<bos><|turn>user\nhi<turn|>\n<|turn>model\n"
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert ids[:2] == [2, 105] and ids[-1] == 107
    assert tok.decode([258880, 100]) == "<|image|><|channel>"


def test_short_disk_is_one_line_and_nothing_is_written(tmp_path, monkeypatch):
    """The command stops before writing anything, exit status 1, one line naming what it needs and what is free."""
    from testkit.e2b_shape.__main__ import main

    monkeypatch.setattr(e2b_cache, "DISK_MARGIN", 10**18)  # more than any disk: the disk is short
    monkeypatch.setattr(folder, "write", never_write)
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "out")])
    assert re.fullmatch(r"error: .* need \d+\.\d GB of free disk in \S+; \d+\.\d GB free", stopped.value.code)
    assert list(tmp_path.iterdir()) == []


def never_write(*_):
    """Stands in for the 10 GB write where the room check must stop first."""
    raise AssertionError("the folder was being written although the room check should have stopped it")


def test_short_memory_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(e2b_cache, "MEMORY_NEEDED", 2**60)
    with pytest.raises(
        e2b_cache.NotEnoughRoom, match=r"need \d+\.\d GiB of available memory .*; \d+\.\d GiB available"
    ):
        e2b_cache.preflight(tmp_path, 1)


def test_ensure_removes_a_dead_writers_folder_and_older_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMA4_CACHE", str(tmp_path))
    monkeypatch.setattr(e2b_cache, "DISK_MARGIN", 10**18)
    monkeypatch.setattr(folder, "write", never_write)
    dead = tmp_path / ".e2b-shape-seed0-0123456789abcdef.x1y2"
    older = tmp_path / "e2b-shape-seed0-0123456789abcdef"
    other_seed = tmp_path / "e2b-shape-seed1-0123456789abcdef"
    for path in (dead, older, other_seed):
        path.mkdir()
        (path / "model-00001-of-00001.safetensors").write_bytes(b"half")
    with pytest.raises(e2b_cache.NotEnoughRoom):
        e2b_cache.ensure(seed=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".e2b-shape.lock", other_seed.name]


def test_folder_name_follows_every_input_of_the_content(tmp_path, monkeypatch):
    """Another seed, other facts or other generator code name another folder; the command's code does not."""
    import shutil

    copy = tmp_path / "e2b_shape"
    shutil.copytree(e2b_cache.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(e2b_cache, "PACKAGE", copy)
    key = e2b_cache.made_from(0)
    assert e2b_cache.made_from(1) != key
    for name, changes_content in [("__main__.py", False), ("cache.py", False), ("e2b.json", True), ("shards.py", True)]:
        original = (copy / name).read_bytes()
        (copy / name).write_bytes(original + b"\n")
        assert (e2b_cache.made_from(0) != key) == changes_content, name
        (copy / name).write_bytes(original)


@pytest.mark.fullsize
def test_the_written_folder_is_whole():
    """The cached folder (written here if missing, ~40 s, 10.2 GB): every tensor of the meta model in the
    shard the index names, with its shape and dtype; the files' bytes; readable by any user."""
    import os
    import stat

    from safetensors import safe_open
    from transformers import AutoConfig

    out = e2b_cache.ensure()
    index = json.loads((out / shards.INDEX).read_text())
    assert index["weight_map"].keys() == shapes().keys()
    for file in set(index["weight_map"].values()):
        with safe_open(str(out / file), "pt") as f:
            names = [n for n, where in index["weight_map"].items() if where == file]
            assert sorted(f.keys()) == sorted(names)
            for name in names:
                tensor = f.get_slice(name)
                assert (tensor.get_dtype(), tuple(tensor.get_shape())) == ("BF16", shapes()[name]), name
    files = [p for p in out.iterdir() if p.suffix == ".safetensors"]
    headers = sum(8 + int.from_bytes(p.open("rb").read(8), "little") for p in files)
    assert sum(p.stat().st_size for p in files) == index["metadata"]["total_size"] + headers
    assert abs(index["metadata"]["total_size"] - FIGURES["checkpoint_bytes"]) < ROUNDING
    assert AutoConfig.from_pretrained(str(out)).text_config.num_hidden_layers == 35
    assert all(p.stat().st_mode & stat.S_IROTH for p in out.iterdir()) and os.access(out, os.X_OK)
    assert math.isclose(json.loads((out / folder.SUMMARY).read_text())["parameters"], e2b().parameters)
