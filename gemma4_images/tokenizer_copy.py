"""The BOS tokenizer copy an image bakes, made on the build host: a hub download uses HF_TOKEN in
this process only, so no token ever reaches a build arg, a layer, the history or a label."""

import shutil
from pathlib import Path

from .matrix import ROOT, Matrix
from .modules import load_file

STAGE = ROOT / ".build" / "tokenizer"
bos_tool = load_file("gemma4_bos_tokenizer", ROOT / "patches" / "gemma4-bos-tokenizer" / "apply.py")


class TokenizerError(Exception):
    pass


def stage(matrix: Matrix, name: str, source: str | None = None, stage_dir: Path = STAGE) -> tuple[Path, str]:
    """Fill .build/tokenizer/<target>/ (left empty when the target bakes no copy); returns the
    folder and a description of its source for the image's labels."""
    out = stage_dir / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if not matrix.targets[name].bos_tokenizer:
        return out, ""
    source = source or matrix.project.model
    try:
        bos_tool.make_bos_copy(source, out)
    except bos_tool.Refusal as e:
        raise TokenizerError(
            f"cannot make the BOS tokenizer copy from {source}: {e}\n"
            "No hub access? Pass --tokenizer-source with a local folder holding the "
            "model's tokenizer files."
        ) from None
    return out, source if not Path(source).exists() else f"local:{Path(source).name}"
