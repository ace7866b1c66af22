"""registry.Reference, the one reading of an image reference: its parts as written (rendered back
exactly), Docker's defaults for host and repository, and the one-line refusal of what the engine
would refuse. The call sites' readings (pull, base digest, purl) are checked through it."""

import dataclasses

import pytest

from gemma4_images.build import docker_build
from gemma4_images.publish import sbom
from gemma4_images.spec.reference import REFERENCE_RULE, BadReference, Reference, recorded_digest

D = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    "ref, name, tag, digest, host, repository",
    [
        ("127.0.0.1:5000/ns/img:tag", "127.0.0.1:5000/ns/img", "tag", "", "127.0.0.1:5000", "ns/img"),
        ("127.0.0.1:5000/ns/img", "127.0.0.1:5000/ns/img", "", "", "127.0.0.1:5000", "ns/img"),
        (f"127.0.0.1:5000/ns/img:t@{D}", "127.0.0.1:5000/ns/img", "t", D, "127.0.0.1:5000", "ns/img"),
        ("localhost/x", "localhost/x", "", "", "localhost", "x"),
        ("localhost:5000/a/b:1", "localhost:5000/a/b", "1", "", "localhost:5000", "a/b"),
        ("[::1]:5000/x:y", "[::1]:5000/x", "y", "", "[::1]:5000", "x"),
        (
            "ghcr.io/org/team/gemma4-e2b:h100",
            "ghcr.io/org/team/gemma4-e2b",
            "h100",
            "",
            "ghcr.io",
            "org/team/gemma4-e2b",
        ),
        # Docker Hub: no host written; a one-part name is an official image, library/NAME.
        ("ubuntu", "ubuntu", "", "", "docker.io", "library/ubuntu"),
        ("ubuntu:22.04", "ubuntu", "22.04", "", "docker.io", "library/ubuntu"),
        ("localhost", "localhost", "", "", "docker.io", "library/localhost"),  # a host only before a /
        ("vllm/vllm-openai:v0.30.0-cu129", "vllm/vllm-openai", "v0.30.0-cu129", "", "docker.io", "vllm/vllm-openai"),
        ("docker.io/library/ubuntu:1", "docker.io/library/ubuntu", "1", "", "docker.io", "library/ubuntu"),
        (f"img@{D}", "img", "", D, "docker.io", "library/img"),
        (f"img:1@{D}", "img", "1", D, "docker.io", "library/img"),
    ],
)
def test_parts_and_round_trip(ref, name, tag, digest, host, repository):
    parsed = Reference.parse(ref)
    assert (parsed.name, parsed.tag, parsed.digest) == (name, tag, digest)
    assert (parsed.host, parsed.repository) == (host, repository)
    assert str(parsed) == ref
    assert Reference.split(ref) == parsed  # the unchecked reading is the same reading
    assert parsed.full_name == f"{host}/{repository}"
    assert parsed.tag_or_latest == (tag or "latest")
    assert parsed.tag_or_digest == (digest or tag or "latest")


def test_helpers():
    ref = Reference.parse("127.0.0.1:5000/ns/img:tag")
    assert ref.basename == "img" and Reference.parse("ubuntu").basename == "ubuntu"
    assert str(ref.with_digest(D)) == f"127.0.0.1:5000/ns/img:tag@{D}"
    assert str(Reference("127.0.0.1:5000/ns/img", digest=D)) == f"127.0.0.1:5000/ns/img@{D}"
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.tag = "other"


@pytest.mark.parametrize(
    "ref",
    [
        "UPPER/case:1",  # uppercase path
        "reg.io/Upper",
        "Bad Ref!!",
        "img:-bad",  # a tag starts with a letter, digit or _
        "img:bad/tag",
        "img:" + "t" * 129,  # at most 128
        "img:",  # a separator with nothing after it
        "img@",
        "img@sha256:xyz",  # bad digest
        f"img@{D[:20]}",  # too short
        "",
        "a//b",
        "x/",
        "localhost/",
        "a" * 256,  # a name of at most 255
    ],
)
def test_invalid_references_are_one_line_naming_the_option_and_the_rule(ref):
    with pytest.raises(BadReference) as e:
        Reference.parse(ref, "--image")
    assert str(e.value) == f"--image {ref!r} is not a valid image reference: expected {REFERENCE_RULE}"
    assert "\n" not in str(e.value)


