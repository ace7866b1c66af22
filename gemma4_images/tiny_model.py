"""The tiny random-weight Gemma 4 the CPU smoke tier serves, made once per machine and cached."""
from pathlib import Path

from .tiny_gemma4 import write_tiny_gemma4
from .upstream import cache_dir

SEED = 0


def ensure(seed: int = SEED) -> Path:
    """A folder with config, weights and tokenizer, readable by any user (smoke runs as UID 2000)."""
    out = cache_dir() / f"tiny-gemma4-seed{seed}"
    if not (out / "model.safetensors").exists():
        write_tiny_gemma4(out, seed=seed)
    for path in [out, *out.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return out
