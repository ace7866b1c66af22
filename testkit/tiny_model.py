"""The tiny random-weight Gemma 4, made once per machine and cached: the starting point of the
trained one (testkit.trained), the source of the tiny tokenizer that test images bake, and the
model for tests that need weights nobody taught anything."""

from pathlib import Path

from gemma4_images.upstream import cache_dir

from .tiny_gemma4 import write_tiny_gemma4

SEED = 0


def ensure(seed: int = SEED) -> Path:
    """A folder with config, weights and tokenizer, readable by any user (smoke runs as UID 2000)."""
    out = cache_dir() / f"tiny-gemma4-seed{seed}"
    if not (out / "model.safetensors").exists():
        write_tiny_gemma4(out, seed=seed)
    for path in [out, *out.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return out
