#!/usr/bin/env python3
"""Write a copy of a Gemma 4 instruct tokenizer that adds <bos> to raw prompts.

    apply.py MODEL OUT [--revision REV]

MODEL is a local model folder or a Hugging Face hub id (downloaded with HF_TOKEN from the
environment; only tokenizer files and config.json are fetched). OUT receives only those files plus
a ``gemma4-bos.json`` record, never weights. Serve with ``vllm serve MODEL --tokenizer OUT``.

Why: the instruct repo's tokenizer.json has a post-processor that adds nothing, so
``/v1/completions`` prompts reach the model without <bos> and degrade. Its chat template writes
``{{ bos_token }}`` itself and vLLM encodes chat prompts with add_special_tokens=False, so adding
<bos> in the post-processor fixes raw prompts without doubling it on chat requests. Setting
``add_bos_token`` in tokenizer_config.json alone does nothing in transformers 5 (the
post-processor from tokenizer.json wins), so both are changed.

Exit codes: 0 written (or nothing to do), 1 refused or verification failed, 2 usage.
Runs on the build host (needs transformers, tokenizers, huggingface_hub), not in the image.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

TOOL = "gemma4-bos-tokenizer"
RECORD = "gemma4-bos.json"
REQUIRED = ("tokenizer.json", "tokenizer_config.json")
# config.json, unchanged: vLLM's tokenizer loader reads the model config from the tokenizer folder
# (vllm/tokenizers/registry.py get_tokenizer -> get_config(tokenizer, config_format="hf")), and
# without one it logs "ERROR ... Error parsing config for OUT" with two retries 2 s apart in every
# process that loads the tokenizer before it goes on.
OPTIONAL = ("special_tokens_map.json", "chat_template.jinja", "tokenizer.model", "config.json")
TOKENIZER_FILES = REQUIRED + OPTIONAL

# Pair form: "<bos> $A <bos> $B", i.e. what transformers itself builds for add_bos_token=True
# (TokenizersBackend.update_post_processor), so anything that later re-derives the template from
# add_bos_token reproduces this file exactly; each segment also starts like a document.
# vLLM's generate paths only use single sequences. An existing "<bos> $A $B" is accepted as-is.
SINGLE = ["<bos>:0", "$A:0"]
PAIR = ["<bos>:0", "$A:0", "<bos>:1", "$B:1"]
ACCEPTED_PAIRS = (["bos", "$A", "bos", "$B"], ["bos", "$A", "$B"])


class Refusal(Exception):
    """The input cannot be patched safely; the message names the problem and the fix."""


def make_bos_copy(model: str, out: str | os.PathLike, revision: str | None = None) -> dict:
    """Write the patched tokenizer copy of MODEL into OUT; return the record (also in OUT)."""
    out = Path(out).resolve()
    source, origin = _resolve_source(model, revision)
    missing = [name for name in REQUIRED if not (source / name).is_file()]
    if missing:
        raise Refusal(
            f"{model}: no {', '.join(missing)}. This tool patches a fast tokenizer "
            "(tokenizer.json + tokenizer_config.json); point MODEL at a folder or repo that has them."
        )

    tok_json = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    tok_config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    bos, bos_id = _bos_token(source, tok_json, tok_config)
    state = _post_processor_state(tok_json.get("post_processor"), bos, bos_id)

    changes, rewritten = [], {}  # rewritten: file name -> new JSON; every other file is copied as-is
    if state == "missing":
        tok_json["post_processor"] = _bos_template(bos, bos_id)
        rewritten["tokenizer.json"] = tok_json
        changes.append(
            f"tokenizer.json: post_processor now prepends {bos} (single '{bos} $A', pair '{bos} $A {bos} $B')"
        )
    if tok_config.get("add_bos_token") is not True:
        tok_config["add_bos_token"] = True
        rewritten["tokenizer_config.json"] = tok_config
        changes.append("tokenizer_config.json: add_bos_token true")
    already = not changes

    if out == source:
        if already:  # re-run on its own output in place: check it, write nothing
            return {
                "already_patched": True,
                "changes": [],
                "out": str(out),
                "out_unchanged": True,
                "verified": verify(out, bos_id),
            }
        raise Refusal(
            f"OUT is MODEL ({out}). This tool writes a separate tokenizer copy; choose another "
            "OUT and serve with --tokenizer OUT."
        )

    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".gemma4-bos-", dir=out.parent))
    try:
        written = []
        for name in TOKENIZER_FILES:
            if not (source / name).is_file():
                continue
            if name in rewritten:
                _write_json(stage / name, rewritten[name])
            else:
                shutil.copyfile(source / name, stage / name)  # byte-for-byte, no metadata
            written.append(name)
        verified = verify(stage, bos_id)  # raises before OUT is touched if the copy is wrong
        record = {
            "tool": TOOL,
            "source": origin,
            "bos_token": bos,
            "bos_token_id": bos_id,
            "already_patched": already,
            "changes": changes,
            "files": {
                name: {"sha256": _sha256(stage / name), "source_sha256": _sha256(source / name)} for name in written
            },
            "verified": verified,
        }
        _write_json(stage / RECORD, record)
        names = written + [RECORD]
        unchanged = all(
            (out / n).is_file() and (out / n).read_bytes() == (stage / n).read_bytes() for n in names
        ) and not any((out / n).is_file() for n in TOKENIZER_FILES if n not in names)
        if not unchanged:  # a re-run on the same input leaves OUT as it is, mtimes too
            _install(stage, out, names)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return dict(record, out=str(out), out_unchanged=unchanged)


NEEDS = "transformers, tokenizers and huggingface_hub"


def verify(folder: Path, bos_id: int) -> dict:
    """Load FOLDER as vLLM does and check where <bos> appears; raise Refusal if anything is off."""
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise Refusal(
            f"this tool needs {NEEDS} in the Python that runs it ({e}): "
            f"`{Path(sys.executable).name} -m pip install transformers tokenizers huggingface_hub`"
        ) from None

    tok = AutoTokenizer.from_pretrained(str(folder))
    text = "The capital of France is"
    problems = []
    with_special = tok(text)["input_ids"]
    if with_special[:1] != [bos_id] or with_special.count(bos_id) != 1:
        problems.append(
            f"encode with special tokens gave {with_special[:4]}..., expected exactly one <bos> ({bos_id}) first"
        )
    without = tok(text, add_special_tokens=False)["input_ids"]
    if bos_id in without:
        problems.append(f"encode without special tokens still contains <bos>: {without[:4]}...")
    chat = None
    if tok.chat_template:
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        chat = tok(rendered, add_special_tokens=False)["input_ids"]  # how vLLM's chat path encodes
        if chat[:1] != [bos_id] or chat.count(bos_id) != 1:
            problems.append(
                f"chat template path gave {chat[:4]}..., expected exactly one <bos> first "
                "(zero: the template does not write bos_token; two: it is doubled)"
            )
    if problems:
        raise Refusal("verification failed for " + str(folder) + ":\n  " + "\n  ".join(problems))
    return {
        "with_special_tokens": with_special[:3],
        "without_special_tokens": without[:3],
        "chat": None if chat is None else chat[:3],
        "chat_note": None if chat is not None else "no chat template; chat path not checked",
    }


def _resolve_source(model: str, revision: str | None) -> tuple[Path, dict]:
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve(), {"kind": "local", "path": str(path.resolve())}
    if path.is_absolute() or model.startswith(".") or model.count("/") != 1:
        raise Refusal(f"{model}: not a local folder, and not a hub id of the form owner/name.")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:
        raise Refusal(
            f"a hub id needs {NEEDS} in the Python that runs this tool ({e}): "
            f"`{Path(sys.executable).name} -m pip install transformers tokenizers huggingface_hub`, "
            "or pass a local folder"
        ) from None

    token = os.environ.get("HF_TOKEN") or None  # passed through only, never stored or printed
    try:
        local = snapshot_download(repo_id=model, revision=revision, allow_patterns=list(TOKENIZER_FILES), token=token)
    except Exception as exc:  # network, auth, missing repo: report without echoing the token
        message = f"{type(exc).__name__}: {exc}"
        if token:
            message = message.replace(token, "***")
        raise Refusal(
            f"{model}: download of the tokenizer files failed ({message}). For a gated repo set "
            "HF_TOKEN to a token with access, or pass a local folder."
        ) from None
    local = Path(local)
    return local, {"kind": "hub", "repo_id": model, "revision": revision, "commit": local.name}


def _bos_token(source: Path, tok_json: dict, tok_config: dict) -> tuple[str, int]:
    bos = tok_config.get("bos_token")
    if bos is None and (source / "special_tokens_map.json").is_file():
        bos = json.loads((source / "special_tokens_map.json").read_text(encoding="utf-8")).get("bos_token")
    if isinstance(bos, dict):
        bos = bos.get("content")
    if not bos:
        raise Refusal(
            "the tokenizer has no <bos> token (tokenizer_config.json names no bos_token), so there is "
            'nothing to prepend. Fix: use the model\'s own tokenizer; for Gemma 4 bos_token is "<bos>" (id 2).'
        )
    ids = {t["content"]: t["id"] for t in tok_json.get("added_tokens", [])}
    vocab = tok_json.get("model", {}).get("vocab")
    if bos not in ids and isinstance(vocab, dict) and bos in vocab:
        ids[bos] = vocab[bos]
    if bos not in ids:
        raise Refusal(
            f"the tokenizer has no <bos> token: bos_token {bos!r} is not in tokenizer.json. "
            'Fix: use the model\'s own tokenizer files unmodified (Gemma 4 has "<bos>" as id 2).'
        )
    return bos, ids[bos]


def _post_processor_state(pp: dict | None, bos: str, bos_id: int) -> str:
    """'missing' (none, or a template that adds nothing), 'bos' (already equivalent), else Refusal."""
    if pp is None:
        return "missing"
    if pp.get("type") == "TemplateProcessing":
        single, pair = _shape(pp.get("single"), bos), _shape(pp.get("pair"), bos)
        specials = pp.get("special_tokens") or {}
        if single == ["$A"] and pair == ["$A", "$B"] and not specials:
            return "missing"
        bos_only = set(specials) == {bos} and specials[bos].get("ids") == [bos_id]
        if single == ["bos", "$A"] and pair in ACCEPTED_PAIRS and bos_only:
            return "bos"
    raise Refusal(
        f"tokenizer.json already has a post-processor that is neither empty nor a plain {bos} "
        f"template: {json.dumps(pp)[:300]}. Refusing to replace it. Fix: check what it is for; if it "
        'should only prepend <bos>, set "post_processor" to null in a copy and run this tool on that copy.'
    )


def _shape(items, bos: str) -> list[str] | None:
    """Template items as "bos", "$A", "$B"; None if anything else (another special token) appears."""
    shape = []
    for item in items or []:
        if "Sequence" in item:
            shape.append("$" + item["Sequence"]["id"])
        elif "SpecialToken" in item and item["SpecialToken"]["id"] == bos:
            shape.append("bos")
        else:
            return None
    return shape


def _bos_template(bos: str, bos_id: int) -> dict:
    def item(spec: str) -> dict:
        name, type_id = spec.rsplit(":", 1)
        if name.startswith("$"):
            return {"Sequence": {"id": name[1:], "type_id": int(type_id)}}
        return {"SpecialToken": {"id": bos, "type_id": int(type_id)}}

    return {
        "type": "TemplateProcessing",
        "single": [item(s) for s in SINGLE],
        "pair": [item(s) for s in PAIR],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }


def _install(stage: Path, out: Path, names: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:  # drop tokenizer files left from an earlier, different source
        if name not in names and (out / name).is_file():
            (out / name).unlink()
    for name in names:
        os.replace(stage / name, out / name)


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="local model folder or hub id (owner/name)")
    parser.add_argument("out", help="folder for the patched tokenizer copy")
    parser.add_argument("--revision", help="hub revision (branch, tag or commit)")
    args = parser.parse_args(argv)
    try:
        record = make_bos_copy(args.model, args.out, revision=args.revision)
    except Refusal as exc:
        print(f"{TOOL}: refused: {exc}", file=sys.stderr)
        return 1
    if record["already_patched"]:
        print(
            f"{TOOL}: {args.model} already adds <bos>; nothing to change (no-op)"
            + ("" if record["out"] == str(Path(args.model).resolve()) else f"; copied as-is to {record['out']}")
        )
    elif record["out_unchanged"]:
        print(f"{TOOL}: {record['out']} is already up to date (no-op)")
    else:
        print(f"{TOOL}: wrote {record['out']}: " + "; ".join(record["changes"]))
    print(f"{TOOL}: verified: {json.dumps(record['verified'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
