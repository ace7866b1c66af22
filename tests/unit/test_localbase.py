"""When a stand-in base (here the CPU one) counts as up to date: its own inputs and a current root filesystem.
The Docker client here is a stand-in (FakeClient): only which images exist, with which labels."""

import types
from pathlib import Path

import pytest
from docker.errors import ImageNotFound

from gemma4_images.build import localbase, wheels
from gemma4_images.spec import matrix

M = matrix.load()
CPU = M.standins[localbase.CPU_STANDIN]
BASE = CPU.tag


class FakeClient:
    """Stand-in for docker.DockerClient: images by tag, each with an id and labels."""

    def __init__(self, images: dict[str, tuple[str, dict]]):
        def get(ref):
            if ref not in images:
                raise ImageNotFound(ref)
            image_id, labels = images[ref]
            return types.SimpleNamespace(id=image_id, labels=labels)

        self.images = types.SimpleNamespace(get=get)


@pytest.fixture
def any_buildkit_cli(monkeypatch):
    """cpu_base's BuildKit probe answered without this machine's docker CLI."""
    monkeypatch.setattr(localbase, "buildkit_cli", lambda: "docker")


def base_inputs(rootfs_id: str) -> str:
    """What cpu_base records for a base built on that root filesystem (its inputs_for)."""
    return localbase._inputs_hash(localbase.recipe(CPU), CPU.lock_path.read_text(), rootfs_id)


def client_with(rootfs_label: str) -> FakeClient:
    label = localbase.INPUTS_LABEL
    return FakeClient(
        {
            localbase.ROOTFS_TAG: ("sha256:rootfs", {label: rootfs_label}),
            BASE: ("sha256:base", {label: base_inputs("sha256:rootfs")}),
        }
    )


def test_a_base_on_a_current_root_filesystem_is_up_to_date():
    lines = []
    assert localbase.cpu_base(client_with(localbase.ROOTFS_INPUTS), M, lines.append) == BASE
    assert lines == [f"{BASE} is up to date"]


def test_a_stale_root_filesystem_is_rebuilt_even_when_the_base_matches_it(monkeypatch, any_buildkit_cli):
    # The package list changed since the root filesystem was made: it must be made again (here
    # mmdebstrap is "missing", so the attempt shows as its one-line refusal), not reused.
    monkeypatch.setattr(localbase.shutil, "which", lambda name: None)
    monkeypatch.setattr(localbase, "locked_wheelhouse", lambda *a, **kw: None)
    with pytest.raises(localbase.LocalBaseError, match="mmdebstrap is not installed"):
        localbase.cpu_base(client_with("an-older-package-list"), M, print)


def test_prefetch_runs_on_the_root_filesystem_while_the_base_builds(monkeypatch, any_buildkit_cli, tmp_path):
    # The base is missing (rebuilt); the image build's downloads go ahead meanwhile: the stand-in
    # build below only finishes once prefetch has been called, so a prefetch run after the base
    # build (or never) fails here.
    import threading

    started, seen = threading.Event(), []
    label = localbase.INPUTS_LABEL
    client = FakeClient({localbase.ROOTFS_TAG: ("sha256:rootfs", {label: localbase.ROOTFS_INPUTS})})
    house = tmp_path / "wheelhouse"
    house.mkdir()
    monkeypatch.setattr(localbase, "locked_wheelhouse", lambda *a, **kw: house)

    def build_base(client, matrix, standin, log, tag, nocache, base, inputs, wheels, interpreter=None):
        assert started.wait(10), "prefetch did not run while the base was building"
        seen.append((tag, base, wheels))

    monkeypatch.setattr(localbase, "_build_base", build_base)
    prefetched = []
    localbase.cpu_base(client, M, print, prefetch=lambda rootfs: prefetched.append(rootfs) or started.set())
    assert prefetched == [localbase.ROOTFS_TAG] and seen == [(BASE, localbase.ROOTFS_TAG, house)]
    assert not house.exists()  # the base holds its wheels: the disk gets the wheelhouse back


