"""The commit convention CONTRIBUTING.md states: subjects of at most 72 characters, from the first
commit after the last one that broke it (older history is left as it is)."""

import subprocess

import pytest

from gemma4_images.spec.matrix import ROOT

LAST_LONG = "f868eed98a89"  # the newest commit whose subject is longer (311 characters)
LIMIT = 72


def subjects(since: str) -> list[tuple[str, str]]:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "log", "--format=%h%x00%s", f"{since}..HEAD"], capture_output=True, text=True
    )
    if out.returncode != 0:
        pytest.skip(f"no git history here ({out.stderr.strip()[:80]})")
    return [tuple(line.split("\0", 1)) for line in out.stdout.splitlines()]


def test_every_commit_subject_since_the_convention_fits_72_characters():
    long = [f"{h} ({len(s)}): {s[:60]}..." for h, s in subjects(LAST_LONG) if len(s) > LIMIT]
    assert long == [], "subjects over 72 characters (CONTRIBUTING.md): " + "; ".join(long)


def test_the_check_sees_a_long_subject():
    # From the commit before LAST_LONG, that commit's own 311-character subject is in the range.
    assert any(len(s) > LIMIT for _, s in subjects(LAST_LONG + "~1"))
