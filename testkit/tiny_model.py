"""The tiny random-weight Gemma 4, cached once per machine: the starting point of the trained one
(testkit.trained), the source of the tiny tokenizer that test images bake, and the model for
tests that need weights nobody taught anything.

Seed 0's folder is committed (testkit/fixture/random/, what `python -m testkit.tiny_gemma4
testkit/fixture/random --seed 0` writes, byte for byte, on the torch and CPU capability
testkit/fixture/random.json records; tests/unit/test_tiny_gemma4.py fails when it drifts), so
making it is a copy: writing it imports torch and transformers (~19 s on 2 cores)."""

import hashlib
import shutil
import tempfile
from pathlib import Path

from gemma4_images.spec.upstream import cache_dir

from . import tiny_gemma4

SEED = 0
FIXTURE = Path(__file__).resolve().parent / "fixture" / "random"
# What the cached folder was made from, kept in it: a folder made from an older fixture (or, for
# another seed, an older tiny_gemma4.py) is made again.
MADE_FROM = ".made-from"


def made_from(seed: int = SEED) -> str:
    h = hashlib.sha256()
    if seed == SEED:
        for path in sorted(FIXTURE.iterdir()):
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    else:
        h.update(Path(tiny_gemma4.__file__).read_bytes())
    return h.hexdigest()


def stamped(folder: Path, key: str) -> bool:
    """folder was made from key (its MADE_FROM says so)."""
    stamp = folder / MADE_FROM
    return stamp.is_file() and stamp.read_text() == key


def replace_whole(out: Path, fill) -> Path:
    """fill(folder) in a new folder beside out, then that folder in out's place: out is never
    half made."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        folder = Path(tmp) / "model"
        fill(folder)
        shutil.rmtree(out, ignore_errors=True)
        folder.rename(out)
    return out


def readable(folder: Path) -> Path:
    """Readable by any user: the CPU smoke tier serves as UID 2000."""
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return folder


def ensure(seed: int = SEED) -> Path:
    """A folder with config, weights and tokenizer, readable by any user (smoke runs as UID 2000)."""
    out = cache_dir() / f"tiny-gemma4-seed{seed}"
    key = made_from(seed)
    if not stamped(out, key):

        def fill(folder: Path) -> None:
            if seed == SEED:
                shutil.copytree(FIXTURE, folder)
            else:
                tiny_gemma4.write_tiny_gemma4(folder, seed=seed)
            (folder / MADE_FROM).write_text(key)

        replace_whole(out, fill)
    return readable(out)
