"""pin's reading of references and its edit of targets.yaml, without a registry (the round trip
against a real one is tests/integration/test_pin.py)."""

import pytest

from gemma4_images.build import pin, registry
from gemma4_images.spec import matrix, reference

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64


@pytest.mark.parametrize(
    "ref, parts",
    [
        ("vllm/vllm-openai:v0.30.0-cu129", ("docker.io", "vllm/vllm-openai", "v0.30.0-cu129")),
        ("ubuntu", ("docker.io", "library/ubuntu", "latest")),
        ("127.0.0.1:5000/ns/img:1", ("127.0.0.1:5000", "ns/img", "1")),
        ("localhost/img", ("localhost", "img", "latest")),
        (
            "vault.habana.ai/gaudi-docker/1.24.1/ubuntu24.04/habanalabs/pytorch-installer-2.11.0:latest",
            ("vault.habana.ai", "gaudi-docker/1.24.1/ubuntu24.04/habanalabs/pytorch-installer-2.11.0", "latest"),
        ),
        (f"img:1@{DIGEST_A}", ("docker.io", "library/img", DIGEST_A)),
    ],
)
def test_references_split_as_docker_reads_them(ref, parts):
    image = reference.Reference.split(ref)
    assert (image.host, image.repository, image.tag_or_digest) == parts
    assert registry.api_host(parts[0]) == ("registry-1.docker.io" if parts[0] == "docker.io" else parts[0])


def test_every_registry_base_once_gaudi_by_its_stage1_image():
    m = matrix.load()
    found = {b.image: b.targets for b in pin.bases(m, list(m.targets))}
    assert found["vllm/vllm-openai:v0.30.0-cu129"] == ["h100", "h200"]
    # each platform's own base too, named with its platform
    assert found["vllm/vllm-openai:v0.30.0-aarch64-cu129"] == ["h100 linux/arm64", "h200 linux/arm64"]
    assert found["vllm/vllm-openai-cpu:v0.30.0-arm64"] == ["xeon6 linux/arm64"]
    assert found["vllm/vllm-openai:v0.30.0"] == ["b200", "b300"]
    assert found[m.targets["gaudi2"].stage1.image] == ["gaudi2"]
    assert m.targets["gaudi2"].base.image not in found  # built here by stage 1: nothing to pin


YAML = """\
# top comment
targets:
  one: &one
    family: cpu
    base:
      image: reg.example/a:1        # trailing comment on the image
      # comment between
      digest: null
      local: x
    notes: []
  two:
    <<: *one
    base:
      image: reg.example/b:2
    notes: []
"""


def test_write_replaces_or_adds_only_digest_lines(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(YAML)
    changed = pin.write(path, {"reg.example/a:1": DIGEST_A, "reg.example/b:2": DIGEST_B}, today="2026-12-01")
    assert changed == ["reg.example/a:1", "reg.example/b:2"]
    assert path.read_text() == YAML.replace(
        "      digest: null\n", f"      digest: {DIGEST_A}  # pinned by `build.py pin` from reg.example on 2026-12-01\n"
    ).replace(
        "      image: reg.example/b:2\n",
        f"      image: reg.example/b:2\n"
        f"      digest: {DIGEST_B}  # pinned by `build.py pin` from reg.example on 2026-12-01\n",
    )
    assert pin.write(path, {"reg.example/a:1": DIGEST_A}) == []  # already there: untouched


def test_write_refuses_an_image_it_cannot_find_and_leaves_the_file(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(YAML)
    with pytest.raises(pin.PinError, match="no `image: reg.example/c:3` line"):
        pin.write(path, {"reg.example/c:3": DIGEST_A})
    assert path.read_text() == YAML and sorted(p.name for p in tmp_path.iterdir()) == ["t.yaml"]


def test_write_refuses_an_edit_that_would_not_give_the_digest_everywhere(tmp_path):
    # A flow mapping holds the image on a line pin does not edit: read back, the file would give the
    # image two digests, so nothing is written.
    text = YAML + "  three:\n    base: {image: reg.example/a:1, digest: null}\n"
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(pin.PinError, match=r"pinning reg.example/a:1 would give digests \['None', 'sha256:a"):
        pin.write(path, {"reg.example/a:1": DIGEST_A})
    assert path.read_text() == text and sorted(p.name for p in tmp_path.iterdir()) == ["t.yaml"]


def test_a_tag_two_release_files_name_is_asked_once(monkeypatch):
    asked = []

    def head(host, repository, tag, timeout=20):
        asked.append(f"{host}/{repository}:{tag}")
        return (DIGEST_A, "application/vnd.docker.distribution.manifest.v2+json")

    monkeypatch.setattr(registry, "manifest_head", head)
    tag = "ghcr.io/example/base:1"
    entries = [
        pin.Base(tag, None, ["h100"], "releases/vllm-0.30.0.yaml"),
        pin.Base(tag, DIGEST_A, ["b200"], "releases/vllm-0.32.0.yaml"),
    ]
    results = pin.resolve(entries)
    assert asked == [tag] and [r.state for r in results] == ["unpinned", "ok"]
