"""`build.py verify` as a pipeline calls it: what it cannot check is one line and exit 1 (or 2 for
bad usage), before anything is asked of the registry. The checks themselves run against a real
registry in tests/integration/test_cosign.py and test_multiplatform_push.py."""

import os

import pytest

from gemma4_images.check.server import free_port
from gemma4_images.publish import cosign
from tests.cli import build_py

REF = "127.0.0.1:5000/ml/gemma4-e2b:xeon6-v0.30.0"


def verify(*args, env=None):
    return build_py("verify", *args, env=env)


@pytest.fixture
def key(tmp_path):
    path = tmp_path / "cosign.pub"
    path.write_text("not used before the registry answers\n")
    return str(path)


def one_line(run, code: int) -> str:
    assert run.returncode == code and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    return run.stderr.strip()


def test_a_malformed_reference_is_a_usage_error(key):
    assert one_line(verify("Bad Ref!!", "--cosign-key", key), 2).startswith(
        "error: REF 'Bad Ref!!' is not a valid image reference"
    )


def test_without_a_key_there_is_nothing_to_verify_against():
    run = verify(REF)
    assert run.returncode == 2 and "Missing option '--cosign-key'" in run.stderr, run.stderr


def test_a_registry_that_is_down_is_named(key):
    ref = f"127.0.0.1:{free_port()}/ml/gemma4-e2b:xeon6-v0.30.0"
    host = ref.split("/")[0]
    assert one_line(verify(ref, "--cosign-key", key), 1) == (
        f"error: cannot verify {ref}: {host}: connection refused — is the registry running?"
    )


def test_no_cosign_is_named_with_the_setup_command(key, tmp_path):
    # python is called by its full path; the tools folder is an empty one
    env = {**os.environ, "PATH": str(tmp_path), "GEMMA4_TOOLS_DIR": str(tmp_path)}
    assert one_line(verify(REF, "--cosign-key", key, env=env), 1) == (
        "error: cosign is not installed: run scripts/setup-tools.sh (Debian trixie's cosign, "
        "requirements/trixie-tools.lock)"
    )


def test_an_unknown_platform_is_a_usage_error(key):
    run = verify(REF, "--cosign-key", key, "--platform", "linux/riscv64")
    assert one_line(run, 2) == "error: unknown platform 'linux/riscv64'; known platforms: linux/amd64, linux/arm64"


@pytest.mark.parametrize("command", [["pin", "--check"], ["verify", REF, "--cosign-key", "KEY"]])
def test_no_oras_is_named_with_the_setup_command(command, key, tmp_path):
    # pin and verify ask the registry through oras (push too, once its gates pass): without it, one
    # line before anything is asked. The tools folder holds cosign only.
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "cosign").symlink_to(cosign.binary())
    env = {**os.environ, "PATH": str(tools), "GEMMA4_TOOLS_DIR": str(tools)}
    run = build_py(*[key if arg == "KEY" else arg for arg in command], env=env)
    assert one_line(run, 1) == (
        "error: oras is not installed: run scripts/setup-tools.sh (Debian trixie's oras, "
        "requirements/trixie-tools.lock)"
    )
