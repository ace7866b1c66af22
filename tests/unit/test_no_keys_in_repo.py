"""No private key is in the repository: no file git tracks or would add (untracked, not ignored)
holds an armored private key (cosign's, OpenPGP, PEM, OpenSSH) or a GnuPG secret-key file. The
scan is shown to find a cosign key first, in a throwaway repository holding one made here."""

import re
import subprocess
from pathlib import Path

from gemma4_images.spec import matrix
from tests.cosign_keys import key_pair

# Armored keys (cosign's SIGSTORE/COSIGN, OpenPGP, PEM, OpenSSH) and GnuPG 2.1+'s private-keys-v1.d
# files (a canonical S-expression opening with a length-prefixed private-key atom, or the extended
# "Key:" format). (This file is scanned too: nothing here spells a whole marker.)
PRIVATE_KEY = re.compile(
    rb"-----BEGIN (?:PGP PRIVATE KEY BLOCK|(?:RSA |EC |DSA |ENCRYPTED |OPENSSH )?"
    rb"(?:(?:SIGSTORE|COSIGN) )?PRIVATE KEY)-----"
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
    repo = tmp_path / "repo"
    repo.mkdir()
    private, public = key_pair(tmp_path / "keys", "")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "notes.txt").write_text("nothing secret\n")
    assert private_keys_in(repo) == []
    (repo / "signing").mkdir()
    (repo / "signing" / "cosign.key").write_bytes(private.read_bytes())
    (repo / "release.pem").write_bytes(private.read_bytes().replace(b"ENCRYPTED SIGSTORE ", b"EC "))
    assert private_keys_in(repo) == ["release.pem", "signing/cosign.key"]
    # Public keys are fine to commit.
    (repo / "signing" / "cosign.key").write_bytes(public.read_bytes())
    (repo / "release.pem").unlink()
    assert private_keys_in(repo) == []


def test_the_repository_holds_no_private_key():
    assert private_keys_in(matrix.ROOT) == []
