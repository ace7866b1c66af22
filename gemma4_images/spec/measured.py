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


def _checked(figures: dict, where: str, rerun: str) -> None:
    """Each figure a number of bytes a node could hold, at least its floor; else one line naming it."""
    for key, value in figures.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):  # JSON's true is Python's 1
            raise MatrixError(f"{RESULTS}: {where}.{key} is {json.dumps(value)}, not a number of bytes; {rerun}")
        floor = POD_MEMORY_FLOOR.get(key, 1)
        if not (math.isfinite(value) and floor <= value <= NODE_MEMORY_MAX):
            shown = value if isinstance(value, int) else f"{value:g}"
            raise MatrixError(
                f"{RESULTS}: {where}.{key} is {shown} bytes: give {floor} to 2**52 (4 PiB, more than any node holds); "
                f"{rerun}"
            )


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
    _checked(figures, "pod.memory", rerun)
    return memory


def fullsize_memory() -> dict | None:
    """The CPU pod's working set serving random weights of E2B's shape under the recipe's load
    (bench/fullsize.py, `make bench BENCH_ARGS=--fullsize`): {"working_set": bytes, "kv_cache_gib": the
    VLLM_CPU_KVCACHE_SPACE it ran with}; None when not measured yet."""
    try:
        warm = json.loads(RESULTS.read_text())["fullsize"]["serving"]
    except (OSError, KeyError, TypeError, ValueError):
        return None
    try:
        started = warm["starts"][-1]
        figures = {"idle": started["idle"], "loaded": started["loaded"]}
        kv = warm["kv_cache_gib"]
    except (KeyError, TypeError, IndexError, ValueError):
        raise MatrixError(
            f"{RESULTS}: fullsize.serving lacks its working set; run `make bench BENCH_ARGS=--fullsize` again"
        ) from None
    _checked(figures, "fullsize.serving.starts[-1]", "run `make bench BENCH_ARGS=--fullsize` again")
    if isinstance(kv, bool) or not isinstance(kv, int) or kv < 0:
        raise MatrixError(f"{RESULTS}: fullsize.serving.kv_cache_gib is {json.dumps(kv)}, not a number of GiB")
    return {"working_set": max(figures.values()), "kv_cache_gib": kv}
