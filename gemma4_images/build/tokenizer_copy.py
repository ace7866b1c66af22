"""The BOS tokenizer copy an image bakes, made on the build host: a hub download uses HF_TOKEN in
this process only, so no token ever reaches a build arg, a layer, the history or a label."""

import json
import os
import shutil
from importlib import metadata
from pathlib import Path

from gemma4_images.spec.matrix import ROOT, Matrix
from gemma4_images.spec.modules import load_file
from gemma4_images.spec.upstream import file_sha256

STAGE = ROOT / ".build" / "tokenizer"
bos_tool = load_file("gemma4_bos_tokenizer", ROOT / "patches" / "gemma4-bos-tokenizer" / "apply.py")


class TokenizerError(Exception):
    pass


def stage(matrix: Matrix, name: str, source: str | None = None, stage_dir: Path = STAGE) -> tuple[Path, str]:
    """Fill .build/tokenizer/<target>/ (left empty when the target bakes no copy); returns the
    folder and a description of its source for the image's labels."""
    out = stage_dir / name
    source = source or matrix.project.model
    label = source if not Path(source).exists() else f"local:{Path(source).name}"
    made_from = stage_dir / f".{name}.made-from.json"  # beside the folder: the folder enters the image
    inputs = _local_inputs(source) if matrix.targets[name].bos_tokenizer else None
    if inputs and _kept(out, made_from, inputs):
        return out, label
    made_from.unlink(missing_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if not matrix.targets[name].bos_tokenizer:
        return out, ""
    # The build venv has no torch (requirements/build.lock: tokenizers need none), and transformers'
    # advice at import that it found none would be the only warning in a clean build's output.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        bos_tool.make_bos_copy(source, out)
    except bos_tool.Refusal as e:
        raise TokenizerError(
            f"cannot make the BOS tokenizer copy from {source}: {e}\n"
            "No hub access? Pass --tokenizer-source with a local folder holding the "
            "model's tokenizer files."
        ) from None
    if inputs:
        made_from.write_text(json.dumps(inputs, indent=1) + "\n")
    return out, label


def _local_inputs(source: str) -> dict | None:
    """What the copy of a local folder is made from: its tokenizer files, the tool, and the
    libraries its check loads the copy with. None for a hub id (made again every build)."""
    folder = Path(source)
    if not folder.is_dir():
        return None
    return {
        "source": str(folder.resolve()),
        "files": {n: file_sha256(folder / n) for n in bos_tool.TOKENIZER_FILES if (folder / n).is_file()},
        "tool": file_sha256(Path(bos_tool.__file__)),
        "libraries": {d: _version(d) for d in ("transformers", "tokenizers")},
    }


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:  # the tool then refuses, in one line, to make the copy
        return None


def _kept(out: Path, made_from: Path, inputs: dict) -> bool:
    """The copy in out was made (and checked) from these very inputs, and is as the tool wrote it:
    exactly the files its record lists, with the digests it lists. Saves the check's ~9 s of
    importing transformers on every build of an unchanged tokenizer."""
    try:
        if json.loads(made_from.read_text()) != inputs:
            return False
        record = json.loads((out / bos_tool.RECORD).read_text())
    except (OSError, ValueError):
        return False
    files = record.get("files", {})
    present = {p.name for p in out.iterdir()}
    return present == {*files, bos_tool.RECORD} and all(file_sha256(out / n) == f["sha256"] for n, f in files.items())
