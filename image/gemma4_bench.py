#!/usr/bin/env python3
"""gemma4-bench: the Gemma 4 E2B recipe's serving benchmarks, runnable inside the image.

Installed as /usr/local/bin/gemma4-bench. Standard library only at import time (vLLM is imported
in the worker processes), so it runs on every vendor base.

  gemma4-bench offline [--cases ...] [--scale F] [--model M] [-- EXTRA ENGINE ARGS]
      The recipe's offline method (000 "Performance", the benchmark method of vllm#60445):
      LLM.generate with bs prompts of random token ids, scored as bs x (input + output) / batch
      latency, three repetitions after two warm-ups, at the harness's settings (8,192 context,
      --gpu-memory-utilization 0.85, prompt batch cap 1). Stock and --kv-sharing-fast-prefill
      each run in their own subprocess (an LLM engine does not unload cleanly), then the recipe's
      correctness check: first token and 32-token greedy continuations of the same prompts
      identical between the modes (x/N).
  gemma4-bench served [--url URL | -- EXTRA SERVE ARGS]
      The recipe's served method: N concurrent streamed requests of ~600 prompt tokens, two
      warm-up rounds then two recorded rounds per mode; first-token median and round wall time.
      Without --url it starts `gemma4-serve` itself, once per mode (stock, fast prefill).

Both print the recipe's table plus the fast/stock ratio and write JSON with --json PATH.
Sizes shrink with flags (--scale, --cases, --max-model-len, --concurrency, ...) so that the CPU
image with a tiny model can run the whole thing; random ids stay below the vocabulary and avoid
special and added tokens.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

# name -> (input tokens, output tokens, batch size), the recipe's cases in its order.
CASES = {
    "prefill-bs16": ("prefill-heavy", 1024, 1, 16),
    "prefill-bs64": ("prefill-heavy", 1024, 1, 64),
    "balanced-bs64": ("balanced", 512, 4, 64),
    "decode-bs64": ("decode-heavy", 128, 8, 64),
    "long-bs16": ("long context", 4096, 1, 16),
}
MODES = {"stock": False, "fast": True}
MODE_TITLES = {"stock": "Stock", "fast": "Fast prefill"}
# 000's Performance section: offline tok/s, one Gaudi 2 card, vllm-gaudi releases/v0.30.0, cap 1.
RECIPE_OFFLINE = {
    "prefill-bs16": (59.2e3, 108.7e3),
    "prefill-bs64": (61.0e3, 106.9e3),
    "balanced-bs64": (48.4e3, 71.2e3),
    "decode-bs64": (21.8e3, 20.3e3),
    "long-bs16": (33.0e3, 78.5e3),
}
# 000: served, 64 concurrent ~600-token prompts, two recorded rounds per mode.
RECIPE_SERVED = {
    "stock": {"ttft_median_s": [1.01, 1.00], "wall_s": [9.29, 9.18]},
    "fast": {"ttft_median_s": [0.76, 0.77], "wall_s": [9.09, 8.96]},
}
RECIPE_CORRECTNESS = "64/64 first token, 64/64 32-token continuations (Gaudi 2, 1,024-token wikitext prompts)"
DEFAULT_MODEL = "google/gemma-4-E2B-it"


# -- pure helpers (unit-tested) ------------------------------------------------------------------


def score(bs: int, input_len: int, output_len: int, latency_s: float) -> float:
    """The recipe's throughput: bs x (input + output) tokens over the batch latency."""
    if latency_s <= 0:
        raise ValueError("latency must be positive")
    return bs * (input_len + output_len) / latency_s


def scaled_case(name: str, scale: float, max_model_len: int | None = None) -> dict:
    """A case with input lengths and batch sizes multiplied by scale (outputs are kept: they are
    already 1 to 8 tokens), and the input clipped to fit max_model_len."""
    title, inp, out, bs = CASES[name]
    inp_s = max(8, round(inp * scale))
    if max_model_len:
        inp_s = min(inp_s, max_model_len - out)
    return {
        "case": name,
        "title": title,
        "input_len": inp_s,
        "output_len": out,
        "bs": max(1, round(bs * scale)),
        "recipe": {"input_len": inp, "output_len": out, "bs": bs},
    }