def test_the_refusal_text_is_the_one_the_cli_has_always_printed():
    with pytest.raises(BadReference) as e:
        Reference.parse("UPPER/case:1")
    assert str(e.value) == (
        "reference 'UPPER/case:1' is not a valid image reference: expected [HOST[:PORT]/]NAME[:TAG]"
        "[@sha256:DIGEST], the name in lowercase letters, digits and the separators . _ __ -, a tag of "
        "at most 128 letters, digits, _ . -"
    )


def test_split_reads_without_refusing():
    assert Reference.split("Bad Ref!!") == Reference("Bad Ref!!")
    assert Reference.split("sha256:" + "1" * 64) == Reference("sha256", "1" * 64)  # an image id is no reference


def test_recorded_digest_matches_the_repository_as_written():
    digests = [f"other/x@sha256:{'b' * 64}", f"127.0.0.1:5000/ns/img@{D}"]
    assert recorded_digest(digests, "127.0.0.1:5000/ns/img") == D
    assert recorded_digest(digests, "ns/img") is None


class FakePull:
    def __init__(self):
        self.calls = []

    @property
    def images(self):
        return self

    def pull(self, repository, tag=None):
        self.calls.append((repository, tag))


@pytest.mark.parametrize(
    "ref, call",
    [
        ("127.0.0.1:5000/ns/img:tag", ("127.0.0.1:5000/ns/img", "tag")),
        ("127.0.0.1:5000/ns/img", ("127.0.0.1:5000/ns/img", "latest")),
        (f"img:1@{D}", ("img", D)),  # the digest pins it; the tag only labels it
    ],
)
def test_pull_asks_for_the_tag_or_the_digest(ref, call, monkeypatch):
    monkeypatch.delenv(docker_build.OFFLINE)  # a fake engine: nothing leaves the machine
    client = FakePull()
    assert docker_build.pull(client, ref) is None
    assert client.calls == [call]


class FakeImage:
    id = "sha256:" + "9" * 64

    def __init__(self, repo_digests):
        self.attrs = {"RepoDigests": repo_digests}


def test_base_digest_is_the_pinned_one_else_the_recorded_one_else_the_image_id():
    image = FakeImage([f"127.0.0.1:5000/ns/img@{D}"])
    assert docker_build.base_digest(image, f"x:1@{D}") == D
    assert docker_build.base_digest(image, "127.0.0.1:5000/ns/img:tag") == D
    assert docker_build.base_digest(image, "127.0.0.1:5000/other:tag") == image.id


def test_oci_purl_names_the_image_by_its_last_path_part():
    purl = sbom.oci_purl("127.0.0.1:5000/ns/img:tag", D)
    assert purl.to_string() == f"pkg:oci/img@{D}?repository_url=127.0.0.1:5000/ns/img&tag=tag"
    assert sbom.oci_purl("img", "not-a-digest") is None


def test_an_image_name_with_a_registry_port_keeps_the_version_label_and_the_k8s_version():
    # project.image may name a registry with a port; the version is the tag, never what follows
    # the port's colon (facts and k8s used to split the tag string at its first ':').
    from gemma4_images.generate import k8s
    from gemma4_images.spec import facts, matrix

    loaded = matrix.load()
    project = loaded.project.model_copy(update={"image": "registry.local:5000/ml/gemma4-e2b"})
    m = loaded.model_copy(update={"project": project})
    assert facts.facts(m, "xeon6", "b", "d")["GEMMA4_VERSION"] == "xeon6-v0.30.0"
    deployment = next(
        d for d in __import__("yaml").safe_load_all(k8s.render_k8s(m, "xeon6")) if d["kind"] == "Deployment"
    )
    assert deployment["metadata"]["labels"]["app.kubernetes.io/version"] == "xeon6-v0.30.0"
