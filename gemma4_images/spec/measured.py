"""What `make bench` measured, read back where a figure sizes something: benchmarks.json is the
figures' one home (bench/suite.py writes it, BENCHMARKS.md is rendered from it)."""

from __future__ import annotations

import json

from gemma4_images.spec.matrix import ROOT, MatrixError

RESULTS = ROOT / "benchmarks.json"


def pod_memory() -> dict:
    """The CPU image's pod as bench/pod.py memory_bench measured it: the server's own working set
    ("server", bytes) and what one GiB of VLLM_CPU_KVCACHE_SPACE adds ("per_kv_gib", bytes)."""
    try:
        memory = json.loads(RESULTS.read_text())["pod"]["memory"]
        if all(isinstance(memory[key], (int, float)) and memory[key] > 0 for key in ("server", "per_kv_gib")):
            return memory
    except (OSError, KeyError, TypeError, ValueError):
        pass
    raise MatrixError(f"{RESULTS.name} has no pod memory figures: run `make bench` (its pod part) first")