def case_label(c: dict) -> str:
    return f"{c['title']} ({c['input_len']:,} in, {c['output_len']} out), bs {c['bs']}"


def fmt_tps(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1e3:.1f}k" if value >= 1000 else f"{value:.1f}"


def ratio(fast: float | None, stock: float | None) -> float | None:
    return None if not fast or not stock else fast / stock


def valid_token_ids(vocab_size: int, excluded: set[int]) -> list[int]:
    """Ids a random prompt may use: below the vocabulary, not special, not added."""
    ids = [i for i in range(vocab_size) if i not in excluded]
    if not ids:
        raise ValueError(f"no usable token ids below {vocab_size}")
    return ids


def random_prompts(ids: list[int], n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.choice(ids) for _ in range(length)] for _ in range(n)]


def compare_continuations(stock: list[list[int]], fast: list[list[int]]) -> dict:
    """The recipe's correctness check: first token and whole greedy continuation, x/N each."""
    n = len(stock)
    if len(fast) != n:
        raise ValueError(f"{n} stock continuations against {len(fast)} fast ones")
    first = sum(1 for a, b in zip(stock, fast) if a[:1] == b[:1])
    whole = sum(1 for a, b in zip(stock, fast) if a == b)
    tokens = len(stock[0]) if stock else 0
    return {
        "n": n,
        "tokens": tokens,
        "first_token_identical": first,
        "continuation_identical": whole,
        "summary": f"first token {first}/{n}, {tokens}-token continuations identical {whole}/{n}",
    }


def offline_table(result: dict) -> str:
    """The recipe's offline table (Case | Stock | Fast prefill) plus the fast/stock ratio."""
    rows = [("Case", "Stock", "Fast prefill", "fast/stock")]
    for c in result["cases"]:
        s = result["modes"].get("stock", {}).get(c["case"], {}).get("tok_s")
        f = result["modes"].get("fast", {}).get(c["case"], {}).get("tok_s")
        r = ratio(f, s)
        rows.append((case_label(c), fmt_tps(s) + (" tok/s" if s else ""), fmt_tps(f), f"{r:.2f}x" if r else "-"))
    return _markdown(rows)


def served_table(result: dict) -> str:
    rows = [("", "Stock", "Fast prefill", "fast/stock")]
    for key, label in (("ttft_median_s", "First-token median"), ("wall_s", "Wall time for the round")):
        vals = {m: result["modes"].get(m, {}).get(key) for m in MODES}
        cells = [" / ".join(f"{v:.2f} s" for v in vals[m]) if vals[m] else "-" for m in MODES]
        mean = {m: statistics.mean(vals[m]) if vals[m] else None for m in MODES}
        r = ratio(mean["fast"], mean["stock"])
        rows.append((label, *cells, f"{r:.2f}x" if r else "-"))
    return _markdown(rows)


def _markdown(rows) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    line = lambda r: "| " + " | ".join(str(v).ljust(w) for v, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(rows[0]), "| " + " | ".join("-" * w for w in widths) + " |", *map(line, rows[1:])])


def mode_args(mode: str) -> list[str]:
    """Serve flags that put a launch in mode; given last, they win over the recipe's own."""
    return ["--kv-sharing-fast-prefill"] if MODES[mode] else ["--no-kv-sharing-fast-prefill"]


def parse_sse_line(line: bytes) -> dict | None | str:
    """One server-sent-events line: its JSON, "[DONE]", or None for blank/comment lines."""
    text = line.decode("utf-8", "replace").strip()
    if not text.startswith("data:"):
        return None
    payload = text[5:].strip()
    return payload if payload == "[DONE]" else json.loads(payload)


# -- offline: parent -----------------------------------------------------------------------------


