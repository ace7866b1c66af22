"""patches/gemma4-bos-tokenizer/apply.py on the tiny Gemma 4 tokenizer."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gemma4_images.build.tokenizer_copy import bos_tool as apply

pytestmark = pytest.mark.slow  # torch or tokenizers work: `make test-fast` leaves it out

ROOT = Path(__file__).resolve().parents[2]

APPLY = ROOT / "patches" / "gemma4-bos-tokenizer" / "apply.py"
BOS = 2
ALLOWED = {
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "tokenizer.model",
    "config.json",
    "gemma4-bos.json",
}
FAKE_TOKEN = "hf_FAKEtokenDoNotLeak0123456789abcdef"


@pytest.fixture(scope="session")
def source(tiny_dir) -> Path:
    return tiny_dir


@pytest.fixture(scope="session")
def patched(source, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("bos-out") / "tok"
    return out, apply.make_bos_copy(str(source), out)


def _tok(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def _copy_tokenizer(source: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in ALLOWED & {p.name for p in source.iterdir()}:
        shutil.copyfile(source / name, dest / name)
    return dest


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(APPLY), *map(str, args)], capture_output=True, text=True, env=env, timeout=300
    )


def test_source_lacks_bos_and_copy_adds_exactly_one(source, patched):
    out, record = patched
    assert BOS not in _tok(source)("Hello world")["input_ids"]  # the flaw being fixed
    ids = _tok(out)("Hello world")["input_ids"]
    assert ids[0] == BOS and ids.count(BOS) == 1
    assert record["already_patched"] is False and record["changes"]
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["add_bos_token"] is True


def test_no_bos_without_special_tokens(patched):
    out, _ = patched
    assert BOS not in _tok(out)("Hello world", add_special_tokens=False)["input_ids"]


def test_chat_path_has_exactly_one_bos(patched):
    out, _ = patched
    tok = _tok(out)
    messages = [{"role": "user", "content": "Hello"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]  # vLLM's chat path
    assert ids[0] == BOS and ids.count(BOS) == 1
    direct = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
    direct = list(direct["input_ids"] if isinstance(direct, dict) else direct)
    assert direct.count(BOS) == 1


def test_post_processor_and_record(source, patched):
    out, _ = patched
    pp = json.loads((out / "tokenizer.json").read_text())["post_processor"]
    assert pp["single"][0] == {"SpecialToken": {"id": "<bos>", "type_id": 0}}
    assert [next(iter(item)) for item in pp["pair"]] == ["SpecialToken", "Sequence", "SpecialToken", "Sequence"]
    assert pp["special_tokens"] == {"<bos>": {"id": "<bos>", "ids": [BOS], "tokens": ["<bos>"]}}
    record = json.loads((out / "gemma4-bos.json").read_text())
    assert record["source"] == {"kind": "local", "path": str(source.resolve())}
    assert record["bos_token_id"] == BOS and len(record["changes"]) == 2
    on_disk = {p.name for p in out.iterdir()} - {"gemma4-bos.json"}
    assert set(record["files"]) == on_disk
    for name, digests in record["files"].items():
        assert digests["sha256"] == hashlib.sha256((out / name).read_bytes()).hexdigest()
        assert digests["source_sha256"] == hashlib.sha256((source / name).read_bytes()).hexdigest()
    assert record["files"]["tokenizer.json"]["sha256"] != record["files"]["tokenizer.json"]["source_sha256"]
    assert record["files"]["chat_template.jinja"]["sha256"] == record["files"]["chat_template.jinja"]["source_sha256"]


def test_never_copies_weights_only_the_config_vllm_reads_beside_the_tokenizer(source, patched):
    out, _ = patched
    assert (source / "model.safetensors").is_file() and (source / "config.json").is_file()
    names = {p.name for p in out.iterdir()}
    assert names <= ALLOWED, names - ALLOWED
    assert "model.safetensors" not in names
    # vLLM's get_tokenizer reads config.json from the tokenizer folder; a copy without one makes it
    # log ERROR with retries at every start-up. It is the model's own file, byte for byte.
    assert (out / "config.json").read_bytes() == (source / "config.json").read_bytes()


def test_rerun_on_its_own_output_is_a_noop(source, patched, tmp_path):
    out, _ = patched
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    run = _cli(out, out)
    assert run.returncode == 0, run.stderr
    assert "no-op" in run.stdout
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == before

    copy = apply.make_bos_copy(str(out), tmp_path / "copy")
    assert copy["already_patched"] is True and copy["changes"] == []
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "copy" / name).read_bytes() == (out / name).read_bytes()

    again = apply.make_bos_copy(str(source), out)  # same source, same OUT: same bytes, untouched
    assert again["out_unchanged"] is True
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == before


def test_a_python_without_transformers_gets_one_line_saying_what_to_install(source, tmp_path):
    # -S: no site-packages, so transformers cannot be imported (the standard library still can).
    run = subprocess.run(
        [sys.executable, "-S", str(APPLY), str(source), str(tmp_path / "out")], capture_output=True, text=True
    )
    assert run.returncode == 1
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert "needs transformers, tokenizers and huggingface_hub" in run.stderr and "pip install" in run.stderr
    assert not (tmp_path / "out").exists()


def test_accepts_an_equivalent_bos_template_as_is(source, tmp_path):
    src = _copy_tokenizer(source, tmp_path / "src")
    _edit_json(
        src / "tokenizer.json",
        lambda d: d.update(
            post_processor={
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [
                    {"SpecialToken": {"id": "<bos>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                    {"Sequence": {"id": "B", "type_id": 1}},
                ],
                "special_tokens": {"<bos>": {"id": "<bos>", "ids": [BOS], "tokens": ["<bos>"]}},
            }
        ),
    )
    record = apply.make_bos_copy(str(src), tmp_path / "out")
    assert record["changes"] == ["tokenizer_config.json: add_bos_token true"]
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()


def assert_refused(run, out, *phrases):
    """A refusal: exit 1, a message with each phrase, nothing written."""
    assert run.returncode == 1
    assert all(phrase in run.stderr for phrase in phrases), run.stderr
    assert not out.exists()


def test_refuses_a_tokenizer_without_bos(source, tmp_path):
    src = _copy_tokenizer(source, tmp_path / "src")
    _edit_json(src / "tokenizer_config.json", lambda d: d.update(bos_token=None))
    _edit_json(src / "special_tokens_map.json", lambda d: d.pop("bos_token"))
    assert_refused(_cli(src, tmp_path / "out"), tmp_path / "out", "no <bos> token", "Fix:")


def test_refuses_a_bos_token_missing_from_the_vocabulary(source, tmp_path):
    src = _copy_tokenizer(source, tmp_path / "src")
    _edit_json(src / "tokenizer_config.json", lambda d: d.update(bos_token="<s>"))
    with pytest.raises(apply.Refusal, match="not in tokenizer.json"):
        apply.make_bos_copy(str(src), tmp_path / "out")


@pytest.mark.parametrize(
    "foreign",
    [
        {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<eos>", "type_id": 0}}],
            "pair": [
                {"Sequence": {"id": "A", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
                {"SpecialToken": {"id": "<eos>", "type_id": 1}},
            ],
            "special_tokens": {"<eos>": {"id": "<eos>", "ids": [1], "tokens": ["<eos>"]}},
        },
        {"type": "BertProcessing", "sep": ["<eos>", 1], "cls": ["<bos>", 2]},
    ],
    ids=["appends-eos", "bert"],
)
def test_refuses_a_foreign_post_processor(source, tmp_path, foreign):
    src = _copy_tokenizer(source, tmp_path / "src")
    _edit_json(src / "tokenizer.json", lambda d: d.update(post_processor=foreign))
    assert_refused(_cli(src, tmp_path / "out"), tmp_path / "out", "neither empty nor", "Fix:")


def test_fails_verification_when_the_chat_template_writes_no_bos(source, tmp_path):
    src = _copy_tokenizer(source, tmp_path / "src")
    template = (src / "chat_template.jinja").read_text().replace("{{- bos_token -}}", "")
    (src / "chat_template.jinja").write_text(template)
    _edit_json(src / "tokenizer_config.json", lambda d: d.update(chat_template=template))
    assert_refused(_cli(src, tmp_path / "out"), tmp_path / "out", "verification failed", "chat template")


def _assert_token_absent(folder: Path, *texts: str) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            assert FAKE_TOKEN.encode() not in path.read_bytes(), path
    for text in texts:
        assert FAKE_TOKEN not in text


def test_hf_token_in_environment_is_never_written(source, tmp_path):
    env = dict(os.environ, HF_TOKEN=FAKE_TOKEN, HF_HUB_OFFLINE="1")
    run = _cli(source, tmp_path / "out", env=env)
    assert run.returncode == 0, run.stderr
    _assert_token_absent(tmp_path / "out", run.stdout, run.stderr)


def test_hub_download_fetches_only_tokenizer_files_and_keeps_the_token_out(source, tmp_path, monkeypatch):
    import fnmatch

    import huggingface_hub

    calls = []

    def fake_snapshot_download(repo_id, revision=None, allow_patterns=None, token=None, **kwargs):
        calls.append({"repo_id": repo_id, "allow_patterns": allow_patterns, "token": token})
        snapshot = tmp_path / "cache" / "snapshots" / "0123abc"
        snapshot.mkdir(parents=True, exist_ok=True)
        for path in source.iterdir():
            if any(fnmatch.fnmatch(path.name, pattern) for pattern in allow_patterns):
                shutil.copyfile(path, snapshot / path.name)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    record = apply.make_bos_copy("google/gemma-4-E2B-it", tmp_path / "out")
    assert calls[0]["token"] == FAKE_TOKEN and calls[0]["repo_id"] == "google/gemma-4-E2B-it"
    assert not any(fnmatch.fnmatch("model.safetensors", p) for p in calls[0]["allow_patterns"])
    assert record["source"] == {
        "kind": "hub",
        "repo_id": "google/gemma-4-E2B-it",
        "revision": None,
        "commit": "0123abc",
    }
    assert BOS == _tok(tmp_path / "out")("Hi")["input_ids"][0]
    _assert_token_absent(tmp_path / "out", json.dumps(record))


def test_hub_failure_message_does_not_echo_the_token(tmp_path, monkeypatch):
    import huggingface_hub

    def failing(*args, **kwargs):
        raise RuntimeError(f"401 Unauthorized for token {kwargs.get('token')}")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", failing)
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    with pytest.raises(apply.Refusal) as refused:
        apply.make_bos_copy("google/gemma-4-E2B-it", tmp_path / "out")
    assert "401" in str(refused.value) and "HF_TOKEN" in str(refused.value)
    _assert_token_absent(tmp_path, str(refused.value))


# -- the build's staging of the copy (gemma4_images.tokenizer_copy.stage) -------------------------


@pytest.fixture
def staging(source, tmp_path, monkeypatch):
    """stage() for xeon6 (a BOS-copy target) from a private copy of the tiny tokenizer, counting
    how often the tool really makes the copy."""
    from gemma4_images.build import tokenizer_copy
    from gemma4_images.spec import matrix

    src = _copy_tokenizer(source, tmp_path / "src")
    made = []
    real = tokenizer_copy.bos_tool.make_bos_copy
    monkeypatch.setattr(tokenizer_copy.bos_tool, "make_bos_copy", lambda s, o: made.append(s) or real(s, o))
    m = matrix.load()

    def stage():
        out, label = tokenizer_copy.stage(m, "xeon6", str(src), stage_dir=tmp_path / "stage")
        assert label == "local:src" and (out / "gemma4-bos.json").is_file()
        return out

    return stage, src, made


def test_staging_an_unchanged_local_tokenizer_again_keeps_the_checked_copy(staging):
    stage, _, made = staging
    first = {p.name: p.read_bytes() for p in stage().iterdir()}
    again = {p.name: p.read_bytes() for p in stage().iterdir()}
    assert len(made) == 1 and again == first


@pytest.mark.parametrize(
    "change",
    ["source edited", "copy edited", "file added to the copy", "record deleted"],
)
def test_staging_makes_the_copy_again_after_any_change(staging, change):
    stage, src, made = staging
    out = stage()
    if change == "source edited":
        _edit_json(src / "tokenizer_config.json", lambda d: d.update(model_max_length=77))
    elif change == "copy edited":
        _edit_json(out / "tokenizer.json", lambda d: d.update(post_processor=None))
    elif change == "file added to the copy":
        (out / "leftover.txt").write_text("not the tool's")
    else:
        (out / "gemma4-bos.json").unlink()
    out = stage()
    assert len(made) == 2 and not (out / "leftover.txt").exists()
    assert json.loads((out / "tokenizer.json").read_text())["post_processor"] is not None
