"""docs/architecture.md's tables name every module of each stage of gemma4_images/ and every
script in scripts/: a module or script added without a line there fails here."""

import re

import pytest

from gemma4_images.spec.matrix import ROOT

DOC = (ROOT / "docs" / "architecture.md").read_text()
PACKAGE = ROOT / "gemma4_images"


def row(first_cell: str) -> str:
    """The table row whose first cell is first_cell (in backticks)."""
    (found,) = [line for line in DOC.splitlines() if line.startswith(f"| `{first_cell}` |")]
    return found


def named(text: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", text))


@pytest.mark.parametrize("stage", sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()))
def test_every_module_of_a_stage_is_in_its_row(stage):
    modules = {p.stem for p in (PACKAGE / stage).glob("*.py") if p.stem != "__init__"}
    assert modules - named(row(f"{stage}/")) == set()


def test_every_script_is_in_the_scripts_row():
    scripts = {p.name for p in (ROOT / "scripts").iterdir() if p.is_file()}
    assert scripts - named(row("scripts/")) == set()
