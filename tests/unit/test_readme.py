"""README.md's targets table and release list are rendered from the matrix at every release: a target
moved to another default release, or a hand edit inside the block, shows up as drift."""

import pytest

from gemma4_images.generate import readme, render
from gemma4_images.spec import matrix


@pytest.fixture(scope="module")
def views():
    own = matrix.load()
    return own, render.other_releases(own)


def row(text: str, target: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {target} "))


def test_each_target_shows_its_default_release_and_every_release_it_is_built_on(views):
    own, others = views
    text = readme.block(own, others)
    for name in own.targets:
        releases = [v.project.vllm_version for v in [own, *others] if name in v.targets]
        default = matrix.default_release(own, name)
        cell = row(text, name).split(" | ")[5]  # the vLLM column
        assert cell == ", ".join(f"**{v}**" if v == default else v for v in releases), cell
    for view in [own, *others]:
        assert f"- vLLM **{view.project.vllm_version}** (" in text
        assert ", ".join(view.targets) in text


def test_a_family_moved_to_another_default_release_changes_its_rows(views):
    own, others = views
    moved = own.model_copy(deep=True)
    moved.defaults["cpu"] = moved.defaults["cpu"].model_copy(update={"vllm": "0.32.0"})
    shown = row(readme.block(moved, others), "xeon6")
    assert "0.30.0, **0.32.0**" in shown
    assert "`vllm/vllm-openai-cpu:v0.32.0-x86_64`" in shown and "`gemma4-e2b:xeon6-v0.32.0`" in shown
    assert row(readme.block(own, others), "xeon6") != shown


def test_a_hand_edit_inside_the_block_is_drift(tmp_path, views):
    own, others = views
    rendered = render.render_all(own, others)
    for rel, content in rendered.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(content)
    assert render.drift(own, others, root=tmp_path) == []
    page = tmp_path / readme.README
    page.write_text(page.read_text().replace("| h100 | cuda |", "| h100 | rocm |"))
    assert render.drift(own, others, root=tmp_path) == [readme.README]


def test_missing_markers_are_one_line_naming_them(views):
    with pytest.raises(readme.ReadmeError, match="must hold the line .* once, then .* once: put them back"):
        readme.spliced("# A README without its markers\n", *views)
