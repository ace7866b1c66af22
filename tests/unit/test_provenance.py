"""The provenance's logic on the stand-in image of test_sbom.py (made there, not read from an image;
the real image's provenance is tests/integration/test_sbom_provenance.py), read with the in-toto
attestation bindings (testkit/in_toto.py)."""

import copy
import json

import pytest
from test_sbom import PATCHES, standin

from gemma4_images.publish import provenance
from gemma4_images.spec import matrix
from testkit.in_toto import ParseError, parse


@pytest.fixture(scope="module")
def m():
    return matrix.load()


def dependencies(document) -> dict[str, dict]:
    return {d["name"]: d for d in document["predicate"]["buildDefinition"]["resolvedDependencies"]}


def test_statement_parses_as_in_toto_v1_with_slsa_provenance_v1(m):
    document = provenance.statement(standin(), m)
    statement, predicate = parse(document)
    assert statement.predicate_type == "https://slsa.dev/provenance/v1"
    assert statement.subject[0].digest["sha256"] == "ab" * 32
    assert predicate.run_details.builder.id.endswith("/build.py")
    assert predicate.run_details.metadata.finished_on.ToJsonString() == "2026-12-01T12:17:33Z"
    with pytest.raises(ParseError):  # the bindings do refuse a misspelt field
        parse(dict(document, predicate=dict(document["predicate"], buildDefinitoin={})))


def test_dependencies_are_base_source_diffs_and_upstream_files(m):
    fixes = ["gather-logprobs-int32", "seeded-sampling"]  # both edit vllm_gaudi/patches.py
    document = provenance.statement(standin(fixes=fixes), m)
    deps = dependencies(document)
    assert deps["base image gemma4-e2b-base/vllm-cpu:v0.30.0-local"]["digest"] == {"sha256": "cd" * 32}
    assert deps["source"]["digest"] == {"gitCommit": "0" * 40} and "annotations" not in deps["source"]
    for name in fixes:
        fix = json.loads((PATCHES / name / "fix.json").read_text())
        assert deps[f"patches/{name}/fix.diff"]["annotations"]["writtenAgainst"] == fix["written_against"]
        for path, pre in fix["pre_sha256"].items():
            assert deps[path]["digest"] == {"sha256": pre}
    # One entry per upstream file, naming every fix that targets it.
    assert deps["vllm_gaudi/patches.py"]["annotations"]["fixes"] == fixes
    assert deps["vllm_gaudi/patches.py"]["uri"] == "pkg:pypi/vllm-gaudi@0.30.0#vllm_gaudi/patches.py"
    sdist = next(iter(m.upstream_files.values()))
    assert deps[sdist.sdist]["digest"] == {"sha256": sdist.sdist_sha256}


def test_a_dirty_build_says_so(m):
    contents = standin()
    contents.labels["org.opencontainers.image.revision"] = "1" * 40 + "-dirty"
    source = dependencies(provenance.statement(contents, m))["source"]
    assert source["digest"] == {"gitCommit": "1" * 40} and "uncommitted" in source["annotations"]["dirty"]


def test_mismatches_name_each_tampered_digest(m):
    contents = standin()
    good = provenance.statement(contents, m)
    assert provenance.mismatches(good, contents, m) == []

    tampered = copy.deepcopy(good)
    dependencies(tampered)["patches/logprobs-decode-guard/fix.diff"]["digest"]["sha256"] = "00" * 32
    tampered["subject"][0]["digest"]["sha256"] = "11" * 32
    problems = provenance.mismatches(tampered, contents, m)
    assert len(problems) == 2
    assert problems[0].startswith("dependency patches/logprobs-decode-guard/fix.diff: the document says")
    assert problems[1].startswith("subject gemma4-e2b-test/standin:sbom")

    dropped = copy.deepcopy(good)
    dropped["predicate"]["buildDefinition"]["resolvedDependencies"].pop(1)  # the git revision
    assert provenance.mismatches(dropped, contents, m) == [
        "dependency source: missing from the document (the image gives {'gitCommit': '" + "0" * 40 + "'})"
    ]
    extra = copy.deepcopy(good)
    extra["subject"].append({"name": "elsewhere", "digest": {"sha256": "22" * 32}})
    assert provenance.mismatches(extra, contents, m) == [
        "subject elsewhere: the document names it, the image gives no such entry"
    ]
    assert provenance.mismatches(dict(good, predicateType="x"), contents, m)[0].startswith("not an in-toto")
