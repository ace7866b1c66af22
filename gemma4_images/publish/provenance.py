"""SLSA provenance v1 (https://slsa.dev/provenance/v1) of a built image, as an in-toto Statement v1
(https://in-toto.io/Statement/v1). Everything in it is read from the image itself (its id,
labels, build.json, its copy of the fixes pack, the BOS tokenizer record) except the vLLM sdist's
digest, which targets.yaml pins and `build.py stage` checks before the build copies from it."""

from __future__ import annotations

import json

from gemma4_images.check.image_contents import PACK, RECORDS, Contents
from gemma4_images.publish.sbom import PROP, engine_time, oci_purl
from gemma4_images.spec.matrix import Matrix
from gemma4_images.spec.reference import Reference

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
# What `build.py build` is, as SLSA's buildType: a URI naming how to read the parameters below
# (docs/publish.md, "SBOM and provenance", describes it).
BUILD_TYPE_PATH = "/blob/main/docs/publish.md#sbom-and-provenance"
BOS_RECORD = "gemma4-bos.json"  # the BOS tokenizer copy's record (patches/gemma4-bos-tokenizer)


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


def subjects(contents: Contents) -> list[dict]:
    """The local image id (the sha256 of the image config, which push and pull keep, so a pulled
    image is checked with `docker inspect --format {{.Id}}`), and each registry manifest digest
    the engine knows for it (RepoDigests: after a push or a pull)."""
    out = [
        {
            "name": contents.ref,
            "digest": {"sha256": _hex(contents.id)},
            "annotations": {"kind": "image config digest (docker image id)"},
        }
    ]
    for repo_digest in map(Reference.split, contents.repo_digests):
        out.append(
            {
                "name": repo_digest.name,
                "digest": {"sha256": _hex(repo_digest.digest)},
                "annotations": {"kind": "registry manifest digest"},
            }
        )
    return out


def _source(labels: dict) -> dict:
    revision = labels.get("org.opencontainers.image.revision", "unknown")
    sha = revision.removesuffix("-dirty")
    out = {"name": "source", "uri": f"git+{labels.get('org.opencontainers.image.source', '')}@{sha}"}
    if sha != "unknown":
        out["digest"] = {"gitCommit": sha}
    if revision.endswith("-dirty"):
        out["annotations"] = {"dirty": "built with uncommitted changes on top of this commit"}
    return out


def _base(labels: dict) -> dict:
    name = labels.get("org.opencontainers.image.base.name", "")
    digest = labels.get("org.opencontainers.image.base.digest", "")
    out = {"name": f"base image {name}", "annotations": {"label": "org.opencontainers.image.base.digest"}}
    purl = oci_purl(name, digest)
    if purl:
        out.update(uri=purl.to_string(), digest={"sha256": _hex(digest)})
    return out


def _fixes(contents: Contents, version: str) -> list[dict]:
    """Each applied fix's diff, and the upstream files it targets at their upstream sha256."""
    diffs, targets = [], {}
    for entry in contents.fixes:
        name, diff = entry["name"], contents.fix_paths(entry)[1]
        fix = contents.fix_facts(entry)
        diffs.append(
            {
                "name": "patches/" + diff.removeprefix(f"{PACK}/"),
                "digest": {"sha256": contents.sha256(diff)},
                "annotations": {"fix": name, "writtenAgainst": fix["written_against"]},
            }
        )
        for path, pre in fix["pre_sha256"].items():
            package = fix["package"]
            target = targets.setdefault(
                path,
                {
                    "name": path,
                    "uri": f"pkg:pypi/{package.replace('_', '-')}@{version}#{path}",
                    "digest": {"sha256": pre},
                    "annotations": {"fixes": []},
                },
            )
            target["annotations"]["fixes"].append(name)
    return diffs + list(targets.values())


