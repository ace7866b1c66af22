"""What `make bench` measured, read back where a figure sizes something: benchmarks.json is the
figures' one home (bench/suite.py writes it, BENCHMARKS.md is rendered from it)."""

from __future__ import annotations

import json
import math

from gemma4_images.spec.matrix import ROOT, MatrixError

RESULTS = ROOT / "benchmarks.json"
GiB = 2**30
# 52-bit physical addresses bound any node's memory (Intel SDM 3A 4.1.4: MAXPHYADDR <= 52; arm64 PARange <= 52 bits).
NODE_MEMORY_MAX = 2**52  # 4 PiB
# The least each figure can be (bytes): a server uses some memory; a GiB of KV cache counts at least
# whole (bench/pod.py: vLLM zero-fills the cache, so every page of it is resident).
POD_MEMORY_FLOOR = {"server": 1, "per_kv_gib": GiB}


def pod_memory() -> dict:
    """The CPU image's pod as bench/pod.py memory_bench measured it: the server's own working set
    ("server", bytes) and what one GiB of VLLM_CPU_KVCACHE_SPACE adds ("per_kv_gib", bytes); a
    figure that is not a number of bytes a node could hold is one line naming it."""
    rerun = "run `make bench` (its pod part) again"
    try:
        memory = json.loads(RESULTS.read_text())["pod"]["memory"]
        figures = {key: memory[key] for key in POD_MEMORY_FLOOR}
    except (OSError, KeyError, TypeError, ValueError):
        raise MatrixError(f"{RESULTS.name} has no pod memory figures: run `make bench` (its pod part) first") from None
    for key, value in figures.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):  # JSON's true is Python's 1
            raise MatrixError(f"{RESULTS}: pod.memory.{key} is {json.dumps(value)}, not a number of bytes; {rerun}")
        if not (math.isfinite(value) and POD_MEMORY_FLOOR[key] <= value <= NODE_MEMORY_MAX):
            shown = value if isinstance(value, int) else f"{value:g}"
            raise MatrixError(
                f"{RESULTS}: pod.memory.{key} is {shown} bytes: give {POD_MEMORY_FLOOR[key]} to 2**52 (4 PiB, "
                f"more than any node holds); {rerun}"
            )
    return memory
