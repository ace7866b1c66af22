"""What a deployment pipeline runs before it deploys an image: the image's signature checked
against a policy (signing.py), then its attachments (attach.py), each itself signed, fetched
under the same policy and checked to name the verified image as their subject."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from gemma4_images.build import registry as registry_api
from gemma4_images.publish import attach, cosign, reports, signing
from gemma4_images.spec import platforms, reference


def policy_file(ref: str, key: Path | None, policy: Path | None, folder: Path) -> Path:
    """The policy to enforce: the one given, or one requiring key for ref's repository."""
    if key is None and policy is None:
        raise signing.SigningError(
            "nothing to verify against: give the public key (--key FILE) or a policy (--policy FILE)"
        )
    if key is not None and policy is not None:
        raise signing.SigningError("--key and --policy both given: the policy names its keys itself; give one")
    if policy is not None:
        return Path(policy)
    path = folder / "policy.json"
    identity = reference.Reference.split(ref).full_name
    path.write_text(json.dumps(signing.policy_requiring(identity, key), indent=2) + "\n")
    return path


def verify(
    ref: str,
    *,
    key: Path | None = None,
    policy: Path | None = None,
    signatures: str | None = None,
    dest: str | None = None,
    attachments_dir: Path | None = None,
    require_attachments: bool = False,
    platform: str | None = None,
    log=print,
) -> dict:
    """Check ref's signature and its attachments' (see the module doc); copy the checked image on
    to dest and the attached files into attachments_dir when given. Returns the verified digest
    and the attachments found; raises SigningError (one line) on the first refusal, or on a
    missing attachment when require_attachments (a pipeline that deploys nothing without its
    SBOM and provenance). For an index (a multi-platform tag), platform (default linux/amd64)
    chooses the image: the index's signature and that image's are both checked, and the
    attachments are that image's; the result's digest is the image's, its index the index's."""
    signatures = signatures or str(reports.folder() / "signatures")  # where push writes them
    image = reference.Reference.split(ref)
    host, repository = image.host, image.repository
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        enforced = policy_file(ref, key, policy, tmp)
        signing.skopeo()
        try:
            registry_api.check(host)
        except registry_api.RegistryUnavailable as e:
            raise signing.SigningError(f"cannot verify {ref}: {e}") from None
        manifest, held = _platforms_held(host, repository, image.tag_or_digest, ref)
        wanted = platforms.parse(platform).name
        chosen = wanted if held is not None else None
        index_digest = registry_api.sha256_digest(manifest) if held is not None else None
        if held is not None:
            if chosen not in held:
                raise signing.SigningError(f"{ref} refused: its index holds {', '.join(held)}, not {chosen}")
            # skopeo checks the platform's image, not the index that says which image that is.
            signing.check_index_signature(ref, index_digest, manifest, enforced, signatures)
        elif platform:
            _check_single_platform(host, repository, manifest, ref, wanted)
        digest = signing.policy_copy(ref, enforced, signatures, tmp / "image", chosen)
        if held is not None and digest != held[chosen]:
            raise signing.SigningError(f"{ref} refused: its {chosen} image came back as {digest}, not {held[chosen]}")
        what = f"{ref} ({chosen} of the index)" if chosen else ref
        log(f"{what}: signature accepted by {enforced if policy else 'the policy for ' + str(key)} ({digest})")
        found = []
        for suffix in attach.SUFFIXES:
            tag = attach.tag_for(digest, suffix)
            if registry_api.manifest_digest(host, repository, tag) is None:
                if require_attachments:
                    raise signing.SigningError(
                        f"{ref} refused: nothing attached as {tag}, and --require-attachments wants "
                        "the SBOM (.sbom) and the provenance (.att); push them with the image"
                    )
                log(f"{ref}: nothing attached as {tag}")
                continue
            attached = reference.Reference(image.full_name, tag)
            entry = _verified_attachment(attached, digest, enforced, signatures, tmp / tag)
            found.append(entry)
            log(f"{ref}: attachment {tag} accepted ({entry['media_type']}, {entry['size']} bytes)")
        # Nothing is written out until everything has been accepted.
        if attachments_dir is not None:
            Path(attachments_dir).mkdir(parents=True, exist_ok=True)
            for entry in found:
                blob = tmp / entry["tag"] / entry["blob_digest"].partition(":")[2]
                shutil.copyfile(blob, Path(attachments_dir) / entry["file"])
        if dest:
            signing.copy_out(tmp / "image", dest)
            log(f"{ref}: copied to {dest}")
    return {"reference": ref, "digest": digest, "index": index_digest, "platform": chosen, "attachments": found}