def run_offline(args) -> dict:
    cases = [scaled_case(n, args.scale, args.max_model_len) for n in args.cases]
    spec = {
        "model": args.model,
        "tokenizer": args.tokenizer,
        "max_model_len": args.max_model_len,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "enforce_eager": args.enforce_eager,
        "cases": cases,
        "warmups": args.warmups,
        "reps": args.reps,
        "seed": args.seed,
        "check_prompts": args.check_prompts,
        "check_len": max(8, min(round(1024 * args.scale), args.max_model_len - 33)),
        "check_tokens": args.check_tokens,
        "engine_args": parse_engine_args(args.extra),
    }
    env = dict(os.environ)
    if "VLLM_SKIP_WARMUP" in env:  # 000 "What not to do": vllm-gaudi reads any value as true
        raise SystemExit(
            "gemma4-bench: VLLM_SKIP_WARMUP is set; unset it (the recipe's figures were "
            "measured with warm-up, and vllm-gaudi reads even 'false' as true)"
        )
    env["VLLM_PROMPT_BS_BUCKET_MAX"] = str(args.prompt_bs_cap)  # vllm-gaudi; ignored elsewhere
    result = {
        "method": "offline (000 Performance; vllm#60445): LLM.generate, bs random-token prompts, "
        "bs x (input + output) / batch latency, median of reps after warm-ups",
        "settings": {k: v for k, v in spec.items() if k != "cases"} | {"prompt_bs_cap": args.prompt_bs_cap},
        "cases": cases,
        "modes": {},
        "continuations": {},
        "errors": {},
    }
    for mode in args.modes:
        log(f"offline: {mode} mode in its own process")
        out = run_worker(spec | {"fast": MODES[mode]}, env, args.worker_timeout)
        if "error" in out:
            result["errors"][mode] = out["error"]
            continue
        result["modes"][mode] = out["cases"]
        result["continuations"][mode] = out["continuations"]
        result.setdefault("vllm_version", out.get("vllm_version"))
        result.setdefault("init_s", {})[mode] = out.get("init_s")
    result["ratios"] = {
        c["case"]: ratio(
            result["modes"].get("fast", {}).get(c["case"], {}).get("tok_s"),
            result["modes"].get("stock", {}).get(c["case"], {}).get("tok_s"),
        )
        for c in cases
    }
    if {"stock", "fast"} <= set(result["continuations"]) and args.check_prompts:
        result["correctness"] = compare_continuations(result["continuations"]["stock"], result["continuations"]["fast"])
    return result


def parse_engine_args(extra: list[str]) -> dict:
    """`--key value`, `--key=value` and bare `--flag` engine arguments as LLM(...) keywords."""
    out, items = {}, [a for a in extra if a != "--"]
    i = 0
    while i < len(items):
        item = items[i]
        if not item.startswith("--"):
            raise SystemExit(f"gemma4-bench: cannot read engine argument {item!r}")
        key, eq, value = item[2:].partition("=")
        if not eq:
            if i + 1 < len(items) and not items[i + 1].startswith("--"):
                value, i = items[i + 1], i + 1
            else:
                value = "true"
        out[key.replace("-", "_")] = _literal(value)
        i += 1
    return out


def _literal(value: str):
    try:
        return json.loads(value)
    except ValueError:
        return value


def run_worker(spec: dict, env: dict, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec_file, out_file = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        with open(spec_file, "w") as f:
            json.dump(spec, f)
        try:
            run = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "_worker", spec_file, out_file],
                env=env,
                timeout=timeout,
                capture_output=True,
                text=True,
            )
        except subprocess.TimeoutExpired:
            return {"error": f"the worker did not finish within {timeout:.0f}s"}
        if run.returncode != 0 or not os.path.exists(out_file):
            tail = "\n".join((run.stderr or run.stdout).splitlines()[-20:])
            return {"error": f"worker exited {run.returncode}:\n{tail}"}
        with open(out_file) as f:
            return json.load(f)


# -- offline: worker (imports vLLM) ---------------------------------------------------------------


