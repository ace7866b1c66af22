"""Throwaway cosign key pairs for the tests that sign (made by cosign itself, in a folder the test owns)."""

import os
import subprocess
from pathlib import Path

from gemma4_images.publish import cosign


def key_pair(folder: Path, password: str) -> tuple[Path, Path]:
    """cosign generate-key-pair in folder (made here); (private key, public key)."""
    folder.mkdir()
    made = subprocess.run(
        [cosign.binary(), "generate-key-pair"],
        cwd=folder,
        capture_output=True,
        env={**os.environ, "COSIGN_PASSWORD": password},
    )
    assert made.returncode == 0, made.stderr
    return folder / "cosign.key", folder / "cosign.pub"
