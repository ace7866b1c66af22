"""CI runs the linux/arm64 tier when its inputs changed since the committed record: the record
follows the inputs' contents, and a change to any of them makes it stale."""

import shutil

from tests import platform_tier


def test_the_record_is_current_only_for_the_inputs_it_was_written_for(monkeypatch, tmp_path):
    for rel in platform_tier.INPUTS:
        src, dst = platform_tier.ROOT / rel, tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    monkeypatch.setattr(platform_tier, "ROOT", tmp_path)
    monkeypatch.setattr(platform_tier, "RECORD", tmp_path / "record.json")
    monkeypatch.setattr(platform_tier, "FIGURES", tmp_path / "figures.json")
    assert not platform_tier.current()  # no record yet
    platform_tier.record()
    assert platform_tier.current()
    lock = tmp_path / "requirements" / "arm64" / "cpu-base.lock"
    lock.write_text(lock.read_text() + "\n")
    assert not platform_tier.current(), "a changed arm64 lock must send CI through the tier again"
