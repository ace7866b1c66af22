"""vLLM releases side by side: a releases/vllm-V.yaml laid over targets.yaml, each target's own
release (targets.yaml `vllm`), and what the commands make of them. No engine, no network."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from gemma4_images.publish import reports
from gemma4_images.spec import matrix
from gemma4_images.spec.matrix import ROOT, MatrixError
from tests import release_files
from tests.cli import build_py

OWN = matrix.load().project.vllm_version


@pytest.fixture(scope="module")
def v032():
    return matrix.load(vllm="0.32.0")


def test_the_committed_0_32_0_release_builds_its_targets_with_their_own_facts(v032):
    assert sorted(v032.targets) == ["b200", "b300", "h100", "h200", "ironwood", "trillium", "xeon6"]
    assert not v032.first_release and v032.report_release == "0.32.0"
    assert v032.project.vllm_version == "0.32.0" and v032.project.transformers_version == "5.19.0"
    assert v032.tag("xeon6") == "gemma4-e2b:xeon6-v0.32.0"
    assert v032.tag("xeon6", "linux/arm64") == "gemma4-e2b:xeon6-v0.32.0-arm64"
    assert v032.base_on("xeon6").image == "vllm/vllm-openai-cpu:v0.32.0-x86_64"
    assert v032.base_on("xeon6", "linux/arm64").image == "vllm/vllm-openai-cpu:v0.32.0-arm64"
    assert v032.standin("xeon6").tag == "gemma4-e2b-base/vllm-cpu:v0.32.0-local"
    assert v032.standin("xeon6").lock == "requirements/v0.32.0/cpu-base.lock"
    assert v032.standin("xeon6").dockerfile == "bases/vllm-cpu-local/Dockerfile"  # targets.yaml's, kept
    # each stand-in's lock is the release's own
    assert set(v032.standins) == {"vllm-cpu", "vllm-cpu-arm64", "vllm-cuda13", "vllm-cuda13-arm64", "vllm-tpu"}
    assert v032.standin("b200").lock == "requirements/v0.32.0/cuda-base.lock"
    assert v032.standin("trillium").lock == "requirements/v0.32.0/tpu-base.lock"
    assert v032.targets["ironwood"].fixes.profile == "vllm-tpu-0.32.0"
    # a base's facts the release does not change are targets.yaml's (the overlay merges key by key)
    assert v032.base_on("h100").cuda == "12.9" and v032.base_on("h100").image == "vllm/vllm-openai:v0.32.0-cu129"
    assert v032.base_on("h100", "linux/arm64").no_standin == matrix.load().base_on("h100", "linux/arm64").no_standin
    assert v032.targets["xeon6"].fixes.profile == "vllm-0.32.0"
    assert v032.upstream_files["examples/tool_chat_template_gemma4.jinja"].sdist == "vllm-0.32.0.tar.gz"
    assert v032.recipe_file("xeon6") == "image/recipes/xeon6-v0.32.0.json"
    assert json.loads((ROOT / v032.recipe_file("xeon6")).read_text())["vllm_version"] == "0.32.0"
    # everything else is targets.yaml's: the launch, the smoke's settings, the run flags
    own = matrix.load()
    assert v032.recipe_launch("xeon6") == own.recipe_launch("xeon6")
    assert v032.targets["xeon6"].smoke == own.targets["xeon6"].smoke and own.first_release


def test_a_target_the_release_does_not_build_is_one_line(v032):
    for name in ("gaudi2", "mi300x"):
        with pytest.raises(MatrixError, match=f"{name} is not built on vLLM 0.32.0"):
            v032.resolve(name)
    assert v032.resolve("cpu") == "xeon6"  # aliases still resolve


def test_an_unknown_release_names_the_known_ones_and_bump():
    with pytest.raises(MatrixError) as e:
        matrix.load(vllm="0.31.0")
    assert str(e.value) == (
        f"no vLLM 0.31.0 release here (known: {', '.join(matrix.releases())}); "
        "add one with `python build.py bump FAMILY --vllm 0.31.0`"
    )


def test_releases_and_views_are_in_release_order():
    assert matrix.releases()[0] == OWN and "0.32.0" in matrix.releases()
    assert list(matrix.views()) == matrix.releases()
    assert matrix.releases_of("xeon6") == [OWN, "0.32.0"] and matrix.releases_of("gaudi2") == [OWN]
    assert matrix.releases_of("b300") == [OWN, "0.32.0", "0.34.0"]
    assert sorted(["0.10.0", "0.9.1", "0.30.0"], key=matrix.version_key) == ["0.9.1", "0.10.0", "0.30.0"]


# A release file's own base and fixes for xeon6, as `build.py bump` writes them.
ARM64_099 = {"linux/arm64": {"image": "vllm/vllm-openai-cpu:v0.99.0-arm64", "digest": None}}
XEON6_099 = {
    "xeon6": {
        "base": {"image": "vllm/vllm-openai-cpu:v0.99.0-x86_64", "digest": None, "platforms": ARM64_099},
        "fixes": {"profile": "vllm-0.32.0", "opt_in": []},
    }
}


def release_099(**given) -> dict:
    """A whole release file for vLLM 0.99.0 building xeon6 (0.32.0's other facts), with given's keys
    in place of its own (None: the key left out)."""
    v032 = yaml.safe_load(matrix.release_file("0.32.0").read_text())
    whole = {
        "project": {"vllm_version": "0.99.0", "transformers_version": "5.19.0"},
        "audio_extras": v032["audio_extras"],
        "upstream_files": v032["upstream_files"],
        "standins": {k: v032["standins"][k] for k in ("vllm-cpu", "vllm-cpu-arm64")},
        "targets": XEON6_099,
    }
    return {k: v for k, v in {**whole, **given}.items() if v is not None}


def with_releases(tmp_path, release: dict):
    """The committed releases/ and release as vllm-0.99.0.yaml, in tmp_path; returns its path."""
    release_files.copied(tmp_path)
    path = tmp_path / "vllm-0.99.0.yaml"
    path.write_text(yaml.safe_dump(release))
    return path


@pytest.mark.parametrize(
    "release, says",
    [
        ({"targets": {"nosuch": {}}}, "targets.nosuch is not a target of targets.yaml"),
        ({"standins": {"nosuch": {}}}, "standins.nosuch is not a stand-in of targets.yaml"),
        ({"vllm_version": "0.99.0"}, "unknown key(s) vllm_version; a release file has"),
        (
            {"targets": {"xeon6": {**XEON6_099["xeon6"], "fixes": {"profile": "vllm-0.99.0"}}}},
            "no profile 'vllm-0.99.0'",
        ),
        # every fact bound to the release is the file's own: targets.yaml holds none to fall back on
        ({"audio_extras": None}, "audio_extras missing: a release file holds every fact bound to its release"),
        ({"standins": {"vllm-cpu": {}}}, "standins.vllm-cpu.tag: Field required"),
    ],
)
def test_a_malformed_release_file_is_named(tmp_path, release, says):
    with_releases(tmp_path, release_099(**release))
    with pytest.raises(MatrixError, match="vllm-0.99.0.yaml") as e:
        matrix.load(vllm="0.99.0", releases_dir=tmp_path)
    assert says in str(e.value)


@pytest.mark.parametrize(
    "release, says",
    [
        # A target is built on the release's own base with the release's own fixes, or not at all.
        (
            {"targets": {"xeon6": {"fixes": {"profile": "vllm-0.32.0"}}}},
            "targets.xeon6.base is missing: a target this release builds needs its base at vLLM 0.99.0",
        ),
        (
            {"targets": {"xeon6": {"base": XEON6_099["xeon6"]["base"]}}},
            "targets.xeon6.fixes is missing: a target this release builds needs its fixes at vLLM 0.99.0",
        ),
        (
            {"targets": {"xeon6": {"base": {"image": "x:0.99.0", "digest": None}, "fixes": None}}},
            "targets.xeon6.base.platforms.linux/arm64.image is missing: a target this release builds needs its base",
        ),
        # The version names the tag: one that contradicts the file name would tag another release's images.
        (
            {"project": {"vllm_version": "0.98.0"}},
            "project.vllm_version is '0.98.0', not 0.99.0 (the release its file name says)",
        ),
        ({"project": {}}, "project.vllm_version is missing, not 0.99.0 (the release its file name says)"),
    ],
)
def test_a_release_file_carries_its_own_version_and_each_targets_base(tmp_path, release, says):
    path = with_releases(tmp_path, release_099(**release))
    with pytest.raises(MatrixError) as e:
        matrix.load(vllm="0.99.0", releases_dir=tmp_path)
    assert str(e.value).startswith(f"{path}: {says}") and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "edit, says",
    [
        # list, aliases and each target's default are read at the first release
        (lambda r: r["targets"].pop("h100"), "the first release builds every target; h100 missing"),
        # a Gaudi target is built from its stage 1: without one there would be nothing to build
        (lambda r: r["targets"]["gaudi2"].pop("stage1"), "targets.gaudi2.stage1 is missing"),
    ],
)
def test_the_first_release_builds_every_target_and_gaudi_its_stage_1(tmp_path, edit, says):
    data = release_files.first_release_data()
    edit(data)
    release_files.copied(tmp_path, data)
    first = matrix.release_file(matrix.releases()[0], tmp_path)
    with pytest.raises(MatrixError) as e:
        matrix.load(releases_dir=tmp_path)
    assert str(e.value).startswith(f"{first}: {says}") and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda d: d["cpu"].update(vllm="0.31.0"), r"defaults.cpu.vllm: no vLLM 0.31.0 release here .*bump cpu"),
        (lambda d: d.pop("rocm"), r"defaults.rocm is missing: say which vLLM release"),
        (lambda d: d.update(fpga={"vllm": OWN, "source": "x"}), r"defaults.fpga: not a family of targets.yaml"),
        # the default release must build every target of the family
        (
            lambda d: d["rocm"].update(vllm="0.32.0"),
            r"defaults.rocm.vllm: vLLM 0.32.0 does not build mi300x, mi325x, mi350x, mi355x; add them with "
            r"`python build.py bump mi300x mi325x mi350x mi355x --vllm 0.32.0`",
        ),
    ],
)
def test_each_familys_default_release_must_exist_and_build_it(tmp_path, change, says):
    raw = yaml.safe_load(matrix.TARGETS_FILE.read_text())
    change(raw["defaults"])
    path = tmp_path / "targets.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(MatrixError, match=says) as e:
        matrix.load(path)
    assert "\n" not in str(e.value)


def test_reports_of_another_release_are_filed_apart():
    assert reports.key("xeon6") == "xeon6" and reports.key("xeon6", "linux/arm64") == "xeon6-arm64"
    assert reports.key("xeon6", None, "0.32.0") == "xeon6-v0.32.0"
    assert reports.key("xeon6", "linux/arm64", "0.32.0") == "xeon6-v0.32.0-arm64"


@pytest.fixture
def tree(tmp_path):
    """A copy of what build.py reads, to change targets.yaml in."""
    for item in ("build.py", "gemma4_images", "templates", "image", "patches", "targets.yaml", "releases", "testkit"):
        src = ROOT / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / item)
    return tmp_path


def test_a_familys_default_release_is_what_commands_use_without_vllm(tree):
    text = (tree / "targets.yaml").read_text()
    cpu = f"  cpu:\n    vllm: {OWN}\n"
    assert cpu in text
    assert build_py("tag", "cpu", cwd=tree).stdout.strip() == f"gemma4-e2b:xeon6-v{OWN}"
    (tree / "targets.yaml").write_text(text.replace(cpu, "  cpu:\n    vllm: 0.32.0\n", 1))
    assert build_py("tag", "cpu", cwd=tree).stdout.strip() == "gemma4-e2b:xeon6-v0.32.0"
    assert build_py("tag", "cpu", "--vllm", OWN, cwd=tree).stdout.strip() == f"gemma4-e2b:xeon6-v{OWN}"
    assert build_py("tag", "mi355x", cwd=tree).stdout.strip() == f"gemma4-e2b:mi355x-v{OWN}"
    rows = json.loads(build_py("list", "--json", cwd=tree).stdout)
    xeon6 = {r["vllm"]: r["default"] for r in rows if r["target"] == "xeon6"}
    assert xeon6 == {OWN: False, "0.32.0": True}
    dry = build_py("build", "cpu", "--dry-run", cwd=tree).stdout
    assert "BASE_IMAGE=vllm/vllm-openai-cpu:v0.32.0-x86_64" in dry and "GEMMA4_FIXES_PROFILE=vllm-0.32.0" in dry


def test_vllm_naming_a_release_the_target_lacks_is_one_line_and_exit_2():
    r = build_py("build", "gaudi2", "--vllm", "0.32.0", "--dry-run")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == (
        "error: gaudi2 is not built on vLLM 0.32.0 (releases/ has no gaudi2 entry for it); drop --vllm for its own"
    )
    r = build_py("tag", "cpu", "--vllm", "0.31.0")
    assert r.returncode == 2 and "no vLLM 0.31.0 release here" in r.stderr


def test_list_shows_each_release_and_marks_the_default():
    out = build_py("list").stdout
    assert "gemma4-e2b:xeon6-v0.32.0" in out and f"gemma4-e2b:xeon6-v{OWN}" in out
    assert f"{OWN}*" in out and "* the release `build.py` uses for the target without --vllm" in out


def test_staging_follows_the_release_being_built(tmp_path):
    # .build/upstream/ is one folder for every release; a file staged for another release (or
    # changed by hand) is fetched again from this release's sdist, not COPYed as it is.
    from gemma4_images.build import pypi

    rel = "examples/tool_chat_template_gemma4.jinja"
    (staged,) = pypi.stage(matrix.load(), tmp_path)
    staged.write_text("{# not vLLM's #}")
    (staged,) = pypi.stage(matrix.load(vllm="0.32.0"), tmp_path)
    assert staged.read_text() != "{# not vLLM's #}" and "tool_call" in staged.read_text()
    assert json.loads((tmp_path / "sources.json").read_text())[rel].startswith("vllm-0.32.0.tar.gz sha256:")
    assert not (tmp_path / "examples" / "sources.json").exists()  # outside what the Dockerfiles COPY


@pytest.mark.parametrize(
    "edit, path",
    [
        (lambda t: t.update(audio_extras=["av==1.0"]), "audio_extras"),
        (lambda t: t["project"].update(vllm_version="0.30.0"), "project.vllm_version"),
        (lambda t: t["standins"]["vllm-cpu"].update(lock="requirements/cpu-base.lock"), "standins.vllm-cpu.lock"),
        (lambda t: t["targets"]["xeon6"].update(fixes={"profile": "vllm-0.30.0"}), "targets.xeon6.fixes"),
        (lambda t: t["targets"]["b300"]["base"].update(image="vllm/vllm-openai:v0"), "targets.b300.base.image"),
        (
            lambda t: t["targets"]["b300"]["base"]["platforms"]["linux/arm64"].update(digest="sha256:0"),
            "targets.b300.base.platforms.linux/arm64.digest",
        ),
    ],
)
def test_targets_yaml_holds_no_fact_bound_to_a_release(tmp_path, edit, path):
    """A release-bound key in targets.yaml would be shadowed by every release file's: refused, naming it.
    The committed targets.yaml loads, so it holds none (matrix.RELEASE_BOUND says which keys)."""
    raw = json.loads(json.dumps(yaml.safe_load(matrix.TARGETS_FILE.read_text())))  # YAML anchors unshared
    edit(raw)
    (tmp_path / "targets.yaml").write_text(yaml.safe_dump(raw))
    release_files.copied(tmp_path / "releases")
    with pytest.raises(MatrixError) as refused:
        matrix.load(tmp_path / "targets.yaml", releases_dir=tmp_path / "releases")
    assert str(refused.value) == (
        f"{tmp_path / 'targets.yaml'}: {path} is bound to a vLLM release: it belongs in each "
        "releases/vllm-<V>.yaml (as `build.py bump` writes it), not in targets.yaml"
    )
    assert matrix.release_bound_in(yaml.safe_load(matrix.TARGETS_FILE.read_text())) == []