def _platforms_held(host: str, repository: str, ref_part: str, ref: str) -> tuple[bytes, dict[str, str] | None]:
    try:
        return registry_api.platform_manifests(host, repository, ref_part)
    except registry_api.RegistryError as e:
        raise signing.SigningError(f"cannot verify {ref}: {e}") from None


def _check_single_platform(host: str, repository: str, manifest: bytes, ref: str, wanted: str) -> None:
    """--platform on a one-image reference (its manifest): refused unless that image is for the platform."""
    config = json.loads(manifest).get("config") or {}
    built = json.loads(registry_api.get_blob(host, repository, config["digest"])) if config.get("digest") else {}
    found = f"{built.get('os')}/{built.get('architecture')}"
    if found != wanted:
        raise signing.SigningError(f"{ref} refused: it is one {found} image, not an index holding {wanted}")


def _verified_attachment(ref: reference.Reference, subject: str, policy: Path, signatures: str, folder: Path) -> dict:
    signing.policy_copy(str(ref), policy, signatures, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    named = (manifest.get("subject") or {}).get("digest")
    if named != subject or len(manifest.get("layers") or []) != 1:
        raise signing.SigningError(f"{ref} refused: it is signed but attached to {named}, not {subject}")
    (layer,) = manifest["layers"]
    return {
        "tag": ref.tag,
        "media_type": layer["mediaType"],
        "blob_digest": layer["digest"],
        "size": layer["size"],
        "file": Path((layer.get("annotations") or {}).get("org.opencontainers.image.title") or layer["digest"]).name,
    }


def verify_cosign(
    ref: str,
    key: Path,
    *,
    attachments_dir: Path | None = None,
    require_attestations: bool = False,
    platform: str | None = None,
    log=print,
) -> dict:
    """What an admission controller checks, by cosign: ref's manifest signed by key (for an index,
    the index and platform's image, default linux/amd64), then the image's SBOM (cyclonedx) and
    provenance (slsaprovenance1) attestations, each signed by key with the image as its subject.
    Raises CosignError (one line) on the first refusal, or on a missing attestation when
    require_attestations; with attachments_dir, writes each attested in-toto Statement there."""
    image = reference.Reference.split(ref)
    host, repository = image.host, image.repository
    try:
        registry_api.check(host)
    except registry_api.RegistryUnavailable as e:
        raise cosign.CosignError(f"cannot verify {ref}: {e}") from None
    try:
        manifest, held = _platforms_held(host, repository, image.tag_or_digest, ref)
    except signing.SigningError as e:
        raise cosign.CosignError(str(e)) from None
    chosen = platforms.parse(platform).name if held is not None else None
    index_digest = registry_api.sha256_digest(manifest) if held is not None else None
    if held is not None:
        if chosen not in held:
            raise cosign.CosignError(f"{ref} refused: its index holds {', '.join(held)}, not {chosen}")
        cosign.verify(host, repository, index_digest, key)
        digest = held[chosen]
    else:
        if platform:
            try:
                _check_single_platform(host, repository, manifest, ref, platforms.parse(platform).name)
            except signing.SigningError as e:
                raise cosign.CosignError(str(e)) from None
        digest = registry_api.sha256_digest(manifest)
    cosign.verify(host, repository, digest, key)
    log(f"{ref}: cosign signature by {key} accepted ({digest})")
    found = {}
    for suffix, (kind, _) in cosign.ATTESTATIONS.items():
        try:
            statement = cosign.verify_attestation(host, repository, digest, suffix, key)
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
