"""docker-bake.hcl: it parses as HCL, has one target per row of targets.yaml, and passes exactly the
build args build.py passes. `docker buildx bake` itself is not installable here (no Debian bookworm
package, nothing on PyPI), so its own reading of the file runs only where buildx exists."""

import json
import shutil
import subprocess

import hcl2
import pytest

from gemma4_images.build import images, wheels
from gemma4_images.generate import bake, render
from gemma4_images.spec import facts, matrix
from gemma4_images.spec.facts import BUILD_FACTS

ROOT = matrix.ROOT


@pytest.fixture(scope="module")
def m():
    return matrix.load()


def parse(text: str) -> dict:
    options = hcl2.SerializationOptions(strip_string_quotes=True, with_comments=False, explicit_blocks=False)
    return hcl2.loads(text, serialization_options=options)


def blocks(parsed: dict, kind: str) -> dict:
    return {name: body for block in parsed.get(kind, []) for name, body in block.items()}


def hcl_value(value: str, variables: dict[str, str]) -> str:
    """A parsed HCL string as bake would use it: variables substituted, $${ and %%{ unescaped."""
    for name, replacement in variables.items():
        value = value.replace("${" + name + "}", replacement)
    return value.replace("$${", "${").replace("%%{", "%{")


@pytest.fixture(scope="module")
def parsed(m):
    return parse(bake.render_bake(m, render.other_releases(m)))


def test_one_target_per_row_with_its_dockerfile_and_tag(m, parsed):
    targets = blocks(parsed, "target")
    rows = {f"gemma4-e2b-{name}": name for name in m.targets}
    stage1 = {f"gemma4-e2b-{n}-base" for n, t in m.targets.items() if t.stage1}
    releases = {bake.release_target_name(v, n) for v in render.other_releases(m) for n in v.targets}
    assert set(targets) == set(rows) | stage1 | releases | {"_common"}
    for bake_name, name in rows.items():
        t = targets[bake_name]
        assert t["inherits"] == ["_common"]
        assert t["dockerfile"] == render.dockerfile_name(m.targets[name].family)
        assert t["tags"] == [m.tag(name)]
    # the default group: each target at its family's default release (targets.yaml defaults)
    at_default = [
        f"gemma4-e2b-{n}"
        + ("" if (v := matrix.default_release(m, n)) == m.project.vllm_version else f"-v{v.replace('.', '_')}")
        for n in m.targets
    ]
    assert blocks(parsed, "group")["default"]["targets"] == at_default
    assert "gemma4-e2b-b300-v0_34_0" in at_default and "gemma4-e2b-xeon6" in at_default
    assert blocks(parsed, "group")["gemma4-e2b-cpu"]["targets"] == [at_default[list(m.targets).index("xeon6")]]


def test_shared_settings_live_in_the_abstract_target(parsed):
    assert blocks(parsed, "target")["_common"] == {"context": ".", "network": "host"}


def test_per_commit_facts_are_variables_with_defaults(m, parsed):
    variables = blocks(parsed, "variable")
    assert variables == {
        "REVISION": {"default": "unknown"},
        "CREATED": {"default": "1970-01-01T00:00:00Z"},
        # where build.py serves the audio extras' wheelhouse
        "WHEELS_URL": {"default": f"http://127.0.0.1:{wheels.WHEELHOUSE_PORT}/"},
    }
    for name in m.targets:
        args = blocks(parsed, "target")[f"gemma4-e2b-{name}"]["args"]
        assert args["GEMMA4_REVISION"] == "${REVISION}" and args["GEMMA4_CREATED"] == "${CREATED}"


def test_the_file_does_not_change_with_the_checkout(m, monkeypatch):
    first = bake.render_bake(m, render.other_releases(m))
    monkeypatch.setattr(facts, "revision", lambda: "f" * 40 + "-dirty")
    monkeypatch.setattr(facts, "created", lambda: "2031-01-01T00:00:00Z")
    assert bake.render_bake(m, render.other_releases(m)) == first


def build_target_args(m, name, monkeypatch, tmp_path) -> dict[str, str]:
    """The build args images.build_target passes for name on the target's own base, engine stubbed."""
    seen = {}
    t = m.targets[name]

    class Base:
        id = "sha256:" + "0" * 64
        attrs = {"RepoDigests": []}

    monkeypatch.setattr(images.pypi, "stage", lambda *a, **k: [])
    monkeypatch.setattr(
        images.tokenizer_copy,
        "stage",
        lambda matrix_, n, source, out: (tmp_path, m.project.model if t.bos_tokenizer else ""),
    )
    monkeypatch.setattr(images, "resolve_base", lambda client, matrix_, n, override, log, platform=None: t.base.ref)
    monkeypatch.setattr(images, "local_image", lambda client, ref: Base())
    monkeypatch.setattr(images, "build", lambda client, spec, log, verbose=False: seen.update(spec=spec))
    monkeypatch.setattr(
        images, "audio_wheels", lambda client, matrix_, n, base, log, extras=None: tmp_path if t.audio else None
    )
    images.build_target(None, m, name, log=lambda line: None, context=tmp_path)
    assert seen["spec"].dockerfile == render.dockerfile_name(t.family)
    return seen["spec"].buildargs


