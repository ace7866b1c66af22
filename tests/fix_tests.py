"""The one command line that runs the vllm-gaudi fixes' tests (tests/unit/test_gaudi_fix_*.py)
against a checkout. scripts/check-fixes.sh, scripts/hunk_coverage.py and the integration tests
that run them in the test image or on the snapshots all take it from here, so their flags cannot
drift apart. Standard library only: it runs under whichever Python has vLLM 0.30.0 (a venv, the
test image's).

`python tests/fix_tests.py [PYTEST ARGS] [TEST ...]` runs them (every module when no test is named),
with the checkout, pack and no-skip rule taken from the environment (VLLM_GAUDI_SRC,
GEMMA4_FIXES_PACK, GEMMA4_GAUDI_FIXES_NO_SKIP)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODULES = "tests/unit/test_gaudi_fix_*.py"
# --noconftest: the fix tests need only their own helpers, not the engine fixtures (which import
# Docker's SDK, absent from a vLLM venv). -rfEs: every failure, error and skip reason is printed;
# vLLM's and torch's deprecation warnings are not the fixes' business.
FLAGS = ["--noconftest", "-p", "no:cacheprovider", "-q", "-rfEs", "-W", "ignore::DeprecationWarning"]


def modules(repo: Path = REPO) -> list[str]:
    """Every fix test module, relative to the repository (pytest runs from it)."""
    return sorted(str(p.relative_to(repo)) for p in repo.glob(MODULES))


def command(python: str, tests: list[str] | None = None, extra: list[str] = ()) -> list[str]:
    """python -m pytest with FLAGS, extra (e.g. -x, --junitxml), then tests (default: every module)."""
    return [python, "-m", "pytest", *FLAGS, *extra, *(tests or modules())]


def environment(src: str | None = None, pack: str | None = None, no_skip: bool = True) -> dict[str, str]:
    """What the fix tests read: the vllm-gaudi checkout, the pack (default: patches/ beside them) and
    whether a test that cannot run fails instead of skipping."""
    env = {"GEMMA4_GAUDI_FIXES_NO_SKIP": "1" if no_skip else "0"}
    if src:
        env["VLLM_GAUDI_SRC"] = str(src)
    if pack:
        env["GEMMA4_FIXES_PACK"] = str(pack)
    return env


if __name__ == "__main__":
    args = sys.argv[1:]
    tests = [a for a in args if not a.startswith("-") and "test_gaudi_fix_" in a]
    extra = [a for a in args if a not in tests]
    os.chdir(REPO)
    os.execv(sys.executable, command(sys.executable, tests or None, extra))
