"""targets.yaml: the real file loads, and every kind of mistake is named precisely."""

import shlex
import shutil

import pytest
import yaml

from gemma4_images.spec import matrix
from gemma4_images.spec.matrix import MatrixError
from tests import release_files

ALL_TARGETS = {
    "gaudi2",
    "h100",
    "h200",
    "b200",
    "b300",
    "mi300x",
    "mi325x",
    "mi350x",
    "mi355x",
    "xeon6",
    "trillium",
    "ironwood",
}


@pytest.fixture(scope="module")
def real():
    return matrix.load()


@pytest.fixture
def raw():
    return yaml.safe_load(matrix.TARGETS_FILE.read_text())


@pytest.fixture
def first():
    return release_files.first_release_data()


def load_raw(tmp_path, data, release: dict | None = None):
    """targets.yaml as data, at the first release (release: that release's file as data instead)."""
    path = tmp_path / "targets.yaml"
    path.write_text(yaml.safe_dump(data))
    if release is None:
        return matrix.load(path)
    return matrix.load(path, releases_dir=release_files.copied(tmp_path / "releases", release))


def test_every_recipe_target_is_present(real):
    assert set(real.targets) == ALL_TARGETS
    assert real.resolve("cpu") == "xeon6"
    assert {t.family for t in real.targets.values()} == {"gaudi", "cuda", "rocm", "cpu", "tpu"}


def test_vllm_pinned_everywhere_with_release_tag_bases(real):
    assert real.project.vllm_version == "0.30.0"
    bases = {n: t.base.image for n, t in real.targets.items()}
    # Since vLLM v0.20.0 the plain tag is the CUDA 13.0 build and -cu129 the CUDA 12.9 one.
    assert bases["h100"] == bases["h200"] == "vllm/vllm-openai:v0.30.0-cu129"
    assert bases["b200"] == bases["b300"] == "vllm/vllm-openai:v0.30.0"
    assert {n: t.base.cuda for n, t in real.targets.items() if t.base.cuda} == {
        "h100": "12.9",
        "h200": "12.9",
        "b200": "13.0",
        "b300": "13.0",
    }
    assert bases["mi355x"] == "vllm/vllm-openai-rocm:v0.30.0"
    assert bases["xeon6"] == "vllm/vllm-openai-cpu:v0.30.0-x86_64"
    assert real.targets["gaudi2"].stage1.vllm_gaudi_commit == "058f107"
    assert real.targets["gaudi2"].stage1.vllm_commit.startswith("ced6857a")


def test_tags(real):
    assert real.tag("h100") == "gemma4-e2b:h100-v0.30.0"
    assert real.tag(real.resolve("cpu")) == "gemma4-e2b:xeon6-v0.30.0"
    assert real.tiny_tag("xeon6") == "gemma4-e2b:xeon6-v0.30.0-tiny"


def test_unknown_target_lists_valid_ones(real):
    with pytest.raises(MatrixError) as e:
        real.resolve("h800")
    assert "unknown target 'h800'" in str(e.value)
    for name in ("gaudi2", "h100", "cpu", "ironwood"):
        assert name in str(e.value)


def test_recipe_launch_is_the_seed_text(real):
    # Spot-check against the seeds' literal launches (000 Launch, 002 Serve).
    gaudi = real.recipe_launch("gaudi2")
    assert gaudi[:3] == ["vllm", "serve", "google/gemma-4-E2B-it"]
    assert "--kv-sharing-fast-prefill" in gaudi and "--no-enable-prefix-caching" in gaudi
    assert gaudi[gaudi.index("--limit-mm-per-prompt") + 1] == '{"image":0,"audio":0,"video":0}'
    assert real.recipe_launch("h100") == shlex.split(
        "vllm serve google/gemma-4-E2B-it --tensor-parallel-size 1 --enable-auto-tool-choice "
        "--tool-call-parser gemma4 --chat-template examples/tool_chat_template_gemma4.jinja "
        "--reasoning-parser gemma4"
    )


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d, r: d["targets"]["h100"].update(bogus=1), "targets.h100.bogus: unknown key"),
        (lambda d, r: r["targets"]["h100"]["base"].update(digest="sha256:xyz"), "targets.h100.base.digest"),
        (lambda d, r: d["targets"]["h100"].update(family="quantum"), "targets.h100.family: unknown family 'quantum'"),
        (
            lambda d, r: d["targets"]["h100"]["serve"].update(default_features=["telepathy"]),
            "targets.h100.serve.default_features",
        ),
        (lambda d, r: d["targets"]["h100"].update(startup_budget_s="soon"), "targets.h100.startup_budget_s"),
        (lambda d, r: d["targets"]["h100"].pop("run"), "targets.h100.run: Field required"),
        (lambda d, r: d["targets"]["h100"]["run"].update(gpu="all"), "targets.h100.run.gpu: unknown key"),
        (lambda d, r: d["targets"]["mi300x"].update(aliases=["h100"]), "'h100' is already a target name"),
        (
            lambda d, r: r["targets"]["h100"]["fixes"].update(profile="vllm-gaudi-0.30.0"),
            "fixes.profile: 'vllm-gaudi-0.30.0' is for vllm-gaudi images, h100 is not a Gaudi target; "
            "use vllm-0.30.0 or vllm-0.32.0 or ",  # then every other plain-vLLM profile of patches/profiles/
        ),
        (
            lambda d, r: r["targets"]["gaudi2"]["fixes"].update(profile="vllm-0.30.0"),
            "'vllm-0.30.0' is for plain vLLM images, gaudi2 is a Gaudi target; use vllm-gaudi-0.30.0",
        ),
        (lambda d, r: d["targets"]["mi300x"].update(aliases=["all"]), "'all' is reserved (`build.py build all`"),
        (lambda d, r: d["features"].pop("reasoning"), "features"),
        (lambda d, r: r["project"].update(vllm_verison="0.30.0"), "project.vllm_verison: unknown key"),
        # env is the family's (rendered into its Dockerfile): a target cannot set its own.
        (lambda d, r: d["targets"]["h200"].update(env={"X": "1"}), "targets.h200.env: unknown key"),
    ],
)
def test_schema_errors_name_the_field(tmp_path, raw, first, mutate, expected):
    mutate(raw, first)
    with pytest.raises(MatrixError) as e:
        load_raw(tmp_path, raw, first)
    assert expected in str(e.value)


