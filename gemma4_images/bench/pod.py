"""What a Kubernetes pod of the CPU image needs, measured: its memory as the kubelet counts it, split
into what the KV cache adds and what stays, and its start-up with vLLM's compile caches
(VLLM_CACHE_ROOT) in the container, on an empty volume and on a volume an earlier start filled.
`build.py k8s` sizes memory requests from the first (generate/k8s.py resources); the second is
what its compile-cache volume buys."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from gemma4_images.bench.figures import TARGET, ratio
from gemma4_images.generate.k8s import COMPILE_CACHE
from gemma4_images.spec import matrix
from gemma4_images.spec.image_code import gemma4_bench as harness
from testkit import trained

GiB = 2**30
# Two KV cache sizes: the slope between them is what one GiB of VLLM_CPU_KVCACHE_SPACE costs in
# working set (vLLM allocates it with torch.zeros, vllm/v1/worker/utils.py allocate_kv_cache, so
# it is resident); what stays at zero KV is the server itself plus the model's weights.
KV_GIB = (1, 3)
CACHE_ROUNDS = 3


def _weights_bytes(model: Path) -> int:
    return sum(f.stat().st_size for f in model.glob("*.safetensors"))


def memory_bench(log, m: matrix.Matrix, image: str) -> dict:
    """Working set idle and after the recipe's load (64 streams + 16 plain requests), at each of
    KV_GIB; the server's own part = the loaded working set at zero KV less the model's weights."""
    from gemma4_images.check import running, server, traffic

    model = trained.ensure()
    rows: list[dict] = []
    for kv in KV_GIB:
        customize = lambda c, kv=kv: c.with_env("VLLM_CPU_KVCACHE_SPACE", str(kv))  # noqa: E731
        # Compiled, as a pod runs the recipe's launch (no --enforce-eager): its graphs count too.
        with server.serve(m, TARGET, image, str(model), eager=False, keep_compiles=False, customize=customize) as srv:
            traffic.run(srv.url, srv.served, **traffic.WARM_UP)
            idle = running.working_set_bytes(srv.container)
            traffic.run(srv.url, srv.served, **traffic.RECIPE_LOAD)
            loaded = running.working_set_bytes(srv.container)
        rows.append({"kv_gib": kv, "idle": idle, "loaded": loaded})
        log(f"bench: pod memory, KV {kv} GiB: working set {idle / GiB:.2f} GiB idle, {loaded / GiB:.2f} GiB loaded")
    return {"image": image, "rows": rows, **memory_figures(rows, _weights_bytes(model))}


def memory_figures(rows: list[dict], weights: int) -> dict:
    """From the loaded working sets at two KV sizes: the slope per GiB of KV cache; what a GiB
    costs (the slope, but never less than a GiB: vLLM zero-fills the cache, torch.zeros in
    vllm/v1/worker/utils.py allocate_kv_cache, so all of it is resident, and two points of a working
    set that also holds file pages are noisy); the server's own part at zero KV, less the weights."""
    a, b = rows[0], rows[-1]
    slope = (b["loaded"] - a["loaded"]) / (b["kv_gib"] - a["kv_gib"])
    per_kv_gib = max(slope, GiB)
    return {
        "slope": slope,
        "per_kv_gib": per_kv_gib,
        "weights": weights,
        "server": a["loaded"] - a["kv_gib"] * per_kv_gib - weights,
    }


def _fresh_volume(root: Path, name: str) -> Path:
    path = root / name
    path.mkdir()
    path.chmod(0o777)  # the CPU tier serves as uid 2000, as the pod does (fsGroup there)
    return path


