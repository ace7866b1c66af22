"""scripts/setup-host.sh's modes: `packages` (only the Debian packages: what the quick start's
benchmark times in a fresh container) stops before the engine and the venv; a mode it does not know
is refused with its usage line before anything is installed."""

import shutil
import subprocess

import pytest

from gemma4_images.spec.matrix import ROOT

SCRIPT = ROOT / "scripts" / "setup-host.sh"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_an_unknown_mode_is_refused_with_the_usage_line():
    r = run("bogus")
    assert r.returncode == 2
    assert r.stderr.strip() == "usage: setup-host.sh [build|test|packages]"


@pytest.mark.skipif(
    not all(shutil.which(c) for c in ("dockerd", "mmdebstrap", "docker-registry", "htpasswd")),
    reason="this host lacks one of the packages: `packages` would install it",
)
def test_packages_mode_with_every_package_present_touches_nothing(tmp_path):
    # A copy of the script in an empty tree: were it to go on past the packages, it would make a
    # venv (or fail on a missing lock) there.
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts" / "setup-host.sh")
    r = subprocess.run(["bash", "scripts/setup-host.sh", "packages"], cwd=tmp_path, capture_output=True, text=True)
    assert (r.returncode, r.stderr) == (0, "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scripts"]