def worker(spec_file: str, out_file: str) -> int:
    with open(spec_file) as f:
        spec = json.load(f)
    start = time.monotonic()
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = {
        "model": spec["model"],
        "max_model_len": spec["max_model_len"],
        "gpu_memory_utilization": spec["gpu_memory_utilization"],
        "enforce_eager": spec["enforce_eager"],
        "kv_sharing_fast_prefill": spec["fast"],
        "enable_prefix_caching": False,
        "seed": spec["seed"],
        **spec["engine_args"],
    }
    if spec.get("tokenizer"):
        kwargs["tokenizer"] = spec["tokenizer"]
    llm = LLM(**kwargs)
    init_s = time.monotonic() - start
    tok = llm.get_tokenizer()
    vocab = min(llm.llm_engine.model_config.get_vocab_size(), len(tok))
    excluded = set(getattr(tok, "all_special_ids", []) or []) | set((tok.get_added_vocab() or {}).values())
    ids = valid_token_ids(vocab, excluded)
    cases = {}
    for n, c in enumerate(spec["cases"]):
        prompts = [
            TokensPrompt(prompt_token_ids=p) for p in random_prompts(ids, c["bs"], c["input_len"], spec["seed"] + n)
        ]
        params = SamplingParams(max_tokens=c["output_len"], ignore_eos=True, temperature=0.0)
        for _ in range(spec["warmups"]):
            llm.generate(prompts, params, use_tqdm=False)
        latencies, produced = [], []
        for _ in range(spec["reps"]):
            t = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            latencies.append(time.perf_counter() - t)
            produced.append(sum(len(o.outputs[0].token_ids) for o in outs))
        scores = [score(c["bs"], c["input_len"], c["output_len"], lat) for lat in latencies]
        cases[c["case"]] = {
            "latency_s": latencies,
            "tok_s_reps": scores,
            "tok_s": statistics.median(scores),
            "output_tokens_per_rep": produced,
            "expected_output_tokens": c["bs"] * c["output_len"],
        }
        print(f"  {case_label(c)}: {fmt_tps(cases[c['case']]['tok_s'])} tok/s", file=sys.stderr, flush=True)
    continuations = []
    if spec["check_prompts"]:
        prompts = [
            TokensPrompt(prompt_token_ids=p)
            for p in random_prompts(ids, spec["check_prompts"], spec["check_len"], spec["seed"] + 1000)
        ]
        outs = llm.generate(
            prompts, SamplingParams(max_tokens=spec["check_tokens"], ignore_eos=True, temperature=0.0), use_tqdm=False
        )
        continuations = [list(o.outputs[0].token_ids) for o in outs]
    with open(out_file, "w") as f:
        json.dump(
            {
                "cases": cases,
                "continuations": continuations,
                "init_s": init_s,
                "vllm_version": getattr(vllm, "__version__", ""),
            },
            f,
        )
    return 0


# -- served --------------------------------------------------------------------------------------