def _tokenizer(contents: Contents) -> list[dict]:
    """The BOS tokenizer copy's source: its files at their source sha256, and the hub commit."""
    records = [p for p in contents.files if p.endswith("/" + BOS_RECORD)]
    if not records:
        return []
    record = contents.json(records[0])
    source = record["source"]
    where = f"https://huggingface.co/{source['repo_id']}" if source["kind"] == "hub" else f"file://{source['path']}"
    out = []
    if source.get("commit"):
        out.append({"name": "tokenizer source", "uri": where, "digest": {"gitCommit": source["commit"]}})
    for name, file in sorted(record["files"].items()):
        out.append(
            {"name": f"tokenizer source {name}", "uri": f"{where}/{name}", "digest": {"sha256": file["source_sha256"]}}
        )
    return out


def _upstream_files(contents: Contents, matrix: Matrix) -> list[dict]:
    """The vLLM sdist serve flags' files come from, and each such file as the image holds it."""
    out = []
    for path, up in matrix.upstream_files.items():
        out.append(
            {
                "name": up.sdist,
                "uri": f"pkg:pypi/vllm@{matrix.project.vllm_version}",
                "digest": {"sha256": up.sdist_sha256},
            }
        )
        copies = [p for p in contents.files if p.endswith("/" + path)]
        if copies:
            out.append(
                {
                    "name": up.member,
                    "digest": {"sha256": contents.sha256(copies[0])},
                    "annotations": {"inImage": copies[0]},
                }
            )
    return out


def statement(contents: Contents, matrix: Matrix) -> dict:
    labels = contents.labels
    build = contents.json(f"{RECORDS}/build.json")
    source = labels.get("org.opencontainers.image.source", "")
    version = labels.get("io.gemma4-images.vllm-version", matrix.project.vllm_version)
    finished = engine_time(contents.created)
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects(contents),
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": source + BUILD_TYPE_PATH,
                "externalParameters": {
                    "target": build.get("io.gemma4-images.target"),
                    "tag": contents.ref,
                    "baseImage": build.get("org.opencontainers.image.base.name"),
                    "fixes": [n for n in build.get("io.gemma4-images.fixes", "").split(",") if n],
                    "tokenizer": build.get("io.gemma4-images.tokenizer"),
                },
                "internalParameters": {"buildJson": build},
                "resolvedDependencies": [
                    _base(labels),
                    _source(labels),
                    *_fixes(contents, version),
                    *_tokenizer(contents),
                    *_upstream_files(contents, matrix),
                ],
            },
            "runDetails": {
                "builder": {
                    "id": f"{source}/blob/main/build.py",
                    "version": {
                        PROP: labels.get("org.opencontainers.image.revision", "unknown"),
                        "docker": contents.docker_version,
                    },
                },
                "metadata": {"finishedOn": finished.strftime("%Y-%m-%dT%H:%M:%SZ")} if finished else {},
            },
        },
    }


def _digests(document: dict) -> dict[str, dict]:
    predicate = document.get("predicate", {}).get("buildDefinition", {})
    named = [("subject", s) for s in document.get("subject", [])]
    named += [("dependency", d) for d in predicate.get("resolvedDependencies", [])]
    return {f"{kind} {d.get('name') or d.get('uri')}": d.get("digest", {}) for kind, d in named}


def mismatches(document: dict, contents: Contents, matrix: Matrix) -> list[str]:
    """Where a provenance document differs from what the image holds: its type, and every subject
    and dependency digest (each missing, extra or changed one, by name)."""
    problems = []
    if document.get("_type") != STATEMENT_TYPE or document.get("predicateType") != PREDICATE_TYPE:
        problems.append(f"not an in-toto Statement v1 with predicate {PREDICATE_TYPE}")
    want, got = _digests(statement(contents, matrix)), _digests(document)
    for name in sorted(set(want) | set(got)):
        if name not in got:
            problems.append(f"{name}: missing from the document (the image gives {want[name]})")
        elif name not in want:
            problems.append(f"{name}: the document names it, the image gives no such entry")
        elif want[name] != got[name]:
            problems.append(f"{name}: the document says {got[name]}, the image gives {want[name]}")
    return problems


def to_json(document: dict) -> str:
    return json.dumps(document, indent=2) + "\n"
