"""No private key is in the repository: no file git tracks or would add (untracked, not ignored)
holds an armored private key or a GnuPG secret-key file. The scan is shown to find both first,
in a throwaway repository holding a key made here."""

import os
import re
import subprocess
from pathlib import Path

from gemma4_images.spec import matrix

# Armored keys (OpenPGP, PEM, OpenSSH) and GnuPG 2.1+'s private-keys-v1.d files (a canonical
# S-expression opening with a length-prefixed private-key atom, or the extended "Key:" format).
# (This file is scanned too: nothing here spells a whole marker.)
PRIVATE_KEY = re.compile(
    rb"-----BEGIN (?:PGP PRIVATE KEY BLOCK|(?:RSA |EC |DSA |ENCRYPTED |OPENSSH )?PRIVATE KEY)-----"
    rb"|\(\d+:(?:protected-|shadowed-)?private-key"
    rb"|^Key: \((?:protected-|shadowed-)?private-key",
    re.M,
)


def private_keys_in(root: Path) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    names = [n for n in listed.decode().split("\0") if n]
    return [n for n in names if (root / n).is_file() and PRIVATE_KEY.search((root / n).read_bytes())]


def test_the_scan_finds_a_key_added_to_a_repository(tmp_path):
    home, repo = tmp_path / "gnupg", tmp_path / "repo"
    home.mkdir(mode=0o700)
    repo.mkdir()
    env = {**os.environ, "GNUPGHOME": str(home)}

    def gpg(*args):
        return subprocess.run(["gpg", "--batch", *args], env=env, capture_output=True, check=True).stdout

    try:
        gpg("--passphrase", "", "--quick-gen-key", "leak <leak@gemma4-images.invalid>", "ed25519", "sign", "1d")
        subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
        (repo / "notes.txt").write_text("nothing secret\n")
        assert private_keys_in(repo) == []
        (repo / "release.asc").write_bytes(gpg("--armor", "--export-secret-keys"))
        (key_file,) = (home / "private-keys-v1.d").glob("*.key")
        (repo / "keyring").mkdir()
        (repo / "keyring" / key_file.name).write_bytes(key_file.read_bytes())
        assert private_keys_in(repo) == ["keyring/" + key_file.name, "release.asc"]
        # Public keys are fine to commit.
        (repo / "release.asc").write_bytes(gpg("--armor", "--export"))
        (repo / "keyring" / key_file.name).unlink()
        assert private_keys_in(repo) == []
    finally:
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env)


def test_the_repository_holds_no_private_key():
    assert private_keys_in(matrix.ROOT) == []