def stream_completion(url: str, model: str, prompt: list[int], max_tokens: int, timeout: float) -> dict:
    """One streamed /v1/completions request; times to the first token and to the end."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    body = json.dumps(
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
        }
    )
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"/v1/completions answered {resp.status}: {resp.read()[:300]!r}")
    first, text, chunks = None, [], 0
    for line in resp:
        event = parse_sse_line(line)
        if event is None:
            continue
        if event == "[DONE]":
            break
        piece = (event.get("choices") or [{}])[0].get("text") or ""
        chunks += 1
        if first is None:
            first = time.perf_counter() - start
        text.append(piece)
    conn.close()
    return {"ttft_s": first, "latency_s": time.perf_counter() - start, "text": "".join(text), "chunks": chunks}


def served_round(url: str, model: str, prompts: list[list[int]], max_tokens: int, timeout: float) -> dict:
    results: list = [None] * len(prompts)

    def one(i):
        try:
            results[i] = stream_completion(url, model, prompts[i], max_tokens, timeout)
        except Exception as e:  # noqa: BLE001 - one failed request is reported, not fatal
            results[i] = {"error": f"{type(e).__name__}: {e}"}

    start = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    errors = [r["error"] for r in results if "error" in r]
    ttfts = [r["ttft_s"] for r in results if r.get("ttft_s") is not None]
    return {
        "wall_s": wall,
        "ttft_median_s": statistics.median(ttfts) if ttfts else None,
        "errors": errors,
        "texts": [r.get("text", "") for r in results],
    }


def http_json(url: str, timeout: float = 5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def wait_healthy(url: str, proc, budget: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < budget:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}) before /health answered")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"/health did not answer within {budget:.0f}s")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def served_mode(url: str, args, prompts) -> dict:
    model = args.served_model or http_json(url + "/v1/models")["data"][0]["id"]
    rounds = []
    for n in range(args.warmup_rounds + args.rounds):
        r = served_round(url, model, prompts, args.max_tokens, args.request_timeout)
        if r["errors"]:
            raise RuntimeError(f"{len(r['errors'])} of {len(prompts)} requests failed: {r['errors'][0]}")
        kind = "warm-up" if n < args.warmup_rounds else "recorded"
        log(f"  {kind} round: first-token median {r['ttft_median_s']:.2f} s, wall {r['wall_s']:.2f} s")
        if kind == "recorded":
            rounds.append(r)
    return {
        "model": model,
        "ttft_median_s": [r["ttft_median_s"] for r in rounds],
        "wall_s": [r["wall_s"] for r in rounds],
        "texts": rounds[-1]["texts"],
    }


def run_served(args) -> dict:
    prompts = random_prompts(
        list(range(args.token_low, args.token_high)), args.concurrency, args.prompt_tokens, args.seed
    )
    result = {
        "method": "served (000 Performance): concurrent streamed /v1/completions, "
        f"{args.warmup_rounds} warm-up then {args.rounds} recorded rounds per mode",
        "settings": {
            "concurrency": args.concurrency,
            "prompt_tokens": args.prompt_tokens,
            "max_tokens": args.max_tokens,
            "rounds": args.rounds,
            "warmup_rounds": args.warmup_rounds,
        },
        "modes": {},
        "errors": {},
    }
    if args.url:
        label = args.label or "stock"
        log(f"served: {args.url} as the {label} mode")
        result["modes"][label] = served_mode(args.url.rstrip("/"), args, prompts)
    else:
        for mode in args.modes:
            port = free_port()
            cmd = [args.serve_command, *args.extra, "--host", "127.0.0.1", "--port", str(port), *mode_args(mode)]
            log(f"served: starting {mode} mode: {shlex.join(cmd)}")
            logf = tempfile.TemporaryFile()
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
            url = f"http://127.0.0.1:{port}"
            try:
                result.setdefault("startup_s", {})[mode] = wait_healthy(url, proc, args.startup_budget)
                result["modes"][mode] = served_mode(url, args, prompts) | {"launch": cmd}
            except (RuntimeError, OSError) as e:
                logf.seek(0)
                tail = "\n".join(logf.read().decode(errors="replace").splitlines()[-15:])
                result["errors"][mode] = f"{e}\n{tail}"
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                logf.close()
    modes = result["modes"]
    if "stock" in modes and "fast" in modes:
        a, b = modes["stock"]["texts"], modes["fast"]["texts"]
        n = len(a)
        result["outputs"] = {
            "n": n,
            "first_40_chars_identical": sum(x[:40] == y[:40] for x, y in zip(a, b)),
            "identical": sum(x == y for x, y in zip(a, b)),
        }
    for m in modes.values():
        m.pop("texts", None)
    return result


# -- command line --------------------------------------------------------------------------------


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gemma4-bench", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--modes", default="stock,fast", type=lambda s: [m for m in s.split(",") if m], help="stock,fast (default both)"
    )
    common.add_argument("--seed", type=int, default=0)
    common.add_argument("--json", metavar="PATH", help="also write the result as JSON to PATH (- for stdout)")

    off = sub.add_parser("offline", parents=[common], help="LLM.generate throughput, stock vs fast prefill")
    off.add_argument("--model", default=os.environ.get("GEMMA4_MODEL", DEFAULT_MODEL))
    off.add_argument("--tokenizer", default=None)
    off.add_argument(
        "--cases",
        default=",".join(CASES),
        type=lambda s: [c for c in s.split(",") if c],
        help=f"comma-separated, from: {', '.join(CASES)}",
    )
    off.add_argument("--scale", type=float, default=1.0, help="multiply input lengths and batch sizes")
    off.add_argument("--max-model-len", type=int, default=8192)
    off.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    off.add_argument("--prompt-bs-cap", type=int, default=1, help="VLLM_PROMPT_BS_BUCKET_MAX (recipe: 1)")
    off.add_argument("--enforce-eager", action="store_true")
    off.add_argument("--warmups", type=int, default=2)
    off.add_argument("--reps", type=int, default=3)
    off.add_argument("--check-prompts", type=int, default=64, help="correctness-check prompts (0: skip)")
    off.add_argument("--check-tokens", type=int, default=32)
    off.add_argument("--worker-timeout", type=float, default=7200)
    off.add_argument("extra", nargs=argparse.REMAINDER, help="-- then extra engine args (--key value)")

    srv = sub.add_parser("served", parents=[common], help="concurrent streamed requests against a server")
    srv.add_argument(
        "--url", help="a running server (measured as one mode, --label); default: start gemma4-serve once per mode"
    )
    srv.add_argument("--label", help="the mode a --url server is in (default stock)")
    srv.add_argument("--served-model", help="model name for requests (default: the first /v1/models id)")
    srv.add_argument("--serve-command", default="gemma4-serve")
    srv.add_argument("--concurrency", type=int, default=64)
    srv.add_argument("--prompt-tokens", type=int, default=600)
    srv.add_argument("--max-tokens", type=int, default=640)
    srv.add_argument("--token-low", type=int, default=1000, help="random prompt ids from here ...")
    srv.add_argument("--token-high", type=int, default=200000, help="... to below here (< vocab)")
    srv.add_argument("--warmup-rounds", type=int, default=2)
    srv.add_argument("--rounds", type=int, default=2)
    srv.add_argument("--startup-budget", type=float, default=3600)
    srv.add_argument("--request-timeout", type=float, default=3600)
    srv.add_argument("extra", nargs=argparse.REMAINDER, help="-- then extra gemma4-serve args")
    return p


def main(argv: list[str]) -> int:
    if argv[:1] == ["_worker"]:
        return worker(argv[1], argv[2])
    args = parser().parse_args(argv)
    args.extra = [a for a in args.extra if a != "--"] if args.extra and args.extra[0] == "--" else args.extra
    bad = [m for m in args.modes if m not in MODES]
    if bad:
        raise SystemExit(f"gemma4-bench: unknown mode(s) {bad}; valid: {', '.join(MODES)}")
    if args.command == "offline":
        unknown = [c for c in args.cases if c not in CASES]
        if unknown:
            raise SystemExit(f"gemma4-bench: unknown case(s) {unknown}; valid: {', '.join(CASES)}")
        result = run_offline(args)
        print(offline_table(result))
        if "correctness" in result:
            print(f"\nfast prefill vs stock, greedy: {result['correctness']['summary']}")
    else:
        result = run_served(args)
        print(served_table(result))
        if "outputs" in result:
            o = result["outputs"]
            print(
                f"\noutputs, fast vs stock: first 40 characters {o['first_40_chars_identical']}/{o['n']}, "
                f"whole {o['identical']}/{o['n']}"
            )
    for mode, err in result["errors"].items():
        print(f"\n{mode} mode failed: {err}", file=sys.stderr)
    if args.json:
        text = json.dumps(result, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return 1 if result["errors"] or not result["modes"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
