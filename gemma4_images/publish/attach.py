"""Attach files (an SBOM, a provenance statement, anything with a media type) to an image digest
in a registry, and fetch them back.

The registry this project tests on (Debian's docker-registry, distribution 2.8) has no referrers
API (OCI distribution spec 1.1), so an attachment is found by a tag derived from the image digest,
the scheme cosign made common: `sha256-<hex>.<suffix>` (".sbom" for an SBOM, ".att" for an
attestation; cosign doc/cosign_attach_sbom.md: "Attachment images are tagged as:
[AttachmentTagPrefix]sha256-[TargetImageDigest].[AttachmentName]"). The tag itself is then signed
like an image tag, as cosign's docs advise for attached SBOMs (docs.sigstore.dev/cosign/other_types:
"attaching SBOMs this way does not sign them"). Each attachment is an OCI image manifest (OCI image
spec 1.1, "Guidelines for Artifact Usage"):

- `artifactType` and `config.mediaType` are the file's media type; the config blob is `{}` (so
  registries and tools that predate artifactType, as distribution 2.8 does, still see the type);
- one layer: the file itself, with its media type and its name as org.opencontainers.image.title;
- `subject`: the image manifest's descriptor, so a registry with the referrers API lists it too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gemma4_images.build import registry as registry_api

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CYCLONEDX_JSON = "application/vnd.cyclonedx+json"  # IANA-registered, cyclonedx.org/specification
IN_TOTO_JSON = "application/vnd.in-toto+json"  # in-toto attestation spec, Statement layer
EMPTY_CONFIG = b"{}"


@dataclass(frozen=True)
class Attachment:
    path: Path
    media_type: str
    suffix: str  # the tag's suffix: sha256-<hex>.<suffix>


# What push attaches for a target, as the SBOM and provenance generators name their reports:
# (file name pattern, media type, tag suffix).
REPORTS = (
    ("sbom-{target}.cdx.json", CYCLONEDX_JSON, "sbom"),
    ("provenance-{target}.intoto.json", IN_TOTO_JSON, "att"),
)
SUFFIXES = tuple(suffix for _, _, suffix in REPORTS)


def report_attachments(target: str, reports_dir: Path) -> list[Attachment]:
    return [Attachment(Path(reports_dir) / name.format(target=target), kind, suffix) for name, kind, suffix in REPORTS]


def tag_for(digest: str, suffix: str) -> str:
    algorithm, _, hex_digest = digest.partition(":")
    return f"{algorithm}-{hex_digest}.{suffix}"


def subject_descriptor(host: str, repository: str, digest: str) -> dict:
    body, media_type = registry_api.get_manifest(host, repository, digest)
    return {"mediaType": media_type, "digest": digest, "size": len(body)}


def manifest_for(attachment: Attachment, data: bytes, subject: dict) -> bytes:
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": attachment.media_type,
        "config": {
            "mediaType": attachment.media_type,
            "digest": registry_api.sha256_digest(EMPTY_CONFIG),
            "size": len(EMPTY_CONFIG),
        },
        "layers": [
            {
                "mediaType": attachment.media_type,
                "digest": registry_api.sha256_digest(data),
                "size": len(data),
                "annotations": {"org.opencontainers.image.title": attachment.path.name},
            }
        ],
        "subject": subject,
    }
    return json.dumps(manifest, indent=2, sort_keys=True).encode()


def attach(host: str, repository: str, digest: str, attachment: Attachment) -> dict:
    """Upload the file and its manifest under the digest's tag; returns what pushed.json records."""
    data = attachment.path.read_bytes()
    subject = subject_descriptor(host, repository, digest)
    registry_api.push_blob(host, repository, EMPTY_CONFIG)
    blob = registry_api.push_blob(host, repository, data)
    tag = tag_for(digest, attachment.suffix)
    body = manifest_for(attachment, data, subject)
    manifest_digest = registry_api.put_manifest(host, repository, tag, body, OCI_MANIFEST)
    return {
        "file": str(attachment.path),
        "media_type": attachment.media_type,
        "tag": tag,
        "manifest_digest": manifest_digest,
        "blob_digest": blob,
        "size": len(data),
    }


def fetch(host: str, repository: str, tag: str) -> tuple[dict, bytes]:
    """An attachment's manifest and the file it carries (its digest checked by get_blob)."""
    body, _ = registry_api.get_manifest(host, repository, tag)
    manifest = json.loads(body)
    layers = manifest.get("layers") or []
    if len(layers) != 1:
        raise registry_api.RegistryError(f"{host}/{repository}:{tag}: not an attachment (it has {len(layers)} layers)")
    return manifest, registry_api.get_blob(host, repository, layers[0]["digest"])
