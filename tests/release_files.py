"""A copy of releases/ to edit in a test: the first release's file replaced by data when given."""

import shutil
from pathlib import Path

import yaml

from gemma4_images.spec import matrix


def first_release_data() -> dict:
    """The first release's file as data: where the facts bound to vLLM 0.30.0 are."""
    return yaml.safe_load(matrix.release_file(matrix.releases()[0]).read_text())


def copied(dest: Path, first: dict | None = None) -> Path:
    """releases/ copied into dest (made if missing), with first written as the first release's
    file when given; returns dest."""
    shutil.copytree(matrix.RELEASES, dest, dirs_exist_ok=True)
    if first is not None:
        matrix.release_file(matrix.releases()[0], dest).write_text(yaml.safe_dump(first))
    return dest
