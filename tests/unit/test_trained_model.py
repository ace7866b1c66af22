"""The tiny trained Gemma 4 (testkit): the committed weights answer every scripted exchange exactly
under transformers' greedy decoding, the folder is the random model's with those weights, and the
checks that say so can fail."""

from __future__ import annotations

import copy
import json

import pytest

from testkit import exchanges, greedy, prompts, tiny_model, train, trained

pytestmark = pytest.mark.slow  # torch or tokenizers work: `make test-fast` leaves it out


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Decoding this small a model on 2 shared cores: a second thread mostly waits at barriers
    (measured under load: the greedy tests took ~10x longer with torch's default of 2 threads)."""
    with train.fixed_threads(1):
        yield


@pytest.fixture(scope="module")
def folder():
    return trained.ensure()


@pytest.fixture(scope="module")
def seqs(folder):
    return train.sequences(folder)


@pytest.fixture(scope="module")
def tokenizer(folder):
    return prompts.load_tokenizer(folder)


def load(path, dtype):
    from transformers import Gemma4ForConditionalGeneration

    return Gemma4ForConditionalGeneration.from_pretrained(str(path), dtype=dtype).eval()


def test_fixture_was_trained_on_todays_script(seqs):
    # Any change to the exchanges, the rendering, the tokenizer, the config or testkit/train.py
    # changes this digest: the fixture must then be regenerated.
    assert trained.fixture_manifest()["inputs_sha256"] == train.inputs_digest(seqs), (
        "testkit/fixture is stale: run `python -m testkit.train --fixture` and commit testkit/fixture/"
    )


def test_every_exchange_and_template_is_a_training_sequence(seqs):
    names = {(p.exchange, p.template) for p in seqs}
    for ex in exchanges.EXCHANGES:
        wanted = {"served", "folder"} if ex.path == exchanges.CHAT else {"completion", "completion_without_bos"}
        assert {(ex.name, t) for t in wanted} <= names, ex.name
    assert all(p.target_ids[-1] in (1, 106) for p in seqs)  # each ends on a stop id
    # room to stop on its own: a max_tokens cut would still pass a tool-call answer check
    assert all(len(p.target_ids) < exchanges.GREEDY["max_tokens"] for p in seqs)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_greedy_transformers_reproduces_every_scripted_output(folder, seqs, tokenizer, dtype):
    import torch

    model = load(folder, getattr(torch, dtype))
    assert greedy.mismatches(model, seqs, tokenizer.decode) == []


def test_the_same_check_fails_on_the_random_weight_model(seqs, tokenizer):
    import torch

    model = load(tiny_model.ensure(), torch.bfloat16)
    served = [p for p in seqs if p.template in ("served", "completion")]  # one per exchange is enough
    problems = greedy.mismatches(model, served, tokenizer.decode)
    assert len(problems) == len(served) == len(exchanges.EXCHANGES), problems


def test_folder_is_the_random_models_with_the_trained_weights(folder):
    import hashlib

    random = tiny_model.ensure()
    same = {p.name for p in random.iterdir()} - {trained.WEIGHTS}
    assert {p.name for p in folder.iterdir()} == same | {trained.WEIGHTS, trained.MANIFEST}
    for name in same:
        assert (folder / name).read_bytes() == (random / name).read_bytes(), name
    weights = (folder / trained.WEIGHTS).read_bytes()
    assert hashlib.sha256(weights).hexdigest() == trained.fixture_manifest()["weights_sha256"]
    assert weights != (random / trained.WEIGHTS).read_bytes()
    assert all(p.stat().st_mode & 0o004 for p in folder.iterdir())  # served as UID 2000
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"


def test_a_fixture_that_does_not_match_its_manifest_is_refused(tmp_path):
    (tmp_path / trained.WEIGHTS).write_bytes(b"not the weights")
    (tmp_path / trained.MANIFEST).write_text(json.dumps(trained.fixture_manifest()))
    with pytest.raises(RuntimeError, match="python -m testkit.train --fixture"):
        trained.ensure(tmp_path)


def test_training_that_does_not_reproduce_the_script_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(train, "STEPS", 2)
    out = tmp_path / "model"
    with pytest.raises(train.TrainingFailed, match="does not reproduce the script after 2 steps"):
        train.train(out, log=lambda line: None)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_the_cli_will_not_replace_a_directory_it_did_not_write(tmp_path, capsys):
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    assert train.main([str(mine)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a model folder this script wrote" in err
    assert (mine / "keep.txt").read_text() == "mine" and len(list(mine.iterdir())) == 1


# -- Exchange.mismatch: the comparison the smoke tier makes ---------------------------------------


def scripted(ex: exchanges.Exchange) -> dict:
    """A response carrying exactly the scripted answer, shaped as vLLM sends it."""
    e = ex.expected
    if ex.path == exchanges.COMPLETIONS:
        return {"choices": [{"index": 0, "text": e["text"], "finish_reason": e["finish_reason"]}]}
    calls = [{"id": f"call_{i}", "type": "function", "function": dict(c)} for i, c in enumerate(e["tool_calls"])]
    message = {
        "role": "assistant",
        "content": e["content"],
        "reasoning": e["reasoning"],
        **({"tool_calls": calls} if calls else {}),
    }
    return {"choices": [{"index": 0, "message": message, "finish_reason": e["finish_reason"]}]}


@pytest.mark.parametrize("ex", exchanges.EXCHANGES, ids=lambda ex: ex.name)
def test_the_scripted_answer_matches(ex):
    assert ex.mismatch(scripted(ex)) is None


def test_a_different_answer_is_named():
    chat = exchanges.BY_NAME["chat"]
    wrong = scripted(chat)
    wrong["choices"][0]["message"]["content"] = "Lyon."
    assert chat.mismatch(wrong) == "chat: content 'Lyon.' (expected 'Paris.')"
    thinking = exchanges.BY_NAME["thinking"]
    merged = scripted(thinking)  # a server without the reasoning parser: all of it is content
    merged["choices"][0]["message"].update(reasoning=None, content=thinking.output)
    assert "reasoning None" in thinking.mismatch(merged) and "content" in thinking.mismatch(merged)
    assert "not an OpenAI" in chat.mismatch({"error": {"message": "boom"}})


def test_tool_arguments_with_the_models_backslashes_do_not_match():
    # What vLLM 0.30.0's gemma4 parser returns without the buffered-tool-args fix: the value
    # between <|"|> delimiters verbatim, backslashes included.
    ex = exchanges.BY_NAME["tool_call_quote"]
    unfixed = copy.deepcopy(scripted(ex))
    unfixed["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = json.dumps(
        {"to": "Bob", "text": 'She said \\"hi\\".'}, ensure_ascii=False
    )
    assert "tool_calls" in ex.mismatch(unfixed)
    assert json.loads(ex.expected["tool_calls"][0]["arguments"])["text"] == 'She said "hi".'
    assert '\\"hi\\"' in ex.output  # the model writes the escaped form


def test_a_completion_without_bos_does_not_match():
    ex = exchanges.BY_NAME["completion"]
    answer = scripted(ex)
    answer["choices"][0]["text"] = ex.output_without_bos
    assert ex.mismatch(answer).startswith("completion: text ' unknown (no BOS).'")