def test_a_failed_base_build_keeps_its_wheelhouse_for_the_next_try(monkeypatch, any_buildkit_cli, tmp_path):
    label = localbase.INPUTS_LABEL
    client = FakeClient({localbase.ROOTFS_TAG: ("sha256:rootfs", {label: localbase.ROOTFS_INPUTS})})
    house = tmp_path / "wheelhouse"
    house.mkdir()
    monkeypatch.setattr(localbase, "locked_wheelhouse", lambda *a, **kw: house)

    def build_base(*args, **kwargs):
        raise localbase.LocalBaseError("the build failed")

    monkeypatch.setattr(localbase, "_build_base", build_base)
    with pytest.raises(localbase.LocalBaseError):
        localbase.cpu_base(client, M, print)
    assert house.exists()


@pytest.mark.parametrize("key", sorted(M.standins))
def test_the_committed_lock_pins_what_targets_yaml_and_the_tool_lock_say(key):
    # CI's drift check for each stand-in's lock (requirements/*-base.lock): `make lock` is due when this fails.
    text = localbase.checked_lock(M, key)
    pins = [entry.split()[0] for entry in wheels.lock_entries(text)]
    assert set(localbase.base_requirements(M, key)) <= set(pins) and len(pins) == len(set(pins))
    assert all("--hash=sha256:" in entry for entry in wheels.lock_entries(text))


def test_the_cuda_stand_in_locks_pypis_cuda_torch_not_the_local_cpu_build():
    # PEP 440 lets torch==X match X+cpu, which lies in this machine's local wheel folder: the CUDA
    # stand-in's lock must be PyPI's CUDA build with the nvidia wheels it pulls.
    pins = [e.split()[0] for e in wheels.lock_entries(localbase.checked_lock(M, "vllm-cuda13"))]
    torch = next(p for p in pins if p.startswith("torch=="))
    assert "+" not in torch and any(p.startswith("nvidia-cuda-runtime==13.") for p in pins), pins


def test_a_lock_that_misses_a_pin_is_one_line_naming_make_lock(monkeypatch, tmp_path):
    text = CPU.lock_path.read_text()
    (tmp_path / "requirements").mkdir()
    pin = f"transformers=={M.project.transformers_version} "
    (tmp_path / CPU.lock).write_text(text.replace(pin, "transformers==5.24.0 "))
    monkeypatch.setattr(matrix, "ROOT", tmp_path)
    monkeypatch.setattr(localbase, "ROOT", tmp_path)
    with pytest.raises(localbase.LocalBaseError) as refused:
        localbase.checked_lock(M)
    assert str(refused.value) == (
        f"{CPU.lock} does not pin transformers=={M.project.transformers_version} (targets.yaml or the tool "
        "lock changed): run `make lock` and commit the lock it writes"
    )


def test_the_locked_wheelhouse_asks_for_each_pin_once_with_its_hashes(monkeypatch, tmp_path):
    # pip itself is not run here (the base build in CI is, from this wheelhouse): what it is
    # asked is, every pin exactly once across the parallel downloads, hashes required, no resolving.
    monkeypatch.setattr(wheels, "cache_dir", lambda: tmp_path)
    asked = []

    def pip_download(requirements, dest, *args, nice=False):
        assert requirements[0] == "-r" and {"--no-deps", "--require-hashes"} <= set(args)
        asked.extend(Path(requirements[1]).read_text().splitlines())

    monkeypatch.setattr(wheels, "_pip_download", pip_download)
    dest = wheels.locked_wheelhouse(CPU.lock_path)
    entries = wheels.lock_entries(CPU.lock_path.read_text())
    assert sorted(asked) == sorted(entries) and len(entries) > 100
    assert (dest / ".complete").read_text() == CPU.lock_path.read_text()
    asked.clear()
    assert wheels.locked_wheelhouse(CPU.lock_path) == dest and asked == []  # once per machine


