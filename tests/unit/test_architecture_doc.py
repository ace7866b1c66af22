"""docs/architecture.md's stage table names every module of its stage, so a new module cannot go
undocumented (issue 43: the table had fallen behind the package)."""

import re

from gemma4_images.spec.matrix import ROOT

PACKAGE = ROOT / "gemma4_images"
DOC = ROOT / "docs" / "architecture.md"


def rows() -> dict[str, str]:
    """{stage folder: its modules cell} from the table's rows (| `stage/` | what | modules |)."""
    found = re.findall(r"^\| `([a-z_]+)/` \| [^|]* \| (.*) \|$", DOC.read_text(), re.MULTILINE)
    return dict(found)


def missing(table: dict[str, str]) -> list[str]:
    out = []
    for stage in sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()):
        named = set(re.findall(r"`([a-z0-9_]+)`", table.get(stage.name, "")))
        out += [
            f"{stage.name}/{m.stem}" for m in sorted(stage.glob("*.py")) if m.stem != "__init__" and m.stem not in named
        ]
    return out


def test_every_module_is_named_in_its_stages_row():
    assert missing(rows()) == [], "add them to docs/architecture.md's table"


def test_a_module_left_out_of_the_table_is_found():
    table = rows()
    table["generate"] = table["generate"].replace("`readme`", "")
    assert missing(table) == ["generate/readme"]
