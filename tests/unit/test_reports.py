"""`build` keeps an image's SBOM and provenance only while they were written for that very image id
and tag by today's generator, and untouched since; anything else reads the image again."""

import json
from types import SimpleNamespace

import pytest

from gemma4_images.publish import reports


class Engine:
    """Stand-in for the Docker client: the one call for_build makes (the image's id, repo digests)."""

    def __init__(self, image_id, repo_digests=()):
        self.id = image_id
        attrs = {"RepoDigests": list(repo_digests)}
        self.images = SimpleNamespace(get=lambda ref: SimpleNamespace(id=self.id, attrs=attrs))


@pytest.fixture
def reads(monkeypatch, tmp_path):
    """Each reading of the image, and documents that name what they were made from."""
    monkeypatch.setenv("GEMMA4_REPORTS", str(tmp_path / "reports"))
    done = []

    def read(client, m, name, ref):
        done.append((client.id, ref))
        return SimpleNamespace(id=client.id, ref=ref)

    monkeypatch.setattr(reports.image_contents, "read", read)
    monkeypatch.setattr(reports, "write_sbom", lambda c, name: reports.write_document(reports.sbom_path(name), c.id))
    monkeypatch.setattr(
        reports, "write_provenance", lambda c, m, name: reports.write_document(reports.provenance_path(name), c.ref)
    )
    return done


def build(image_id="sha256:aaa", ref="gemma4-e2b:xeon6-v0.30.0", repo_digests=()):
    reports.for_build(Engine(image_id, repo_digests), None, "xeon6", ref, log=lambda line: None)


def test_an_unchanged_image_keeps_its_documents(reads):
    build()
    build()
    assert reads == [("sha256:aaa", "gemma4-e2b:xeon6-v0.30.0")]
    assert reports.sbom_path("xeon6").read_text() == "sha256:aaa"


def test_another_image_id_or_tag_is_read_again(reads):
    build()
    build(image_id="sha256:bbb")
    build(image_id="sha256:bbb", ref="gemma4-e2b:xeon6-v0.30.0-tiny")
    assert [r[0] for r in reads] == ["sha256:aaa", "sha256:bbb", "sha256:bbb"]
    assert reports.provenance_path("xeon6").read_text() == "gemma4-e2b:xeon6-v0.30.0-tiny"


def test_a_repo_digest_added_by_a_push_is_read_again(reads):
    # The provenance's subjects name the image's repo digests.
    build()
    build(repo_digests=["127.0.0.1:5000/gemma4-e2b@sha256:ccc"])
    assert len(reads) == 2


@pytest.mark.parametrize("change", ["edit", "delete"])
def test_a_document_changed_since_is_written_again(reads, change):
    build()
    path = reports.provenance_path("xeon6")
    path.write_text("edited") if change == "edit" else path.unlink()
    build()
    assert len(reads) == 2 and path.read_text() == "gemma4-e2b:xeon6-v0.30.0"


def test_a_changed_generator_writes_them_again(reads, monkeypatch):
    build()
    monkeypatch.setattr(reports, "_generator", lambda: "another generator")
    build()
    assert len(reads) == 2


def test_a_failed_reading_leaves_no_record_that_would_keep_old_documents(reads, monkeypatch):
    build()

    def refuse(client, m, name, ref):
        raise reports.image_contents.ImageError("fixes.json and the label disagree")

    monkeypatch.setattr(reports.image_contents, "read", refuse)
    with pytest.raises(reports.image_contents.ImageError):
        build(image_id="sha256:bbb")
    assert not list(reports.folder().glob(".*.written-for.json"))


def test_the_record_names_the_image_and_each_file_digest(reads):
    build()
    record = json.loads((reports.folder() / ".xeon6.written-for.json").read_text())
    assert record["image"] == "sha256:aaa" and record["ref"] == "gemma4-e2b:xeon6-v0.30.0"
    assert set(record["files"]) == {"sbom-xeon6.cdx.json", "provenance-xeon6.intoto.json"}
    assert all(len(digest) == 64 for digest in record["files"].values())
