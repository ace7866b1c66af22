"""build.py as users call it: clear errors, the right `docker run` per family, drift detection."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gemma4_images.generate import render
from gemma4_images.spec import matrix
from tests import signals
from tests.cli import build_py as cli
from tests.cli import command

ROOT = matrix.ROOT


def test_list_shows_every_target():
    out = cli("list").stdout
    for name in matrix.load().targets:
        assert name in out
    assert "xeon6 (cpu)" in out and "gemma4-e2b:h100-v0.30.0" in out and "vllm/vllm-openai-rocm:v0.30.0" in out


def test_unknown_target_is_a_usage_error_listing_targets():
    r = cli("build", "h800")
    assert r.returncode == 2
    assert "unknown target 'h800'" in r.stderr and "gaudi2" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "args, what",
    [
        (["build", "cpu", "--tiny", "--base-image", "Bad Ref!!"], "--base-image 'Bad Ref!!'"),
        (["build", "cpu", "--tiny", "--tag", "Bad-Tag:1"], "--tag 'Bad-Tag:1'"),
        (["smoke", "cpu", "--tiny", "--image", "Bad Ref"], "--image 'Bad Ref'"),
        (["inspect", "Bad Ref!!"], "IMAGE 'Bad Ref!!'"),
        (["run", "cpu", "--image", "UPPER/case:1", "--print"], "--image 'UPPER/case:1'"),
        (
            ["push", "cpu", "--registry", "127.0.0.1:5000/Upper"],
            "--registry '127.0.0.1:5000/Upper' is not a valid registry",
        ),
    ],
)
def test_an_invalid_reference_is_one_line_before_the_engine_is_asked(tmp_path, args, what):
    # No daemon here: the answer must come from the check, not from the engine.
    env = {"DOCKER_HOST": f"unix://{tmp_path}/no.sock", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    r = cli(*args, env=env)
    assert r.returncode == 2
    assert r.stderr.startswith(f"error: {what}") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr


def test_an_engine_refusal_validation_missed_is_one_line(monkeypatch, capsys):
    from docker.errors import APIError

    from gemma4_images import cli as module

    def refuse():
        raise APIError("400 Client Error", explanation="invalid reference format: repository name must be lowercase")

    # Any command the engine refuses goes through the group's one handler.
    monkeypatch.setattr(module, "connect", refuse)
    monkeypatch.setattr(sys, "argv", ["build.py", "inspect", "gemma4-e2b:xeon6-v0.30.0"])
    with pytest.raises(SystemExit) as exit_:
        module.main()
    assert exit_.value.code == 1
    assert capsys.readouterr().err == (
        "error: the Docker engine refused: invalid reference format: repository name must be lowercase\n"
    )


def test_unreachable_daemon_is_one_clear_line(tmp_path):
    env = {"DOCKER_HOST": f"unix://{tmp_path}/no.sock", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    r = cli("build", "h100", env=env)
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert "cannot reach the Docker daemon" in r.stderr


@pytest.mark.parametrize(
    "target, flags",
    [
        ("gaudi2", "--runtime=habana -e HABANA_VISIBLE_DEVICES=all --cap-add=sys_nice --ipc=host"),
        ("h100", "--gpus all --privileged --ipc=host"),
        ("mi300x", "--device=/dev/kfd --device=/dev/dri --group-add=video"),
        ("trillium", "--privileged --network=host --shm-size=16G -v /dev/shm:/dev/shm -e HF_TOKEN"),
        ("cpu", "--privileged --ipc=host -p 8000:8000"),
    ],
)
def test_run_print_has_the_family_device_flags(target, flags):
    r = cli("run", target, "--print", "--max-model-len", "4096")
    assert r.returncode == 0
    assert flags in r.stdout
    assert "-v $HOME/.cache/huggingface:/root/.cache/huggingface" in r.stdout
    own = matrix.load()
    m = matrix.load(vllm=matrix.default_release(own, own.resolve(target)))  # the family's default release
    assert r.stdout.strip().endswith(f"{m.tag(m.resolve(target))} --max-model-len 4096")


# A STAND-IN for the docker CLI, which passes the signals it gets to its container (--sig-proxy):
# it says it started, then records the one signal it gets. What is under test is build.py's part.
DOCKER_STANDIN = """#!/bin/sh
[ "$1" = image ] && exit 0  # `docker image inspect`: the image is here
for s in TERM HUP INT; do trap "echo $s > '{got}'; exit 0" $s; done
echo up > '{up}'
while :; do sleep 0.1; done
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_run_passes_a_stop_signal_on_to_docker_run(tmp_path, signum):
    # A Kubernetes Job or a `kill` signals this process alone, not its `docker run` child: without
    # the hand-on, the server would keep serving after `build.py run` is gone.
    got, up = tmp_path / "got", tmp_path / "up"
    (tmp_path / "docker").write_text(DOCKER_STANDIN.format(got=got, up=up))
    (tmp_path / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    proc = subprocess.Popen(
        command("run", "cpu"),
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        preexec_fn=signals.default_stop_signals,
    )
    deadline = time.monotonic() + 30
    while not up.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signum)
    assert proc.wait(timeout=30) == 128 + signum
    assert got.read_text().strip() == signal.Signals(signum).name.removeprefix("SIG")
    assert f"stopped by {signal.Signals(signum).name}" in proc.stderr.read().decode()


