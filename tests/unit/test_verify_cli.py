"""`build.py verify` as a pipeline calls it: what it cannot check is one line and exit 1 (or 2 for
a malformed reference), before any copy starts. The checks themselves run against a real
registry in tests/integration/test_signing.py."""

import os

import pytest

from gemma4_images.check.server import free_port
from gemma4_images.publish import signing
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


def _policy(docker: dict, default=None) -> dict:
    return {"default": default or [{"type": "reject"}], "transports": {"docker": docker}}


def signed_by(path):
    return [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": path}]


REF = "127.0.0.1:5000/ml/gemma4-e2b:xeon6-v0.30.0"


@pytest.mark.parametrize(
    "scopes, expected",
    [
        ({REF: signed_by("/exact"), "127.0.0.1:5000/ml/gemma4-e2b": signed_by("/repo")}, ["/exact"]),
        ({"127.0.0.1:5000/ml/gemma4-e2b": signed_by("/repo"), "127.0.0.1:5000/ml": signed_by("/ns")}, ["/repo"]),
        ({"127.0.0.1:5000/ml": signed_by("/ns"), "127.0.0.1:5000": signed_by("/host")}, ["/ns"]),
        ({"127.0.0.1:5000": signed_by("/host"), "": signed_by("/transport")}, ["/host"]),
        ({"": signed_by("/transport")}, ["/transport"]),
        ({"other.example/x": signed_by("/other")}, []),  # the default (reject) applies: skopeo refuses
        ({REF: [{"type": "insecureAcceptAnything"}], "127.0.0.1:5000": signed_by("/host")}, []),
        ({REF: [{"type": "signedBy", "keyType": "GPGKeys", "keyPaths": ["/a", "/b"]}]}, ["/a", "/b"]),
    ],
)
def test_the_index_is_checked_with_the_keys_of_the_most_specific_scope(scopes, expected, tmp_path):
    """containers-policy.json(5)'s precedence, as skopeo applies it to the platform's image."""
    keys = signing.required_keys(_policy(scopes), REF, tmp_path)
    assert [str(k) for k in keys] == expected


def test_key_data_in_the_policy_is_written_out_to_check_with(tmp_path):
    import base64

    policy = _policy({REF: [{"type": "signedBy", "keyType": "GPGKeys", "keyData": base64.b64encode(b"KEY").decode()}]})
    (key,) = signing.required_keys(policy, REF, tmp_path)
    assert key.read_bytes() == b"KEY" and key.parent == tmp_path


def test_an_unknown_platform_is_a_usage_error(key):
    run = verify(REF, "--key", key, "--platform", "linux/riscv64")
    assert one_line(run, 2) == "error: unknown platform 'linux/riscv64'; known platforms: linux/amd64, linux/arm64"