@pytest.mark.parametrize("name", list(matrix.load().targets))
def test_args_are_what_build_target_passes(m, parsed, name, monkeypatch, tmp_path):
    expected = build_target_args(m, name, monkeypatch, tmp_path)
    args = blocks(parsed, "target")[f"gemma4-e2b-{name}"]["args"]
    variables = {"REVISION": facts.revision(), "CREATED": facts.created(), "WHEELS_URL": expected["GEMMA4_WHEELS_URL"]}
    got = {k: hcl_value(v, variables) for k, v in args.items()}
    # The base's digest is read from the pulled base by build.py; bake has only targets.yaml's pin.
    assert got.pop("GEMMA4_BASE_DIGEST") == (m.targets[name].base.digest or "")
    expected.pop("GEMMA4_BASE_DIGEST")
    assert got == expected


@pytest.mark.parametrize("name", list(matrix.load().targets))
def test_labels_are_the_ones_the_dockerfile_makes_from_the_args(parsed, name):
    target = blocks(parsed, "target")[f"gemma4-e2b-{name}"]
    assert target["labels"] == {label: target["args"][arg] for label, arg in BUILD_FACTS.items()}


def test_gaudi_stage1_is_a_target_the_gaudi_base_resolves_to(m, parsed):
    targets = blocks(parsed, "target")
    t = m.targets["gaudi2"]
    assert targets["gemma4-e2b-gaudi2"]["contexts"] == {t.base.ref: "target:gemma4-e2b-gaudi2-base"}
    assert targets["gemma4-e2b-gaudi2-base"]["dockerfile"] == "Dockerfile.gaudi-vllm"
    assert targets["gemma4-e2b-gaudi2-base"]["tags"] == [t.base.image]


@pytest.mark.parametrize("value", ["plain", 'quote " and back\\slash', "template ${HOME} and %{ if }", "two\nlines"])
def test_strings_survive_hcl_escaping(value):
    parsed = parse(f"x = {bake._string(value)}\n")
    assert hcl_value(parsed["x"], {}).replace("\\n", "\n") == value


def test_a_broken_file_does_not_parse():
    with pytest.raises(Exception):
        parse(bake.render_bake(m, render.other_releases(m)).replace('target "_common" {', 'target "_common" {{'))


def test_render_writes_the_bake_file(m):
    """The committed docker-bake.hcl is one of render's outputs, so `render --check` catches drift."""
    rendered = render.render_all(m)
    assert bake.BAKE_FILE in rendered, "render.render_all does not write docker-bake.hcl (wire in bake.render_bake)"
    assert rendered[bake.BAKE_FILE] == bake.render_bake(m, render.other_releases(m))


@pytest.mark.skipif(
    shutil.which("docker") is None
    or subprocess.run(["docker", "buildx", "version"], capture_output=True).returncode != 0,
    reason="docker buildx is not installed (no Debian bookworm package, not on PyPI)",
)
def test_buildx_reads_the_same_args(m, tmp_path):
    out = subprocess.run(
        ["docker", "buildx", "bake", "-f", "-", "--print", "gemma4-e2b-h100"],
        input=bake.render_bake(m, render.other_releases(m)),
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    target = json.loads(out.stdout)["target"]["gemma4-e2b-h100"]
    assert target["args"]["BASE_IMAGE"] == m.targets["h100"].base.ref
    assert target["args"]["GEMMA4_REVISION"] == "unknown"
    assert target["tags"] == [m.tag("h100")]


def test_each_other_release_has_its_targets_and_group(m):
    others = render.other_releases(m)
    assert [v.project.vllm_version for v in others] == matrix.releases()[1:]
    parsed = parse(bake.render_bake(m, others))
    target = blocks(parsed, "target")["gemma4-e2b-xeon6-v0_32_0"]
    assert target["tags"] == ["gemma4-e2b:xeon6-v0.32.0"]
    assert target["args"]["BASE_IMAGE"] == "vllm/vllm-openai-cpu:v0.32.0-x86_64"
    assert (
        target["args"]["GEMMA4_FIXES_PROFILE"] == "vllm-0.32.0" and target["args"]["GEMMA4_VERSION"] == "xeon6-v0.32.0"
    )
    assert blocks(parsed, "group")["gemma4-e2b-v0_32_0"]["targets"] == [
        f"gemma4-e2b-{name}-v0_32_0" for name in others[0].targets
    ]
    default = blocks(parsed, "group")["default"]["targets"]
    assert "gemma4-e2b-xeon6-v0_32_0" not in default and "gemma4-e2b-xeon6" in default  # the CPU default
