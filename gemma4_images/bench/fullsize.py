"""Random weights of E2B's shape (testkit.e2b_shape: Gemma 4 E2B's exact configuration, 5.1B
parameters, 10.2 GB of bf16) served by the CPU image as a pod runs the recipe's launch, measured:
start-up to /health on an empty and on a warm compile-cache volume, the KV capacity vLLM reports,
the working set idle and under load, decode and prefill tokens/s, and the recipe's fast-prefill
against stock with its offline harness at E2B's shape (sizes scaled to 2 cores, the scale stated).
Random weights prove size, memory and speed, not answers."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from gemma4_images.bench import harness
from gemma4_images.bench.figures import TARGET, ratio
from gemma4_images.build import images, localbase
from gemma4_images.generate.k8s import COMPILE_CACHE
from gemma4_images.spec import matrix
from gemma4_images.spec.image_code import gemma4_bench

GiB = 2**30
IMAGE = "gemma4-e2b-test/xeon6:e2b-shape"  # the CPU image with the shape's tokenizer baked in, as a release bakes E2B's
# The load under which the working set is read: the recipe's --max-num-seqs 64 streams beside 16 plain
# requests, each 8 tokens (the tiny tier's 24 would take ~10 minutes at 2 cores' decode rate).
LOAD = {"streams": 64, "plain": 16, "max_tokens": 8}
PREFILL_TOKENS = 1024  # one prompt of the recipe's prefill-heavy input length
DECODE_TOKENS = 32
# gemma4-bench offline at E2B's shape: the recipe's prefill-heavy bs16 case at a quarter of its size
# (4 prompts of 256 tokens), eager, and its correctness check on 8 prompts.
OFFLINE = ["--cases", "prefill-bs16", "--scale", "0.25", "--enforce-eager", "--max-model-len", "2048"]
OFFLINE += ["--check-prompts", "8", "--warmups", "1", "--reps", "3", "--worker-timeout", "3600"]
BUDGET_S = 1800  # to /health: a compiled start of E2B's shape took 202 s on 2 cores; a slower disk more
REQUEST_TIMEOUT_S = 600  # one request of a few dozen tokens: ~3 tokens/s decoding, prefill of 1,000s of tokens
# The least a recipe-sized input adds to the prompt (e2b.json processor): a square image within the
# 280-soft-token budget is 16 x 16 = 256 tokens after 3 x 3 pooling (4 per prompt, the launch's
# limit; measured 1,049 prompt tokens for four), 30 s of audio 750 at 40 ms a token (measured 769).
MEDIA_TOKENS = {"image": 4 * 256, "audio": 750}
# What vLLM logs of its KV cache (vllm/v1/core/kv_cache_utils.py, 0.30.0), CPU and GPU alike.
KV_LINE = re.compile(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")


def kv_capacity(lines: list[str]) -> dict | None:
    """The KV cache vLLM reported at start: its tokens, the context it sized for, and how many such
    requests fit at once."""
    for line in lines:
        found = KV_LINE.search(line)
        if found:
            tokens, context, fit = found.groups()
            return {"tokens": int(tokens.replace(",", "")), "context": int(context.replace(",", "")), "fit": float(fit)}
    return None


def shape_image(client, m: matrix.Matrix, folder: Path, log) -> str:
    """The CPU image with the shape's tokenizer baked (cached layers: seconds once the base is here)."""
    localbase.cpu_base(client, m, log)
    return images.build_target(client, m, TARGET, tokenizer_source=str(folder), tag=IMAGE, log=log)


def pod_like(volume: Path, kv_gib: int):
    """customize(): the pod's compile-cache volume at VLLM_CACHE_ROOT and its KV cache size."""

    def customize(container):
        container.with_volume_mapping(str(volume), COMPILE_CACHE, "rw")
        container.with_env("VLLM_CACHE_ROOT", COMPILE_CACHE).with_env("VLLM_CPU_KVCACHE_SPACE", str(kv_gib))

    return customize


@contextmanager
def cache_volume():
    """A host folder for the pod's compile-cache volume, writable by uid 2000 as fsGroup makes it."""
    volume = Path(tempfile.mkdtemp(prefix="gemma4-e2b-shape-cache-"))
    volume.chmod(0o777)
    try:
        yield volume
    finally:
        shutil.rmtree(volume, ignore_errors=True)


