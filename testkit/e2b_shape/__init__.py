"""Random weights of E2B's shape: a full-size model made here, to test serving at the real size, not Gemma 4.

`Gemma4ForConditionalGeneration` with Gemma 4 E2B's exact configuration (text, vision and audio towers;
e2b.json cites where each value comes from), seeded random bf16 values written straight to sharded
safetensors (about 10.2 GB), and a 262,144-entry tokenizer with Gemma 4's control tokens at their real
ids. Nothing is downloaded.

    from testkit import e2b_shape
    folder = e2b_shape.ensure()            # cached under the machine cache, made once (~10.2 GB)

`python -m testkit.e2b_shape [OUT_DIR] [--seed N]` writes OUT_DIR, or prints the cached folder.
"""

from .cache import NotEnoughRoom, ensure

__all__ = ["NotEnoughRoom", "ensure"]
