"""The node policy `build.py policy` and `push --cosign-key` write (what skopeo 1.18 does with it:
tests/integration/test_cosign.py): its form, and bad input that writes nothing."""

import base64
import json

import pytest

from gemma4_images.publish import sigstore_policy
from tests.cli import build_py

PEM = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----\n"
REPO = "registry.example:5000/ml/gemma4-e2b"


def test_only_the_repository_is_admitted_and_only_signed_by_the_key(tmp_path):
    written = sigstore_policy.write(tmp_path / "out", REPO, PEM)
    assert written == [tmp_path / "out" / "policy.json", tmp_path / "out" / "registries.d" / "gemma4-e2b.yaml"]
    policy = json.loads(written[0].read_text())
    assert policy["default"] == [{"type": "reject"}]
    (requirement,) = policy["transports"]["docker"][REPO]
    assert requirement["type"] == "sigstoreSigned" and requirement["signedIdentity"] == {"type": "matchRepository"}
    assert base64.b64decode(requirement["keyData"]).decode() == PEM
    assert written[1].read_text() == f"docker:\n  {REPO}:\n    use-sigstore-attachments: true\n"


@pytest.mark.parametrize(
    "repository, key, says",
    [
        (f"{REPO}:xeon6", PEM, "without a tag or digest"),
        ("Registry.example/ML", PEM, "is not a valid image reference"),
        (REPO, "-----BEGIN ENCRYPTED SIGSTORE " + "PRIVATE KEY-----\n", "is not a cosign public key (PEM)"),
    ],
)
def test_bad_input_raises_one_line_and_writes_nothing(tmp_path, repository, key, says):
    with pytest.raises(sigstore_policy.PolicyError, match="^[^\n]*" + says.replace("(", r"\(").replace(")", r"\)")):
        sigstore_policy.write(tmp_path / "out", repository, key)
    assert not (tmp_path / "out").exists()


def test_an_out_folder_that_cannot_be_written_leaves_nothing(tmp_path):
    (tmp_path / "taken").write_text("a file, not a folder\n")
    with pytest.raises(sigstore_policy.PolicyError, match=r"^cannot write into .*taken/sub"):
        sigstore_policy.write(tmp_path / "taken" / "sub", REPO, PEM)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "registries.d").write_text("a file where the folder goes\n")
    with pytest.raises(sigstore_policy.PolicyError, match="^cannot write into"):
        sigstore_policy.write(tmp_path / "out", REPO, PEM)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["registries.d"]  # no policy.json, no .partial


def test_the_command_names_an_unreadable_key_in_one_line(tmp_path):
    (tmp_path / "binary.pub").write_bytes(b"\xff\xfe\x00")
    for key, says in [(tmp_path / "binary.pub", "not a text file"), (tmp_path / "none.pub", "No such file")]:
        run = build_py("policy", REPO, "--cosign-key", str(key), "--out", str(tmp_path / "out"))
        assert run.returncode == 2 and run.stderr.count("\n") == 1 and says in run.stderr, run.stderr
    assert not (tmp_path / "out").exists()
