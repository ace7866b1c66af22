"""One tag for every platform of a target: an OCI image index (OCI image spec 1.1, image-index.md)
naming each platform's pushed manifest with its `platform` object, stored in the registry under the
target's tags. `docker pull` and `skopeo copy` then pick the manifest for the platform they run on
(or the one `--platform` / `--override-arch` asks for).

The engine pushes Docker v2 schema 2 manifests; the index names each with the media type the
registry stored it under (the daemon's docker push has no OCI output). Docker 20.10's `pull
--platform` and skopeo 1.9's `copy --override-arch` both choose from such an index, and Debian's
docker-registry (distribution 2.8) stores it after checking each named manifest is there (all
three measured here: tests/integration/test_multiplatform_push.py). The index is
built from the registry's bytes only (no clock, no host), so pushing the same images again makes
the same index digest and nothing is stored twice. Its bytes are made here because the pinned
oras (trixie's 1.2.0: `oras manifest` has delete, fetch, fetch-config, push) cannot make an
index; oras stores it (registry.put_manifest)."""

from __future__ import annotations

import json

from gemma4_images.build import registry as registry_api
from gemma4_images.spec import platforms

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
REVISION = "org.opencontainers.image.revision"


def descriptor(host: str, repository: str, digest: str, platform: str) -> dict:
    body, media_type = registry_api.get_manifest(host, repository, digest)
    if registry_api.sha256_digest(body) != digest:
        raise registry_api.RegistryError(f"{host}/{repository}@{digest}: the registry sent other bytes")
    return {"mediaType": media_type, "digest": digest, "size": len(body), "platform": platforms.parse(platform).oci}


def body(descriptors: list[dict], revision: str) -> bytes:
    """The index's bytes: the descriptors in the order given (the default platform first, so a tool
    that takes the first entry gets linux/amd64), and the commit every image was built from."""
    index = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": descriptors,
        "annotations": {REVISION: revision},
    }
    return json.dumps(index, indent=2, sort_keys=True).encode()


def put(host: str, repository: str, tag: str, data: bytes) -> str:
    return registry_api.put_manifest(host, repository, tag, data, OCI_INDEX)