def test_without_a_buildkit_cli_the_base_build_is_refused_before_anything_is_made(monkeypatch, tmp_path):
    # The stand-in base builds with BuildKit. A docker CLI that cannot (here one whose
    # `build --help` fails, as a new CLI without its buildx plugin does) is refused in one line,
    # before the root filesystem or the wheelhouse is made.
    from gemma4_images.build import docker_build

    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'ERROR: BuildKit is enabled but the buildx component is missing' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(docker_build, "BUILDKIT_CLIS", (str(fake),))
    made = []
    monkeypatch.setattr(localbase, "locked_wheelhouse", lambda *a, **kw: made.append("wheelhouse"))
    monkeypatch.setattr(localbase, "rootfs", lambda *a, **kw: made.append("rootfs"))
    with pytest.raises(docker_build.DockerUnavailable) as refused:
        localbase.cpu_base(FakeClient({}), M, print)
    assert str(refused.value) == (
        "no docker CLI here builds with BuildKit (DOCKER_BUILDKIT=1): install the docker.io "
        "package's (`apt-get install docker.io`: /usr/bin/docker), or the buildx plugin of yours"
    )
    assert made == []


def fake_cpython(prefix: Path, version: str = "3.12") -> Path:
    """The shape of a CPython install (pyenv's, the official image's): the interpreter, its links,
    scripts whose #! names the prefix, the standard library with tests and bytecode, site-packages
    holding pip and a machine's .pth file."""
    files = {
        f"bin/python{version}": "ELF",
        "bin/pip3": f"#!{prefix}/bin/python{version}\n",
        "include/python/Python.h": "",
        f"lib/libpython{version}.so.1.0": "ELF",
        f"lib/python{version}/os.py": "# os\n",
        f"lib/python{version}/__pycache__/os.cpython-312.pyc": "bytecode",
        f"lib/python{version}/test/test_os.py": "",
        f"lib/python{version}/idlelib/idle_test/test_x.py": "",
        f"lib/python{version}/config-{version}-x86_64-linux-gnu/libpython{version}.a": "static",
        f"lib/python{version}/site-packages/pip/__init__.py": "",
        f"lib/python{version}/site-packages/_machine_ca.pth": "import os",
    }
    for rel, text in files.items():
        (prefix / rel).parent.mkdir(parents=True, exist_ok=True)
        (prefix / rel).write_text(text)
    (prefix / "bin" / "python3").symlink_to(f"python{version}")
    return prefix


def test_the_interpreter_tar_keeps_cpython_and_leaves_out_the_hosts_files(tmp_path):
    import tarfile

    prefix = fake_cpython(tmp_path / "py")
    digest = localbase.interpreter_tar(prefix, "3.12", tmp_path / "a.tar")
    with tarfile.open(tmp_path / "a.tar") as tar:
        members = {m.name: m for m in tar.getmembers()}
    files = sorted(n for n, m in members.items() if not m.isdir())
    assert files == [
        "bin/python3",
        "bin/python3.12",
        "include/python/Python.h",
        "lib/libpython3.12.so.1.0",
        "lib/python3.12/os.py",
    ]
    assert "lib/python3.12/site-packages" in members  # the empty directory pip installs into
    assert {(m.uid, m.gid, m.mtime) for m in members.values()} == {(0, 0, 0)}
    # The same install, touched again, gives the same digest: the stand-in stays cached.
    (prefix / "lib/python3.12/os.py").touch()
    assert localbase.interpreter_tar(prefix, "3.12", tmp_path / "b.tar") == digest
    (prefix / "lib/python3.12/os.py").write_text("# changed\n")
    assert localbase.interpreter_tar(prefix, "3.12", tmp_path / "c.tar") != digest


def test_a_missing_interpreter_is_one_line_naming_where_to_get_one(tmp_path):
    fake_cpython(tmp_path / "py", "3.11")
    with pytest.raises(localbase.LocalBaseError) as e:
        localbase.interpreter_tar(tmp_path / "py", "3.12", tmp_path / "a.tar")
    assert str(e.value).startswith(f"no CPython 3.12 at {tmp_path / 'py'} (Debian's root filesystem has none)")
    assert "pyenv install" in str(e.value) and "\n" not in str(e.value)


def test_the_tpu_stand_in_locks_vllm_tpu_with_tpu_inference_for_cpython_3_12():
    tpu = M.standins["vllm-tpu"]
    pins = [e.split()[0] for e in wheels.lock_entries(localbase.checked_lock(M, "vllm-tpu"))]
    assert tpu.python == "3.12" and {"vllm-tpu==0.30.0", "tpu-inference==0.30.0"} <= set(pins)
    assert any(p.startswith("libtpu==") for p in pins) and any(p.startswith("jax==") for p in pins)
