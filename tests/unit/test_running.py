"""A target's `run` fields (targets.yaml) as a `docker run` line, SDK arguments and a device check."""

import shlex
import types

import pytest

from gemma4_images.check import running
from gemma4_images.spec import matrix

M = matrix.load()


def test_the_docker_line_round_trips_every_field():
    run = matrix.Run(
        runtime="habana",
        gpus="all",
        env={"A": "x y"},
        pass_env=["HF_TOKEN"],
        privileged=True,
        cap_add=["SYS_NICE"],
        devices=["/dev/kfd"],
        group_add=["video"],
        security_opt=["seccomp=unconfined"],
        ipc="host",
        network="host",
        shm_size="16G",
        volumes={"/dev/shm": "/dev/shm"},
        publish=["8000:8000"],
    )
    line = shlex.join(running.docker_flags(run))
    assert line == (
        "--runtime=habana --gpus all -e 'A=x y' --privileged --cap-add=SYS_NICE --device=/dev/kfd "
        "--group-add=video --security-opt=seccomp=unconfined --ipc=host --network=host --shm-size=16G "
        "-v /dev/shm:/dev/shm -e HF_TOKEN -p 8000:8000"
    )


def test_sdk_kwargs_pass_named_env_from_the_caller(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "from-the-caller")
    kw = running.sdk_kwargs(M.targets["trillium"].run)
    assert kw["environment"] == {"HF_TOKEN": "from-the-caller"}
    assert kw["volumes"] == {"/dev/shm": {"bind": "/dev/shm", "mode": "rw"}} and kw["privileged"] is True
    assert "network_mode" not in kw and "ports" not in kw  # the smoke tier serves on host loopback


def test_device_missing_names_what_is_absent(tmp_path):
    # Stand-in Docker clients: only what `docker info` says about runtimes.
    client = types.SimpleNamespace(info=lambda: {"Runtimes": {"runc": {}}})
    assert "habana container runtime" in running.device_missing(client, M.families["gaudi"].present)
    assert running.device_missing(client, M.families["cpu"].present) is None
    (tmp_path / "accel0").touch()
    assert running.device_missing(client, matrix.Present(paths=[str(tmp_path / "accel*")])) is None
    assert (
        running.device_missing(client, matrix.Present(paths=[str(tmp_path / "kfd")])) == f"no device at {tmp_path}/kfd"
    )
    with_habana = types.SimpleNamespace(info=lambda: {"Runtimes": {"habana": {}}})
    assert running.device_missing(with_habana, M.families["gaudi"].present) is None


@pytest.mark.parametrize("architecture", ["amd64", "arm64"])
def test_a_server_under_emulation_gets_longer_to_answer(monkeypatch, architecture):
    """Only an image of another architecture than this host's runs emulated, and only then is each
    answer waited for longer (measured: start-up took 12.7x under qemu; server.EMULATED_SLOWDOWN)."""
    import platform as host

    from gemma4_images.check import server

    monkeypatch.setattr(server, "_architecture", lambda image: architecture)
    native = {"x86_64": "amd64", "aarch64": "arm64"}[host.machine()]
    expected = server.REQUEST_TIMEOUT_S * (1 if architecture == native else server.EMULATED_SLOWDOWN)
    assert server.request_timeout("any") == expected