# A STAND-IN for the docker CLI whose engine holds only the -tiny images, as right after `make
# quickstart`; it records every command it is asked and answers `docker run` as docker does when it
# would pull (exit 125).
DOCKER_ONLY_TINY = """#!/bin/sh
echo "$*" >> '{calls}'
if [ "$1" = image ]; then
    case "$*" in *-tiny) echo sha256:1; exit 0;; esac
    echo "Error response from daemon: No such image: $5" >&2; exit 1
fi
echo "docker: Error response from daemon: pull access denied for gemma4-e2b" >&2; exit 125
"""


@pytest.mark.parametrize(
    "args, tag, build",
    [
        ([], "gemma4-e2b:xeon6-v0.30.0", "python build.py build xeon6"),  # the CPU default
        (["--vllm", "0.32.0"], "gemma4-e2b:xeon6-v0.32.0", "python build.py build xeon6 --vllm 0.32.0"),
    ],
)
def test_run_without_the_image_names_the_build_and_asks_no_registry(tmp_path, args, tag, build):
    calls = tmp_path / "calls"
    (tmp_path / "docker").write_text(DOCKER_ONLY_TINY.format(calls=calls))
    (tmp_path / "docker").chmod(0o755)
    r = cli("run", "cpu", *args, env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == (
        f"error: no local image {tag}; build it first (`{build}`): only {tag}-tiny is here, the tiny test "
        "model's image that `smoke --tiny` serves\n"
    )
    assert not [c for c in calls.read_text().splitlines() if c.startswith("run")]  # no `docker run`, no pull


def test_build_dry_run_names_dockerfile_args_and_tag():
    r = cli("build", "b300", "--vllm", "0.30.0", "--dry-run", "--build-arg", "FOO=bar")
    assert r.returncode == 0
    assert "-f Dockerfile.cuda -t gemma4-e2b:b300-v0.30.0" in r.stdout
    # b300 builds on the CUDA 13.0 image, by the digest targets.yaml records for it.
    assert f"BASE_IMAGE={matrix.load().targets['b300'].base.ref}" in r.stdout and "FOO=bar" in r.stdout
    assert "BASE_IMAGE=vllm/vllm-openai:v0.30.0@sha256:" in r.stdout


def test_committed_generated_files_match_a_fresh_render():
    assert render.drift(matrix.load()) == []


def test_render_check_fails_on_drift_and_names_the_fix(tmp_path):
    for item in ("build.py", "gemma4_images", "templates", "image", "patches", "targets.yaml", "releases"):
        src = ROOT / item
        if not src.exists():
            continue
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / item)
    for generated in render.render_all(matrix.load()):
        (tmp_path / generated).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / generated, tmp_path / generated)
    assert cli("render", "--check", cwd=tmp_path).returncode == 0
    (tmp_path / "Dockerfile.cpu").write_text((tmp_path / "Dockerfile.cpu").read_text() + "# hand edit\n")
    (tmp_path / "image" / "recipes" / "retired.json").write_text("{}")
    r = cli("render", "--check", cwd=tmp_path)
    assert r.returncode == 1
    assert "Dockerfile.cpu" in r.stderr and "image/recipes/retired.json" in r.stderr
    assert "python build.py render" in r.stderr


def test_every_dockerfile_passes_hadolint():
    hadolint = Path(sys.executable).parent / "hadolint"
    files = sorted(str(p) for p in ROOT.glob("Dockerfile.*")) + [str(ROOT / "bases/vllm-cpu-local/Dockerfile")]
    r = subprocess.run([str(hadolint), "--no-color", *files], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_python_sources_pass_ruff_lint_and_format():
    # CI runs the tests, not `make lint`, so the linter's verdict has to be a test to gate a merge.
    ruff = Path(sys.executable).parent / "ruff"
    for args in (["check", "--no-cache", "."], ["format", "--check", "--no-cache", "."]):
        r = subprocess.run([str(ruff), *args], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, f"ruff {' '.join(args)}:\n{r.stdout}{r.stderr}"


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["xeon6", "--platform", "linux/riscv64"], 2, "unknown platform 'linux/riscv64'; known platforms: "),
        (["gaudi2", "--platform", "linux/arm64"], 2, "gaudi2 is not built for linux/arm64: its base is published for"),
        (
            ["xeon6", "--image", "x:1", "--platform", "linux/amd64,linux/arm64"],
            2,
            "--image names one platform's image; give one --platform",
        ),
        # the plain tag follows the family's default release (targets.yaml defaults), not another
        (
            ["h100", "--vllm", "0.30.0", "--moving-tag"],
            2,
            "--moving-tag: the plain h100 tag follows h100's default release, vLLM 0.34.0, not 0.30.0",
        ),
    ],
)
def test_push_refuses_a_platform_in_one_line_before_the_registry_is_asked(args, code, message):
    run = cli("push", *args, "--registry", "127.0.0.1:1/ns")
    assert run.returncode == code and run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith(f"error: {message}") and run.stdout == ""


@pytest.mark.parametrize(
    "args, says",
    [
        (["--override", "flashinfer-python"], "--override 'flashinfer-python': give NAME==VERSION=WHY"),
        (
            ["--override", "flashinfer-python==0.7.4= "],
            "--override 'flashinfer-python==0.7.4= ': give NAME==VERSION=WHY",
        ),
        (["--override", "flashinfer-python>=0.7=why"], "--override 'flashinfer-python>=0.7=why': give NAME==VERSION"),
        (["--drop", "logprobs-decode-guard="], "--drop 'logprobs-decode-guard=': say why"),
    ],
)
def test_bump_refuses_a_reasonless_drop_or_override_before_the_index_is_asked(args, says):
    run = cli("bump", "cpu", "--vllm", "0.99.0", *args)
    assert run.returncode == 2 and run.stdout == "" and run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith(f"error: {says}")
