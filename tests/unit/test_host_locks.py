"""The two host locks setup-host.sh installs: requirements/build.lock (building and serving) and
requirements/test.lock (the tests). A venv synced from test.lock counts as having build.lock
(setup-host.sh skips the build sync then), which holds only while test.lock pins every package of
build.lock at the same version with the same hashes (scripts/lock.sh compiles it so)."""

import re

from gemma4_images.build.wheels import lock_entries
from gemma4_images.spec.matrix import ROOT

BUILD, TEST = ROOT / "requirements" / "build.lock", ROOT / "requirements" / "test.lock"


def pins(text: str) -> dict[str, set[str]]:
    """name==version -> its hashes."""
    return {entry.split()[0]: set(re.findall(r"--hash=(sha256:[0-9a-f]+)", entry)) for entry in lock_entries(text)}


def test_the_test_lock_pins_all_of_the_build_lock():
    build, test = pins(BUILD.read_text()), pins(TEST.read_text())
    differ = sorted(p for p in build if test.get(p) != build[p])
    assert differ == [], f"test.lock lacks or hashes differently: {differ}; run `make lock`"


def test_the_build_lock_has_no_torch():
    # What it is for: building and serving (the BOS tokenizer copy too) without the tests' 1.2 GB.
    assert not [p for p in pins(BUILD.read_text()) if p.split("==")[0] == "torch"]
