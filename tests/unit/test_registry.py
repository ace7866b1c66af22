"""How build/registry.py reads oras's errors (the wording of Debian trixie's oras 1.2.0, as it
answered a loopback registry): one line, the unreachable and the login cases told apart."""

import subprocess

import pytest

from gemma4_images.build import registry

HOST = "127.0.0.1:5000"


def failing(stderr: str):
    def run(args, **kw):
        return subprocess.CompletedProcess(args, 1, b"", stderr.encode())

    return run


@pytest.mark.parametrize(
    "said, kind, ends",
    [
        (
            'Error: failed to resolve digest: Head "http://127.0.0.1:1/v2/t/x/manifests/v1": dial tcp '
            "127.0.0.1:1: connect: connection refused",
            registry.RegistryUnavailable,
            "— is the registry reachable?",
        ),
        (
            "Error: 127.0.0.1:5000/t/x:v1: basic credential not found\nPlease check whether the registry "
            "credential stored in the authentication file is correct",
            registry.RegistryError,
            f"(log in with `docker login {HOST}`)",
        ),
        (
            "Error: response status code 401: Unauthorized",
            registry.RegistryError,
            f"(log in with `docker login {HOST}`)",
        ),
        ("Error response from registry: failed to fetch: t/x:nope: not found", registry.RegistryError, ": not found"),
    ],
)
def test_oras_errors_are_one_line_of_their_kind(monkeypatch, said, kind, ends):
    monkeypatch.setattr(registry, "binary", lambda: "oras")
    monkeypatch.setattr(subprocess, "run", failing(said))
    with pytest.raises(kind) as raised:
        registry.get_blob(HOST, "t/x", "sha256:" + "0" * 64)
    message = str(raised.value)
    assert "\n" not in message and message.endswith(ends) and type(raised.value) is kind, message


def test_a_missing_tag_is_none_not_an_error(monkeypatch):
    monkeypatch.setattr(registry, "binary", lambda: "oras")
    monkeypatch.setattr(
        subprocess, "run", failing("Error response from registry: failed to resolve: t/x:v9: not found")
    )
    assert registry.manifest_digest(HOST, "t/x", "v9") is None