@pytest.mark.parametrize(
    "edit, key",
    [
        # a second target block under targets:
        (lambda text: text + "\n  xeon6:\n    family: cpu\n", "xeon6"),
        # a field given twice in one target
        (
            lambda text: text.replace(
                "    startup_budget_s: 600\n", "    startup_budget_s: 600\n    startup_budget_s: 5\n"
            ),
            "startup_budget_s",
        ),
    ],
)
def test_a_key_given_twice_is_refused_with_both_lines(tmp_path, edit, key):
    path = tmp_path / "targets.yaml"
    path.write_text(edit(matrix.TARGETS_FILE.read_text()))
    with pytest.raises(MatrixError) as e:
        matrix.load(path)
    message = str(e.value)
    assert f"key {key!r} is given twice in one mapping (lines " in message and "\n" not in message
    first, second = (int(n) for n in message.split("(lines ")[1].split(")")[0].split(" and "))
    text = path.read_text().splitlines()
    assert text[first - 1].strip().startswith(f"{key}:") and text[second - 1].strip().startswith(f"{key}:")


@pytest.mark.parametrize(
    "file, old, new, key, name",
    [
        (
            "releases/vllm-0.30.0.yaml",
            "      - gemma4-fast-prefill\n",
            "      - gemma4-fast-prefill\n      - gemma4-buffered-tool-args\n",
            "opt_in",
            "gemma4-buffered-tool-args",
        ),
        ("targets.yaml", "aliases: [cpu]", "aliases:\n      - cpu\n      - cpu", "aliases", "cpu"),
    ],
    ids=["opt_in-block", "aliases-block"],
)
def test_a_name_listed_twice_is_refused_with_both_positions(tmp_path, file, old, new, key, name):
    shutil.copy(matrix.TARGETS_FILE, tmp_path / "targets.yaml")
    shutil.copytree(matrix.RELEASES, tmp_path / "releases")
    path = tmp_path / file
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))
    with pytest.raises(MatrixError) as e:
        matrix.load(tmp_path / "targets.yaml", releases_dir=tmp_path / "releases")
    message = str(e.value)
    assert f"{key} names {name!r} twice (line " in message and "\n" not in message, message
    lines = path.read_text().splitlines()
    for position in message.split("twice (")[1].split(")")[0].split(" and "):
        line, column = (int(n) for n in position.removeprefix("line ").split(" column "))
        assert lines[line - 1][column - 1 :].startswith(name), position


def test_merge_keys_still_override_what_they_bring(real):
    # h200 is `<<: *hopper` plus its own hardware; b200 replaces the merged base.
    assert real.targets["h200"].hardware == "NVIDIA H200" and real.targets["h200"].family == "cuda"
    assert real.targets["b200"].base.image != real.targets["h100"].base.image


def test_an_empty_file_is_called_empty(tmp_path):
    path = tmp_path / "targets.yaml"
    path.write_text("# nothing here\n")
    with pytest.raises(MatrixError, match="targets.yaml is empty: it must define project"):
        matrix.load(path)


def test_malformed_yaml(tmp_path):
    path = tmp_path / "targets.yaml"
    path.write_text("targets: [unclosed\n")
    with pytest.raises(MatrixError, match="not valid YAML"):
        matrix.load(path)


def test_recipe_drops_unsupported_features_and_variants(real):
    gaudi = real.recipe("gaudi2")
    assert "spec_decoding" not in gaudi["features"]
    assert "fp8" not in gaudi["variants"]  # fp8 runs on Hopper and Blackwell only
    assert "fp8" in real.recipe("h100")["variants"]


def test_a_key_that_is_not_a_name_is_still_a_matrix_error(tmp_path):
    # `? [a]` is a sequence as a key: the list check must not meet it as a name (a TypeError).
    path = tmp_path / "targets.yaml"
    path.write_text("project: {}\n? [a]\n: 1\n")
    with pytest.raises(MatrixError, match="is not valid YAML"):
        matrix.load(path)
