"""CI runs the linux/arm64 and full-size tiers when their inputs changed since the committed record:
the record follows the inputs' contents, and a change to any of them makes it stale."""

import dataclasses
import shutil
import subprocess

import pytest

from tests import fullsize_tier, platform_tier


@pytest.mark.parametrize(
    "tier, changed",
    [(platform_tier.TIER, "requirements/arm64/cpu-base.lock"), (fullsize_tier.TIER, "testkit/e2b_shape/e2b.json")],
    ids=["arm64", "fullsize"],
)
def test_the_record_is_current_only_for_the_inputs_it_was_written_for(tmp_path, tier, changed):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    shutil.copy(tier.root / ".gitignore", tmp_path)
    for rel in tier.inputs:
        src, dst = tier.root / rel, tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    tier = dataclasses.replace(
        tier,
        root=tmp_path,
        record_path=tmp_path / "record.json",
        figures_path=tmp_path / "figures.json",
        after_record=lambda data: None,
    )
    assert not tier.current()  # no record yet
    tier.record()
    assert tier.current()
    # What a run leaves beside the inputs (CI's Python writes bytecode) is not an input.
    for rel in tier.inputs:
        folder = tmp_path / rel if (tmp_path / rel).is_dir() else (tmp_path / rel).parent
        (folder / "__pycache__").mkdir(exist_ok=True)
        (folder / "__pycache__" / "leftover.cpython-311.pyc").write_bytes(b"\xa7\r\r\n")
    assert tier.current(), "bytecode beside the inputs sent CI through the tier again"
    (tmp_path / changed).write_text((tmp_path / changed).read_text() + "\n")
    assert not tier.current(), f"a changed {changed} must send CI through the {tier.name} tier again"


def test_inputs_git_cannot_list_are_an_error_not_a_change(tmp_path, capsys):
    # CI runs the tier on exit 1 only; an unreadable tree must not pass for changed inputs.
    tier = dataclasses.replace(fullsize_tier.TIER, root=tmp_path, record_path=tmp_path / "record.json")
    tier.record_path.write_text('{"inputs": "0"}')
    assert tier.main(["--current"]) == 2
    assert capsys.readouterr().err.startswith("error: git cannot list testkit/e2b_shape in ")