def write_figures(path: Path, figures: dict) -> None:
    """Merge figures into the JSON file at path (the tier's record reads it)."""
    old = json.loads(path.read_text()) if path.is_file() else {}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**old, **figures}, indent=1) + "\n")


def stream(url: str, body: dict, timeout: float) -> list[str]:
    """The data: payloads of a streamed chat completion, [DONE] last."""
    req = urllib.request.Request(
        url + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return [line[6:] for line in r.read().decode().splitlines() if line.startswith("data: ")]


def completion_rates(url: str, served: str) -> dict:
    """Decode: greedy tokens/s after the first token of a 32-token completion. Prefill: prompt
    tokens/s of a 1024-token prompt answered with one token (its time is the prefill's)."""
    from gemma4_images.check import smoke

    checks = smoke.Checks(url, served)

    def timed(body: dict) -> tuple[float, dict]:
        start = time.monotonic()
        status, answer = checks.post("/v1/completions", {"model": served, "temperature": 0, "ignore_eos": True, **body})
        assert status == 200, answer
        return time.monotonic() - start, answer

    first, _ = timed({"prompt": "The capital of France is", "max_tokens": 1})
    whole, _ = timed({"prompt": "The capital of France is", "max_tokens": DECODE_TOKENS})
    prompt = [1000 + (i * 7919) % 200000 for i in range(PREFILL_TOKENS)]  # ordinary ids, as gemma4-bench picks
    prefill, answer = timed({"prompt": prompt, "max_tokens": 1})
    return {
        "decode_tok_s": (DECODE_TOKENS - 1) / max(whole - first, 1e-9),
        "prefill_tok_s": answer["usage"]["prompt_tokens"] / prefill,
        "first_token_s": first,
        "prefill_s": prefill,
    }


def serving(client, log, m: matrix.Matrix, image: str, folder: Path) -> dict:
    """Two starts of the recipe's launch (vLLM compiling) on one compile-cache volume, the pod's KV
    cache: the first on an empty volume, the second warm; the warm server measured at rest and under
    LOAD."""
    from gemma4_images.check import running, server, traffic

    kv_gib = m.families["cpu"].kubernetes.resources.kv_cache_gib
    starts: list[dict] = []
    with cache_volume() as volume:
        for which in ("cold", "warm"):
            t0 = time.monotonic()
            with server.serve(
                m, TARGET, image, str(folder), eager=False, launch_only=True, keep_compiles=False,
                customize=pod_like(volume, kv_gib), budget=BUDGET_S,
            ) as srv:  # fmt: skip
                start = {"volume": which, "healthy_s": time.monotonic() - t0, "kv": kv_capacity(srv.log())}
                log(f"bench: E2B shape, {which} compile-cache volume: healthy in {start['healthy_s']:.0f} s")
                if which == "warm":
                    traffic.run(srv.url, srv.served, **traffic.WARM_UP)
                    start["idle"] = running.working_set_bytes(srv.container)
                    start.update(completion_rates(srv.url, srv.served))
                    load = traffic.run(srv.url, srv.served, **LOAD, timeout=REQUEST_TIMEOUT_S).summary()
                    start["load"] = load
                    start["load_failures"] = load["requests"] - load["ok"]
                    start["loaded"] = running.working_set_bytes(srv.container)
                starts.append(start)
        cache_bytes = sum(f.stat().st_size for f in volume.rglob("*") if f.is_file())
    cold, warm = starts
    return {
        "image": image,
        "kv_cache_gib": kv_gib,
        "starts": starts,
        "warm_over_cold": ratio(warm["healthy_s"], cold["healthy_s"]),
        "cache_bytes": cache_bytes,
        "load": LOAD,
    }


def offline_fast_prefill(client, log, image: str, folder: Path) -> dict:
    """The recipe's offline method (gemma4-bench offline) at E2B's shape: stock and fast prefill,
    each in its own engine, and the correctness check (first tokens and 32-token greedy
    continuations identical)."""
    argv = ["offline", "--model", harness.TINY, *OFFLINE, "--json", "-"]
    result, seconds, _ = harness.run_harness(client, image, argv, log, model=folder)
    result.pop("continuations", None)
    return {"result": result, "seconds": seconds, "args": OFFLINE}


def fullsize_bench(client, log, m: matrix.Matrix) -> dict:
    from testkit.e2b_shape import cache

    folder = cache.ensure()
    image = shape_image(client, m, folder, log)
    out = {"model": {"folder": folder.name, "bytes": sum(f.stat().st_size for f in folder.glob("*.safetensors"))}}
    out["serving"] = serving(client, log, m, image, folder)
    out["offline"] = offline_fast_prefill(client, log, image, folder)
    return out


def section(full: dict) -> list[str]:
    srv, off = full["serving"], full["offline"]["result"]
    cold, warm = srv["starts"]
    kv = cold["kv"] or {}
    rows = [("", "empty volume (a pod's first start)", "warm volume")]
    rows.append(("to /health (s)", f"{cold['healthy_s']:.0f}", f"{warm['healthy_s']:.0f}"))
    return [
        "## E2B at its real size (random weights of its shape, CPU image)",
        "",
        f"`testkit.e2b_shape`: Gemma 4 E2B's exact configuration, random weights "
        f"({full['model']['bytes'] / 1e9:.2f} GB of bf16 safetensors); `{srv['image']}` (the CPU image with that "
        f"tokenizer baked) serving the recipe's launch as a pod runs it: vLLM compiling, "
        f"`VLLM_CPU_KVCACHE_SPACE={srv['kv_cache_gib']}`, the compile-cache volume at `VLLM_CACHE_ROOT`. Random "
        "weights say nothing of answers; size, memory and speed are E2B's.",
        "",
        gemma4_bench._markdown(rows),
        "",
        f"Warm / empty volume: **{srv['warm_over_cold']:.2f}x** ({srv['cache_bytes'] / 2**20:.0f} MiB of compiled "
        f"graphs). vLLM's KV cache: **{kv.get('tokens', 0):,} tokens**, {kv.get('fit', 0):.2f}x requests of "
        f"{kv.get('context', 0):,} tokens (the model's own context: the CPU launch sets none).",
        "",
        f"Working set (cgroup usage less inactive file pages, as the kubelet counts it): **{warm['idle'] / GiB:.1f} "
        f"GiB** at rest, **{warm['loaded'] / GiB:.1f} GiB** after {srv['load']['streams']} streams and "
        f"{srv['load']['plain']} plain requests of {srv['load']['max_tokens']} tokens "
        f"({warm['load_failures']} failed). `build.py k8s xeon6` asks for this.",
        "",
        f"One stream: **{warm['decode_tok_s']:.1f} tokens/s** decoding (greedy, after the first token), a "
        f"{PREFILL_TOKENS}-token prompt prefilled at **{warm['prefill_tok_s']:.0f} tokens/s**.",
        "",
        *_fast_prefill_lines(off),
    ]


def _fast_prefill_lines(off: dict) -> list[str]:
    """gemma4-bench offline's result (modes -> case -> tok_s, ratios, correctness) as BENCHMARKS.md's lines."""
    case = "prefill-bs16"
    stock, fast = (off.get("modes", {}).get(mode, {}).get(case, {}).get("tok_s") for mode in ("stock", "fast"))
    if not (stock and fast):
        return [f"Fast prefill against stock: not measured ({off.get('errors') or 'no result'}).", ""]
    correct = off.get("correctness", {})
    return [
        f"Fast prefill against stock, the recipe's offline method (`gemma4-bench offline {' '.join(OFFLINE)}`: "
        f"its prefill-heavy bs16 case at a quarter of its size, {off['cases'][0]['bs']} prompts of "
        f"{off['cases'][0]['input_len']} tokens, eager): stock **{stock:,.0f}** tok/s, fast prefill **{fast:,.0f}** "
        f"tok/s, **{off['ratios'][case]:.2f}x** (the recipe's Gaudi 2 table: 59.2k -> 108.7k tok/s, 1.84x). "
        f"Correctness as the recipe checks it: {correct.get('summary', 'not run')}.",
        "",
    ]
