"""The folder under the machine cache, made once per set of inputs, checked for room before it is made."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import shutil
from contextlib import contextmanager
from pathlib import Path

from gemma4_images.spec.upstream import cache_dir
from testkit import tiny_gemma4
from testkit.tiny_model import MADE_FROM, readable, replace_whole, stamped

from . import folder

PACKAGE = Path(__file__).resolve().parent
PREFIX = "e2b-shape"
SEED = 0
# Room beyond the weights for the tokenizer (19 MB), configs and the filesystem's own blocks.
DISK_MARGIN = 256 * 2**20
# A write's peak RSS measured 0.68 GiB (torch, the meta model, one 128 MiB chunk, the tokenizer): 2 GiB is 3x that.
MEMORY_NEEDED = 2 * 2**30


class NotEnoughRoom(RuntimeError):
    """Free disk or available memory is short of what writing the folder needs."""


# The command and this module decide where the folder goes and what room it needs, not what it holds:
# editing them must not make the next ensure() write 10 GB again.
NOT_CONTENT = ("__main__.py", "cache.py")


def made_from(seed: int = SEED) -> str:
    """A hash of every input: the facts, this package's generating code, the tokenizer code it reuses, the seed and the
    versions of the libraries whose random generator and file formats the values depend on."""
    h = hashlib.sha256(f"seed={seed}\0".encode())
    content = [p for p in sorted(PACKAGE.glob("*.py")) if p.name not in NOT_CONTENT]
    for path in content + [PACKAGE / "e2b.json", Path(tiny_gemma4.__file__)]:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    for dist in ("torch", "transformers", "tokenizers"):
        h.update(f"{dist}={importlib.metadata.version(dist)}\0".encode())
    return h.hexdigest()


def available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def preflight(where: Path, weight_bytes: int) -> None:
    """Raise NotEnoughRoom, one line naming what is needed and what is free, before anything is written."""
    disk, free = weight_bytes + DISK_MARGIN, shutil.disk_usage(where).free
    if free < disk:
        raise NotEnoughRoom(
            f"random weights of E2B's shape need {disk / 1e9:.1f} GB of free disk in {where}; {free / 1e9:.1f} GB free"
        )
    memory = available_memory()
    if memory < MEMORY_NEEDED:
        raise NotEnoughRoom(
            f"random weights of E2B's shape need {MEMORY_NEEDED / 2**30:.1f} GiB of available memory to be written; "
            f"{memory / 2**30:.1f} GiB available"
        )


@contextmanager
def _locked(root: Path):
    """One writer per cache at a time, so a temporary folder found under the lock is a dead writer's."""
    with (root / f".{PREFIX}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def write_whole(out: Path, seed: int, key: str | None = None) -> dict:
    """The folder written into a temporary one beside out (stamped with key), then renamed to out: out is
    never half made."""
    plan = folder.Plan()
    out.parent.mkdir(parents=True, exist_ok=True)
    preflight(out.parent, plan.weight_bytes)
    summary: dict = {}

    def fill(tmp: Path) -> None:
        summary.update(folder.write(tmp, plan, seed))
        if key:
            (tmp / MADE_FROM).write_text(key)

    replace_whole(out, fill)
    return summary


def cached(seed: int = SEED) -> Path | None:
    """The folder for seed if it is in the cache, whole and made from today's inputs."""
    key = made_from(seed)
    out = cache_dir() / f"{PREFIX}-seed{seed}-{key[:16]}"
    return out if stamped(out, key) else None


def ensure(seed: int = SEED) -> Path:
    """The cached folder for seed, made if it is missing or was made from other inputs; readable by any user
    (the CPU image serves as UID 2000)."""
    root, key = cache_dir(), made_from(seed)
    out = root / f"{PREFIX}-seed{seed}-{key[:16]}"
    with _locked(root):
        if not stamped(out, key):
            # A dead writer's temporary folders, and this seed's folders made from older inputs: 10 GB each.
            stale = [*root.glob(f".{PREFIX}-*"), *(p for p in root.glob(f"{PREFIX}-seed{seed}-*") if p != out)]
            for path in stale:
                shutil.rmtree(path, ignore_errors=True)
            write_whole(out, seed, key)
    return readable(out)


def remove() -> list[Path]:
    """Every cached folder of every seed and any dead writer's temporary one (10 GB each): what the
    full-size tier leaves behind."""
    root = cache_dir()
    with _locked(root):
        gone = [*root.glob(f".{PREFIX}-*"), *root.glob(f"{PREFIX}-seed*")]
        for path in gone:
            shutil.rmtree(path, ignore_errors=True)
    return gone
