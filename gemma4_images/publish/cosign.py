"""cosign key-pair signatures and DSSE attestations on what `push` stores: the form Kubernetes
admission controllers (Sigstore policy-controller, Kyverno, Connaisseur) and `cosign verify` read.
Offline: no transparency log and no network but the registry's. cosign itself is Debian trixie's
2.5.0 (requirements/trixie-tools.lock, scripts/setup-tools.sh)."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gemma4_images.build import registry as registry_api
from gemma4_images.build import tools


@dataclass(frozen=True)
class Attestation:
    kind: str  # cosign's name for the predicate type (verify-attestation --type)
    uri: str  # the predicate type attested
    report: str  # the report it carries, as `build` names it in the reports folder


# Attested by URI: cosign 2.5 re-encodes a `--type slsaprovenance1` predicate through its own
# struct (measured: metadata.invocationId came back as invocationID); by URI it keeps the bytes.
ATTESTATIONS = (
    Attestation("cyclonedx", "https://cyclonedx.org/bom", "sbom-{key}.cdx.json"),
    Attestation("slsaprovenance1", "https://slsa.dev/provenance/v1", "provenance-{key}.intoto.json"),
)


def reports_of(key: str, reports_dir: Path) -> list[tuple[Attestation, Path]]:
    """Each attestation with the report it carries for the image filed under key."""
    return [(a, Path(reports_dir) / a.report.format(key=key)) for a in ATTESTATIONS]


class CosignError(Exception):
    """cosign refused or failed: one line."""


def binary() -> str:
    return tools.require("cosign", CosignError)


def _registry_flags(host: str) -> list[str]:
    # Loopback registries speak plain HTTP, as the engine assumes (registry.scheme).
    return ["--allow-http-registry"] if registry_api.scheme(host) == "http" else []


def _message(stderr: str) -> str:
    """cosign's own error line, without its usage text."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [
        re.sub(r"^(Error: |error during command execution: )+", "", ln)
        for ln in lines
        if ln.startswith(("Error:", "error"))
    ]
    return (errors or lines or ["no output"])[-1]


def _run(args: list[str], what: str, password_file: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COSIGN_YES": "true"}
    # The key's password: its file, else COSIGN_PASSWORD as cosign reads it, else none (a key made
    # without one); never a prompt.
    if password_file is not None:
        env["COSIGN_PASSWORD"] = Path(password_file).read_text().rstrip("\n")
    env.setdefault("COSIGN_PASSWORD", "")
    run = subprocess.run([binary(), *args], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    if run.returncode != 0:
        raise CosignError(f"{what}: {_message(run.stderr)}")
    return run


def check_key(key: Path, password_file: Path | None = None) -> None:
    """The key opens with its password (cosign derives its public key): checked before a push."""
    public_key(key, password_file)


def public_key(key: Path, password_file: Path | None = None) -> str:
    """The PEM public key of the private key (what verifiers and the node policy are given)."""
    return _run(["public-key", "--key", str(key)], f"cosign cannot use {key}", password_file).stdout


def sign(host: str, repository: str, digest: str, key: Path, password_file: Path | None = None) -> str:
    """Sign the manifest host/repository@digest with key; returns what was signed."""
    ref = f"{host}/{repository}@{digest}"
    _run(
        ["sign", "--key", str(key), "--tlog-upload=false", *_registry_flags(host), ref],
        f"cosign could not sign {ref}",
        password_file,
    )
    return ref


def predicate_of(attestation: Attestation, document: Path, folder: Path) -> Path:
    """What cosign attests: the SBOM itself; the provenance Statement's predicate (cosign writes
    the Statement, its subject the signed image)."""
    if attestation.kind != "slsaprovenance1":
        return document
    statement = json.loads(document.read_text())
    path = folder / "predicate.json"
    path.write_text(json.dumps(statement["predicate"]) + "\n")
    return path


def attest(
    host: str, repository: str, digest: str, attestation: Attestation, document: Path, key: Path, password_file=None
) -> dict:
    """Attach document to host/repository@digest as a signed DSSE attestation of its predicate type."""
    ref = f"{host}/{repository}@{digest}"
    with tempfile.TemporaryDirectory(prefix="gemma4-cosign-") as tmp:
        predicate = predicate_of(attestation, document, Path(tmp))
        _run(
            ["attest", "--key", str(key), "--type", attestation.uri, "--predicate", str(predicate)]
            # --replace: an image pushed again keeps one attestation of each type (cosign appends
            # another otherwise, measured: 4 after two pushes; its signatures it does not repeat)
            + ["--replace", "--tlog-upload=false", *_registry_flags(host), ref],
            f"cosign could not attest {document.name} to {ref}",
            password_file,
        )
    return {"type": attestation.kind, "file": str(document)}


def verify(host: str, repository: str, digest: str, key: Path) -> None:
    """cosign's check of the manifest's signature by key; CosignError when it has none by that key."""
    ref = f"{host}/{repository}@{digest}"
    _run(
        ["verify", "--key", str(key), "--insecure-ignore-tlog=true", *_registry_flags(host), ref],
        f"{ref} refused by cosign verify",
    )


def verify_attestation(host: str, repository: str, digest: str, attestation: Attestation, key: Path) -> dict:
    """cosign's check of the attestation of its type; returns its in-toto Statement."""
    ref = f"{host}/{repository}@{digest}"
    run = _run(
        ["verify-attestation", "--key", str(key), "--type", attestation.kind, "--insecure-ignore-tlog=true"]
        + [*_registry_flags(host), ref],
        f"{ref} refused by cosign verify-attestation --type {attestation.kind}",
    )
    envelope = json.loads(run.stdout.strip().splitlines()[-1])
    return json.loads(base64.b64decode(envelope["payload"]))
