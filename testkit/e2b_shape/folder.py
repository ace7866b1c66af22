"""The model folder: config, generation config, sharded weights, tokenizer, chat template, processor config."""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

from testkit import tiny_gemma4

from . import facts, shards, tensors, vocab

WHAT = "random weights of E2B's shape (Gemma 4 E2B's configuration, seeded random values): not Gemma 4"
SUMMARY = "e2b-shape.json"


class Plan:
    """What a folder will hold, known before anything is written: the meta model's tensors and their size."""

    def __init__(self):
        self.config = facts.model_config()
        model = tensors.meta_model(self.config)
        self.specs = tensors.tensor_specs(model)
        self.parameters = tensors.parameter_count(model)
        self.weight_bytes = sum(spec.numel for spec in self.specs) * shards.BYTES_PER_VALUE


def write(out: Path, plan: Plan, seed: int) -> dict:
    """Fill out (an empty folder); returns the summary it also writes to e2b-shape.json."""
    from transformers import GenerationConfig

    start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    plan.config.dtype = "bfloat16"  # the published checkpoint's dtype, as config.json states it
    plan.config.save_pretrained(out)
    GenerationConfig(**facts.values("generation")).save_pretrained(out)
    index = shards.write_checkpoint(out, plan.specs, seed)
    tiny_gemma4.write_tokenizer_files(out, vocab.build_tokenizer())
    summary = {
        "what": WHAT,
        "seed": seed,
        "parameters": plan.parameters,
        "tensors": len(index["weight_map"]),
        "weight_bytes": index["metadata"]["total_size"],
        "shards": len(set(index["weight_map"].values())),
        "seconds": round(time.monotonic() - start, 1),
        # Linux reports ru_maxrss in KiB.
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary
