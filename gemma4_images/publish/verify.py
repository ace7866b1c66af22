"""What a deployment pipeline (or an admission controller) checks before it deploys an image, by
cosign: the manifest signed by the key (for an index, the index and the platform's image), then
the image's SBOM and provenance attestations, each signed by the key with the image as subject."""

from __future__ import annotations

import json
from pathlib import Path

from gemma4_images.build import registry as registry_api
from gemma4_images.publish import cosign
from gemma4_images.spec import platforms, reference


def verify(
    ref: str,
    key: Path,
    *,
    attachments_dir: Path | None = None,
    require_attestations: bool = False,
    platform: str | None = None,
    log=print,
) -> dict:
    """Check ref (see the module doc); platform (default linux/amd64) chooses an index's image.
    Raises CosignError (one line) on the first refusal, or on a missing attestation when
    require_attestations; with attachments_dir, writes each attested in-toto Statement there once
    all are accepted. Returns the image's digest, the index's (None for one image), the platform
    and the attestations found."""
    cosign.binary(), registry_api.binary()  # one line naming the setup command, before the registry is asked
    image = reference.Reference.split(ref)
    host, repository = image.host, image.repository
    try:
        registry_api.check(host)
        manifest, held = registry_api.platform_manifests(host, repository, image.tag_or_digest)
    except registry_api.RegistryError as e:
        raise cosign.CosignError(f"cannot verify {ref}: {e}") from None
    chosen = platforms.parse(platform).name if held is not None else None
    index_digest = registry_api.sha256_digest(manifest) if held is not None else None
    if held is not None:
        if chosen not in held:
            raise cosign.CosignError(f"{ref} refused: its index holds {', '.join(held)}, not {chosen}")
        cosign.verify(host, repository, index_digest, key)
        digest = held[chosen]
        _check_bytes(host, repository, digest, ref)
    else:
        if platform:
            _check_single_platform(host, repository, manifest, ref, platforms.parse(platform).name)
        digest = registry_api.sha256_digest(manifest)
    cosign.verify(host, repository, digest, key)
    log(f"{ref}: cosign signature by {key} accepted ({digest})")
    found = {}
    for attestation in cosign.ATTESTATIONS:
        kind = attestation.kind
        try:
            statement = cosign.verify_attestation(host, repository, digest, attestation, key)
        except cosign.CosignError as e:
            if require_attestations:
                raise cosign.CosignError(f"{e} (--require-attachments wants the SBOM and the provenance)") from None
            log(f"{ref}: no {kind} attestation accepted: {e}")
            continue
        if not any(s.get("digest", {}).get("sha256") == digest.partition(":")[2] for s in statement["subject"]):
            raise cosign.CosignError(f"{ref} refused: its {kind} attestation names another subject")
        found[kind] = statement
        log(f"{ref}: {kind} attestation accepted ({statement['predicateType']})")
    if attachments_dir is not None:
        Path(attachments_dir).mkdir(parents=True, exist_ok=True)
        for kind, statement in found.items():
            (Path(attachments_dir) / f"{kind}.intoto.json").write_text(json.dumps(statement, indent=2) + "\n")
    attachments = [{"type": kind, "predicate_type": s["predicateType"]} for kind, s in found.items()]
    return {"reference": ref, "digest": digest, "index": index_digest, "platform": chosen, "attachments": attachments}


def _check_bytes(host: str, repository: str, digest: str, ref: str) -> None:
    """The registry's bytes for an index's image are the ones its digest names (a pull checks the
    same; verifying first says which platform was tampered with)."""
    try:
        registry_api.get_manifest(host, repository, digest)  # oras checks the bytes against the digest
    except registry_api.RegistryError as e:
        if "mismatched digest" in str(e):
            raise cosign.CosignError(f"{ref} refused: the registry's manifest for {digest} is other bytes") from None
        raise cosign.CosignError(f"cannot verify {ref}: {e}") from None


def _check_single_platform(host: str, repository: str, manifest: bytes, ref: str, wanted: str) -> None:
    """--platform on a one-image reference (its manifest): refused unless that image is for the platform."""
    config = json.loads(manifest).get("config") or {}
    try:
        built = json.loads(registry_api.get_blob(host, repository, config["digest"])) if config.get("digest") else {}
    except registry_api.RegistryError as e:
        raise cosign.CosignError(f"cannot verify {ref}: {e}") from None
    found = f"{built.get('os')}/{built.get('architecture')}"
    if found != wanted:
        raise cosign.CosignError(f"{ref} refused: it is one {found} image, not an index holding {wanted}")
