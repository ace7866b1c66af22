"""The tiny trained Gemma 4 as a model folder the smoke tier can serve.

The weights are committed (testkit/fixture/, ~1.5 MB, made by `python -m testkit.train --fixture`);
everything else in the folder is what testkit.tiny_gemma4 writes for the random model, so
config, tokenizer, chat template and processor config are the random model's, byte for byte.
Made once per machine in the machine cache, keyed by the weights' digest.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from gemma4_images.spec.upstream import cache_dir
from testkit import tiny_model
from testkit.tiny_model import readable

SEED = 0  # the random model's seed: its weights are the training's starting point
FIXTURE = Path(__file__).resolve().parent / "fixture"
WEIGHTS = "model.safetensors"
MANIFEST = "manifest.json"  # how the weights were made (testkit.train), copied into the folder


def fixture_manifest(folder: Path = FIXTURE) -> dict:
    """How the weights in folder (the fixture, or a model folder) were made."""
    return json.loads((folder / MANIFEST).read_text())


def replaceable(out_dir: Path) -> bool:
    """Absent, empty, or a folder assemble() wrote: never someone's directory that happens to be there."""
    out_dir = Path(out_dir)
    return not out_dir.exists() or (out_dir.is_dir() and (not any(out_dir.iterdir()) or (out_dir / MANIFEST).exists()))


def assemble(out_dir: Path, weights: Path, manifest: dict) -> Path:
    """The random model's folder with these weights in place of its own; replaces out_dir whole."""
    out_dir = Path(out_dir)
    if not replaceable(out_dir):
        raise FileExistsError(f"{out_dir} exists and is not a model folder testkit wrote")

    def fill(folder: Path) -> None:
        # The random model's folder as tiny_model caches it (the committed copy of what
        # tiny_gemma4 writes, stamped with its digest).
        shutil.copytree(tiny_model.ensure(SEED), folder)
        shutil.copyfile(weights, folder / WEIGHTS)
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        readable(folder)

    return tiny_model.replace_whole(out_dir, fill)


def ensure(fixture: Path = FIXTURE) -> Path:
    """The folder (config, weights, tokenizer, chat template, processor config), made if missing."""
    weights = fixture / WEIGHTS
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    manifest = fixture_manifest(fixture)
    if manifest["weights_sha256"] != digest:
        raise RuntimeError(
            f"{weights} is not the file {fixture / MANIFEST} describes "
            "(regenerate both with: python -m testkit.train --fixture)"
        )
    out = cache_dir() / f"tiny-gemma4-trained-{digest[:12]}"
    made = out / MANIFEST  # the folder is whole when it holds the fixture's record (renamed in whole)
    if (
        not made.exists()
        or json.loads(made.read_text()) != manifest
        or not tiny_model.stamped(out, tiny_model.made_from())
    ):
        assemble(out, weights, manifest)
    return readable(out)