def du(path: Path) -> int:
    """The bytes of every file under path."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def compile_cache_bench(log, m: matrix.Matrix, image: str, rounds: int = CACHE_ROUNDS) -> dict:
    """Time to /health with vLLM compiling (no --enforce-eager, as the recipe and a pod launch it):
    no volume (its caches in the container, gone with it), an empty volume at VLLM_CACHE_ROOT (a
    pod's first start), then the same volume again (every later start with --compile-cache-pvc, or a
    restarted container with the emptyDir). Each round in that order; medians compared."""
    from gemma4_images.check import server, smoke

    model = str(trained.ensure())
    times: dict[str, list[float]] = {"none": [], "cold": [], "warm": []}
    loaded_from_cache: list[bool] = []
    root = Path(tempfile.mkdtemp(prefix="gemma4-bench-cache-"))
    try:
        for n in range(rounds):
            volume = _fresh_volume(root, f"round{n}")

            def on_volume(c, volume=volume):
                c.with_volume_mapping(str(volume), COMPILE_CACHE, "rw")
                c.with_env("VLLM_CACHE_ROOT", COMPILE_CACHE)

            for kind, customize in (("none", None), ("cold", on_volume), ("warm", on_volume)):
                # keep_compiles False: none of this machine's compile caches (the smoke keeps one
                # for inductor's headers in /tmp), as a pod's /tmp is a fresh emptyDir.
                with server.serve(
                    m, TARGET, image, model, eager=False, keep_compiles=False, customize=customize
                ) as srv:
                    times[kind].append(srv.seconds_to_healthy)
                log_text = "\n".join(srv.final_log)
                if kind == "warm":
                    loaded_from_cache.append(bool(smoke.COMPILE_LOADED.search(log_text)))
            size = du(volume)
            log(
                f"bench: compile cache round {n + 1}/{rounds}: none {times['none'][-1]:.1f} s, "
                f"cold {times['cold'][-1]:.1f} s, warm {times['warm'][-1]:.1f} s ({size / 2**20:.1f} MiB cached)"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    return {
        "image": image,
        "rounds": times,
        "median": med,
        "warm_over_none": ratio(med["warm"], med["none"]),
        "cold_over_none": ratio(med["cold"], med["none"]),
        "cache_bytes": size,
        "loaded_from_cache": loaded_from_cache,
        "cpus": os.cpu_count(),
    }


def pod_bench(log, m: matrix.Matrix, image: str | None = None) -> dict:
    image = image or m.tiny_tag(TARGET)
    return {"memory": memory_bench(log, m, image), "compile_cache": compile_cache_bench(log, m, image)}


def section(pod: dict) -> list[str]:
    mem, cc = pod["memory"], pod["compile_cache"]
    mem_rows = [("VLLM_CPU_KVCACHE_SPACE (GiB)", "working set idle (GiB)", "after the recipe's load (GiB)")]
    mem_rows += [(str(r["kv_gib"]), f"{r['idle'] / GiB:.2f}", f"{r['loaded'] / GiB:.2f}") for r in mem["rows"]]
    cc_rows = [("round", "no volume (s)", "empty volume (s)", "warm volume (s)")]
    cc_rows += [
        (str(i + 1), f"{a:.1f}", f"{b:.1f}", f"{c:.1f}")
        for i, (a, b, c) in enumerate(zip(cc["rounds"]["none"], cc["rounds"]["cold"], cc["rounds"]["warm"]))
    ]
    cc_rows.append(("median", *(f"{cc['median'][k]:.1f}" for k in ("none", "cold", "warm"))))
    return [
        "## What a pod needs (CPU image, tiny model)",
        "",
        f"`{mem['image']}` served as a pod runs it (uid 2000, vLLM compiling: no `--enforce-eager`); memory is "
        "the container's working set "
        "as the kubelet counts it (cgroup usage less inactive file pages), idle after a warm-up of two streams and "
        "again after the recipe's 64 streams + 16 plain requests, at two KV cache sizes.",
        "",
        harness._markdown(mem_rows),
        "",
        f"Between the two sizes the working set grew {mem['slope'] / GiB:.2f} GiB per GiB of KV cache; vLLM "
        f"zero-fills the cache, so a GiB counts {mem['per_kv_gib'] / GiB:.2f} GiB (never less than whole). "
        f"Without KV cache and without the tiny model's weights ({mem['weights'] / 2**20:.0f} MiB), the server "
        f"itself takes **{mem['server'] / GiB:.2f} GiB** loaded: `build.py k8s` asks for that plus the "
        "E2B checkpoint plus the pod's KV cache (docs/kubernetes.md).",
        "",
        "Start-up with vLLM compiling (the recipe's launch: no `--enforce-eager`) to the first 200 on "
        f"`/health`, {len(cc['rounds']['none'])} rounds: vLLM's caches in the container, on an empty "
        f"volume at `VLLM_CACHE_ROOT={COMPILE_CACHE}` (a pod's first start) and on that volume again "
        "(a restarted container, or any later pod with `--compile-cache-pvc`).",
        "",
        harness._markdown(cc_rows),
        "",
        f"Warm volume / no volume: **{cc['warm_over_none']:.2f}x**; empty volume / no volume: "
        f"{cc['cold_over_none']:.2f}x. The volume held {cc['cache_bytes'] / 2**20:.1f} MiB; every warm start "
        f"logged that it loaded the compiled graph from the cache: "
        f"{'yes' if all(cc['loaded_from_cache']) else 'NO'}. On {cc['cpus']} cores, the tiny model: "
        "E2B compiles more graphs for longer, so the seconds saved grow with it.",
        "",
    ]
