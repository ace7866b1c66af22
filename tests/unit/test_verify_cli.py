"""`build.py verify` as a pipeline calls it: what it cannot check is one line and exit 1 (or 2 for
a malformed reference), before any copy starts. The checks themselves run against a real
registry in tests/integration/test_signing.py."""

import os

import pytest

from gemma4_images.check.server import free_port
from tests.cli import build_py


def verify(*args, env=None):
    return build_py("verify", *args, env=env)


@pytest.fixture
def key(tmp_path):
    path = tmp_path / "release.pub"
    path.write_text("not used before the registry answers\n")
    return str(path)


def one_line(run, code: int) -> str:
    assert run.returncode == code and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    return run.stderr.strip()


def test_a_malformed_reference_is_a_usage_error(key):
    assert one_line(verify("Bad Ref!!", "--key", key), 2).startswith(
        "error: REF 'Bad Ref!!' is not a valid image reference"
    )


def test_without_a_key_or_policy_there_is_nothing_to_verify_against():
    assert one_line(verify("127.0.0.1:5000/ml/gemma4-e2b:xeon6-v0.30.0"), 1) == (
        "error: nothing to verify against: give the public key (--key FILE) or a policy (--policy FILE)"
    )


def test_key_and_policy_together_are_refused(key):
    assert one_line(verify("127.0.0.1:5000/ml/gemma4-e2b:x", "--key", key, "--policy", key), 1) == (
        "error: --key and --policy both given: the policy names its keys itself; give one"
    )


def test_a_registry_that_is_down_is_named(key):
    ref = f"127.0.0.1:{free_port()}/ml/gemma4-e2b:xeon6-v0.30.0"
    host = ref.split("/")[0]
    assert one_line(verify(ref, "--key", key), 1) == (
        f"error: cannot verify {ref}: {host}: connection refused — is the registry running?"
    )


def test_no_skopeo_is_named_with_the_fix(key, tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # python is called by its full path
    assert one_line(verify("127.0.0.1:5000/ml/gemma4-e2b:x", "--key", key, env=env), 1) == (
        "error: skopeo is not installed: `apt-get install skopeo` (scripts/setup-host.sh)"
    )
