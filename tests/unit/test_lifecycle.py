"""`build.py promote` and `build.py retire` on a committed copy of the tree: a release leaves with
its own files only, a default moves by one edit, and bad input changes nothing."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from gemma4_images.spec import matrix
from tests.cli import ROOT, build_py

RETIRED = "0.34.0"  # a release no other release shares a profile with
CPU_DEFAULT = matrix.load().defaults["cpu"]
CPU_OTHER = next(v for v in matrix.releases_of("xeon6") if v != CPU_DEFAULT.vllm)  # one promote can move to


def git(tree, *args) -> str:
    return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def tree(tmp_path):
    """Every tracked file as it is in the work tree, committed in a repository of its own."""
    for rel in git(ROOT, "ls-files", "-z").split("\0"):
        if rel and (ROOT / rel).is_file():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, tmp_path / rel)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tree")
    return tmp_path


def changes(tree) -> dict[str, str]:
    return {line[3:]: line[:2].strip() for line in git(tree, "status", "--porcelain", "-uall").splitlines()}


def test_retiring_a_release_removes_its_files_and_nothing_else(tree):
    view = matrix.load(vllm=RETIRED)
    family = view.targets[next(iter(view.targets))].family
    fallback = [
        v for v in matrix.releases() if v != RETIRED and v in matrix.releases_of(view.family_targets(family)[0])
    ]
    r = build_py("promote", family, "--vllm", fallback[-1], "--source", "a test", cwd=tree)
    assert r.returncode == 0, r.stderr
    git(tree, "commit", "-qam", "promoted")
    r = build_py("retire", "--vllm", RETIRED, cwd=tree)
    assert r.returncode == 0, r.stderr
    profiles = {t.fixes.profile for t in view.targets.values()}
    ported = {
        p.parent.name
        for p in (ROOT / "patches").glob("*/fix.json")
        if profiles & set(json.loads(p.read_text()).get("ports", {}))
    }
    gone = {
        f"releases/vllm-{RETIRED}.yaml",
        *(s.lock for s in view.standins.values()),
        *(f"patches/profiles/{p}.json" for p in profiles),
        *(f"patches/{fix}/ports/{p}.diff" for fix in ported for p in profiles),
        *(view.recipe_file(n) for n in view.targets),
    }
    rendered = {"FIXES.md", "README.md", "docker-bake.hcl"}
    assert changes(tree) == {
        **{p: "D" for p in gone},
        **{p: "M" for p in rendered | {f"patches/{f}/fix.json" for f in ported}},
    }
    for fix in ported:  # each manifest loses its ports for the release's profiles, nothing else
        before = json.loads((ROOT / "patches" / fix / "fix.json").read_text())
        before["ports"] = {p: v for p, v in before["ports"].items() if p not in profiles}
        after = json.loads((tree / "patches" / fix / "fix.json").read_text())
        assert after == {k: v for k, v in before.items() if k != "ports" or v}
    assert not (tree / "requirements" / f"v{RETIRED}").exists()
    assert build_py("render", "--check", cwd=tree).returncode == 0
    listed = json.loads(build_py("list", "--json", cwd=tree).stdout)
    assert listed and RETIRED not in {row["vllm"] for row in listed}


@pytest.mark.parametrize(
    "version, says",
    [
        (RETIRED, f"error: vLLM {RETIRED} is the default of "),  # the CUDA family's
        (matrix.releases()[0], "is the first release: bump starts from it"),
        ("0.31.0", "no vLLM 0.31.0 release here"),
    ],
)
def test_retire_refuses_in_one_line_and_changes_nothing(tree, version, says):
    r = build_py("retire", "--vllm", version, cwd=tree)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert changes(tree) == {}


def test_promote_moves_the_default_by_one_edit_and_the_tag_follows(tree):
    r = build_py("promote", "cpu", "--vllm", CPU_OTHER, "--source", "back to: a test", cwd=tree)
    assert r.returncode == 0, r.stderr
    diff = [line for line in git(tree, "diff", "-U0", "targets.yaml").splitlines() if line[:1] in "+-"]
    assert diff[2:] == [
        f"-    vllm: {CPU_DEFAULT.vllm}",
        f"-    source: {CPU_DEFAULT.source}",
        f"+    vllm: {CPU_OTHER}",
        "+    source: 'back to: a test'",
    ], diff
    assert build_py("tag", "cpu", cwd=tree).stdout.strip() == f"gemma4-e2b:xeon6-v{CPU_OTHER}"
    assert set(changes(tree)) == {"targets.yaml", "README.md", "docker-bake.hcl"}
    assert build_py("render", "--check", cwd=tree).returncode == 0


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ["tensor", "--vllm", "0.32.0", "--source", "x"],
            "error: tensor is not a family (gaudi, cuda, rocm, cpu, tpu)",
        ),
        (["gaudi", "--vllm", "0.32.0", "--source", "x"], "vLLM 0.32.0 does not build gaudi2"),
        (["cpu", "--vllm", CPU_DEFAULT.vllm, "--source", "x"], f"vLLM {CPU_DEFAULT.vllm} is already the cpu family's"),
        (["cpu", "--vllm", CPU_OTHER, "--source", " "], f"say why vLLM {CPU_OTHER} is the cpu family's default"),
        (["cpu", "--vllm", "0.29.0", "--source", "x"], "no vLLM 0.29.0 release here"),
    ],
)
def test_promote_refuses_in_one_line_and_changes_nothing(tree, args, says):
    r = build_py("promote", *args, cwd=tree)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert changes(tree) == {}


def test_uncommitted_changes_are_refused_before_anything_is_written(tree):
    (tree / "patches" / "profiles" / "scratch.json").write_text("{}\n")
    for args in (["retire", "--vllm", "0.32.0"], ["promote", "cpu", "--vllm", CPU_OTHER, "--source", "x"]):
        r = build_py(*args, cwd=tree)
        assert r.returncode == 2 and "uncommitted changes" in r.stderr, r.stderr
    assert changes(tree) == {"patches/profiles/scratch.json": "??"}


def test_a_retire_that_fails_midway_puts_every_file_back(tree, monkeypatch):
    from gemma4_images.build import lifecycle
    from gemma4_images.generate import render

    family = matrix.load(vllm=RETIRED).targets[next(iter(matrix.load(vllm=RETIRED).targets))].family
    assert build_py("promote", family, "--vllm", "0.32.0", "--source", "a test", cwd=tree).returncode == 0
    git(tree, "commit", "-qam", "promoted")

    def broken(*args, **kwargs):
        raise RuntimeError("the render broke")

    monkeypatch.setattr(render, "render_all", broken)  # after every removal: the folders they emptied are gone
    with pytest.raises(RuntimeError, match="the render broke"):
        lifecycle.retire(RETIRED, root=tree)
    assert changes(tree) == {}
