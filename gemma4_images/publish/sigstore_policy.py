"""The node-side check of `push --cosign-key`'s signatures for podman, CRI-O and skopeo, which read
containers-policy.json(5) and containers-registries.d(5) (containers/image): a policy that rejects
every image but the repository's, and requires of those a cosign signature by the public key
(`sigstoreSigned`, the key inline), and a registries.d entry that reads signatures from cosign's
attachments. Proven with Debian trixie's skopeo 1.18 (tests/integration/test_cosign.py)."""

from __future__ import annotations

import base64
import contextlib
import json
from pathlib import Path

from gemma4_images.spec import reference


class PolicyError(Exception):
    """Bad input for the policy: one line."""


def scope(repository: str) -> str:
    """The docker transport scope: HOST/PATH as signatures name it (containers-policy.json(5))."""
    try:
        ref = reference.Reference.parse(repository, "the repository")
    except reference.BadReference as e:
        raise PolicyError(str(e)) from None
    if ref.tag or ref.digest:
        raise PolicyError(f"{repository}: give the repository (HOST/PATH), without a tag or digest")
    return ref.full_name


def policy(repository: str, public_key: str, named: str = "the key") -> dict:
    """Reject everything but repository's images, and those unless signed by public_key (cosign's
    PEM text, named in errors). matchRepository: cosign signs the repository's digest, so any tag
    of it is accepted."""
    text = public_key
    if "-----BEGIN PUBLIC KEY-----" not in text:
        raise PolicyError(f"{named} is not a cosign public key (PEM): give cosign.pub, not the private key")
    requirement = {
        "type": "sigstoreSigned",
        "keyData": base64.b64encode(text.encode()).decode(),
        "signedIdentity": {"type": "matchRepository"},
    }
    return {"default": [{"type": "reject"}], "transports": {"docker": {scope(repository): [requirement]}}}


def registries_d(repository: str) -> str:
    """containers-registries.d(5): read the repository's signatures from cosign's attachments."""
    return f"docker:\n  {scope(repository)}:\n    use-sigstore-attachments: true\n"


def write(folder: Path, repository: str, public_key: str, named: str = "the key") -> list[Path]:
    """policy.json and registries.d/gemma4-e2b.yaml in folder (merged into /etc/containers/ on a
    node); both or neither (PolicyError naming folder)."""
    folder = Path(folder)
    files = {
        folder / "policy.json": json.dumps(policy(repository, public_key, named), indent=2) + "\n",
        folder / "registries.d" / "gemma4-e2b.yaml": registries_d(repository),
    }
    made = [p for p in [folder, folder / "registries.d"] if not p.exists()]
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.with_name(path.name + ".partial").write_text(text)
        for path in files:
            path.with_name(path.name + ".partial").replace(path)
    except OSError as e:
        with contextlib.suppress(OSError):  # under a file, nothing was made
            for path in files:
                path.with_name(path.name + ".partial").unlink(missing_ok=True)
            for path in reversed(made):
                if path.is_dir() and not any(path.iterdir()):
                    path.rmdir()
        raise PolicyError(f"cannot write into {folder}: {e.strerror}") from None
    return list(files)
