"""Sign pushed images and check them before use, with skopeo's GPG "simple signing" (Debian's
skopeo; containers-signature(5), containers-policy.json(5), containers-registries.d(5)).

A signature is a GPG-signed claim "this manifest digest is HOST/REPO:TAG". The registry does not
store it: it goes to a *lookaside* store, a directory laid out as <repo path>@sha256=<hex>/signature-N
(containers/image docs/signature-protocols.md: a file:/// store "can be both read and written",
http/https "only supports reading", the same hierarchy either way, so a static web server can
serve what signing wrote) that a pipeline serves over HTTP or copies beside the image. Checking is skopeo's own: a
policy.json whose `signedBy` requirement names the public key, so `skopeo copy` (and podman,
CRI-O, which read the same policy) refuse an image with no valid signature for that reference.

Keys are never written anywhere by this module: signing uses the key already in the GnuPG home
(GNUPGHOME, or ~/.gnupg) through gpg-agent; verifying needs only the public key file.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from gemma4_images.build import registry as registry_api
from gemma4_images.spec import platforms, reference

REGISTRIES_D_FILE = "gemma4-images.yaml"


class SigningError(Exception):
    """Signing or verifying could not be done, or the image was refused; one line saying why."""


def skopeo() -> str:
    exe = shutil.which("skopeo")
    if exe is None:
        raise SigningError("skopeo is not installed: `apt-get install skopeo` (scripts/setup-host.sh)")
    return exe


def lookaside_url(where: str) -> str:
    """A lookaside location as registries.d wants it: an http(s)/file URL, or a local directory."""
    if re.match(r"(https?|file)://", where):
        return where
    return Path(where).resolve().as_uri()


def write_registries_d(folder: Path, host: str, lookaside: str, staging: bool) -> Path:
    """A registries.d folder telling skopeo where host's signatures are (and, to sign, where to
    write them: lookaside-staging, a local directory)."""
    folder.mkdir(parents=True, exist_ok=True)
    entry = {"lookaside": lookaside_url(lookaside)}
    if staging:
        entry["lookaside-staging"] = lookaside_url(lookaside)
    # YAML is a superset of JSON, so JSON keeps the host (with its ':port') quoted and unambiguous.
    (folder / REGISTRIES_D_FILE).write_text(json.dumps({"docker": {host: entry}}, indent=2) + "\n")
    return folder


def policy_requiring(repository: str, key_path: Path) -> dict:
    """containers-policy.json: repository's images must carry a signature by the key in key_path
    for the reference they are pulled by (matchRepoDigestOrExact, the default); everything else
    is rejected."""
    return {
        "default": [{"type": "reject"}],
        "transports": {
            "docker": {
                repository: [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": str(Path(key_path).resolve())}]
            }
        },
    }


def _tls(host: str, flag: str) -> list[str]:
    # Loopback registries speak plain HTTP, as the engine assumes (registry.scheme).
    return [f"--{flag}-tls-verify=false"] if registry_api.scheme(host) == "http" else []


def _authfile() -> list[str]:
    # `docker login` stores logins in the Docker config; skopeo reads that format with --authfile.
    path = registry_api.docker_config_path()
    return ["--authfile", str(path)] if path.is_file() else []


def _run(args: list[str], what: str) -> subprocess.CompletedProcess:
    run = subprocess.run([skopeo(), *args], capture_output=True, text=True, env=os.environ.copy())
    if run.returncode != 0:
        raise SigningError(f"{what}: {skopeo_message(run.stderr)}")
    return run


def skopeo_message(stderr: str) -> str:
    """skopeo's fatal line, without the log framing or the gpgme structure it dumps."""
    found = re.findall(r'level=fatal msg="((?:[^"\\]|\\.)*)"', stderr)
    message = found[-1].replace('\\"', '"') if found else (stderr.strip().splitlines() or ["no output"])[-1]
    gpgme_struct = r"gpgme\.Signature\{(?:[^{}]|\{[^{}]*\})*\}"  # one level of nested {…}
    return re.sub(gpgme_struct, "the signature does not verify with that key", message)


# -- signing ---------------------------------------------------------------------------------


def fingerprint(key: str) -> str:
    """The full fingerprint of a secret key GnuPG holds for key (an id, fingerprint or e-mail)."""
    home = os.environ.get("GNUPGHOME") or "~/.gnupg"
    try:
        run = subprocess.run(
            ["gpg", "--batch", "--with-colons", "--list-secret-keys", "--", key], capture_output=True, text=True
        )
    except FileNotFoundError:
        raise SigningError("gpg is not installed: `apt-get install gnupg` (scripts/setup-host.sh)") from None
    prints = [line.split(":")[9] for line in run.stdout.splitlines() if line.startswith("fpr:")]
    if run.returncode != 0 or not prints:
        raise SigningError(
            f"--sign-by {key}: GnuPG has no secret key for it in {home}; import the signing key there "
            "(or set GNUPGHOME to the home that holds it)"
        )
    return prints[0]


def _signature_dir(signatures: Path, repository: str, digest: str) -> Path:
    algorithm, _, hex_digest = digest.partition(":")
    return Path(signatures) / f"{repository}@{algorithm}={hex_digest}"


def _verifying_signature(manifest: bytes, identity: str, key_fpr: str, folder: Path) -> Path | None:
    found = sorted(folder.glob("signature-*"), key=lambda p: int(p.name.rpartition("-")[2] or 0))
    with tempfile.NamedTemporaryFile() as f:
        f.write(manifest)
        f.flush()
        for sig in found:
            check = [skopeo(), "standalone-verify", f.name, identity, key_fpr, str(sig)]
            if subprocess.run(check, capture_output=True).returncode == 0:
                return sig
    return None


def signed_already(host: str, repository: str, tag: str, digest: str, key_fpr: str, signatures: Path) -> Path | None:
    """A signature in the lookaside that already says digest is host/repository:tag by key_fpr
    (for an index, each platform's manifest must carry one too: a pull by the tag checks both)."""
    identity = f"{host}/{repository}:{tag}"
    manifest, instances = registry_api.platform_manifests(host, repository, digest)
    top = _verifying_signature(manifest, identity, key_fpr, _signature_dir(signatures, repository, digest))
    if top is None:
        return None
    for instance in (instances or {}).values():
        body, _ = registry_api.get_manifest(host, repository, instance)
        if _verifying_signature(body, identity, key_fpr, _signature_dir(signatures, repository, instance)) is None:
            return None
    return top


def sign(
    host: str,
    repository: str,
    tag: str,
    digest: str,
    key_fpr: str,
    signatures: Path,
    passphrase_file: str | None = None,
) -> tuple[dict, bool]:
    """Sign host/repository:tag (which must hold digest) into the lookaside directory signatures;
    returns what pushed.json records and whether it is new (a signature already there for this
    tag and key is kept, not made again)."""
    identity = f"{host}/{repository}:{tag}"
    existing = signed_already(host, repository, tag, digest, key_fpr, signatures)
    fresh = existing is None
    if fresh:
        with tempfile.TemporaryDirectory() as tmp:
            conf = write_registries_d(Path(tmp), host, str(signatures), staging=True)
            # The copy re-stores the same manifest under the tag (no blob moves: the registry has
            # them) and writes the signature; no policy applies to reading our own push. --all
            # keeps an index an index (else skopeo copies the host's platform only) and signs
            # each platform's manifest with it (skopeo 1.9; measured in test_multiplatform_push).
            _run(
                ["--insecure-policy", "--registries.d", str(conf), "copy", "--all", "--quiet", *_authfile()]
                + _tls(host, "src")
                + _tls(host, "dest")
                + ["--sign-by", key_fpr]
                + (["--sign-passphrase-file", passphrase_file] if passphrase_file else [])
                + [f"docker://{host}/{repository}@{digest}", f"docker://{identity}"],
                f"signing {identity}",
            )
        now = registry_api.manifest_digest(host, repository, tag)
        if now != digest:
            raise SigningError(f"signing {identity}: the tag now holds {now}, not the signed {digest}")
        existing = signed_already(host, repository, tag, digest, key_fpr, signatures)
        if existing is None:
            raise SigningError(f"signing {identity}: skopeo wrote no signature that verifies under {signatures}")
    return {"identity": identity, "key": key_fpr, "signature": str(existing)}, fresh


# -- verifying -------------------------------------------------------------------------------


def policy_copy(ref: str, policy: Path, lookaside: str, folder: Path, platform: str | None = None) -> str:
    """skopeo copy ref into folder (a dir: layout) under policy, its signatures read from
    lookaside; returns the digest of the manifest it checked (for an index, platform's: the
    policy then holds for the index and that manifest both). SigningError with skopeo's reason
    when the policy refuses the image (folder is then left empty)."""
    host = reference.Reference.split(ref).host
    chosen = []
    if platform:
        wanted = platforms.parse(platform).oci
        chosen = ["--override-os", wanted["os"], "--override-arch", wanted["architecture"]]
        chosen += ["--override-variant", wanted["variant"]] if "variant" in wanted else []
    with tempfile.TemporaryDirectory() as tmp:
        conf = write_registries_d(Path(tmp), host, lookaside, staging=False)
        try:
            _run(
                ["--policy", str(policy), "--registries.d", str(conf), *chosen, "copy", "--quiet", *_authfile()]
                + _tls(host, "src")
                + [f"docker://{ref}", f"dir:{folder}"],
                f"{ref} refused",
            )
        except SigningError:
            shutil.rmtree(folder, ignore_errors=True)
            raise
    return registry_api.sha256_digest((folder / "manifest.json").read_bytes())


def copy_out(folder: Path, dest: str) -> None:
    """Copy a checked dir: layout on to dest (any skopeo transport: docker-daemon:, oci:, docker://)."""
    tls = (
        _tls(reference.Reference.split(dest.removeprefix("docker://")).host, "dest")
        if dest.startswith("docker://")
        else []
    )
    _run(
        ["--insecure-policy", "copy", "--quiet", "--remove-signatures", *_authfile(), *tls, f"dir:{folder}", dest],
        f"copying to {dest}",
    )


# -- an index's own signature ---------------------------------------------------------------
# skopeo 1.9 checks the policy against the platform's manifest it copies out of an index, not
# against the index (measured: an index re-pointed without the key, its arm64 entry named
# linux/amd64, hands the amd64 pipeline the signed arm64 image; test_multiplatform_push.py). The
# index says which image is which platform, so `verify` checks its signature itself, with the keys
# the policy requires for the reference.


def required_keys(policy: dict, ref: str, folder: Path) -> list[Path]:
    """The GPG key files policy's signedBy requirements name for ref (containers-policy.json(5):
    the most specific scope of transports.docker wins: the reference itself, its repository, each
    namespace above it, the host; then the transport's "" entry, then "default"). keyData is
    written into folder. [] when the requirements that apply ask for no GPG signature."""
    image = reference.Reference.split(ref)
    scopes = [str(reference.Reference(image.full_name, image.tag, image.digest)), image.full_name]
    parts = image.full_name.split("/")
    scopes += ["/".join(parts[:n]) for n in range(len(parts) - 1, 0, -1)]
    docker = (policy.get("transports") or {}).get("docker") or {}
    found = next((docker[s] for s in scopes + [""] if s in docker), policy.get("default") or [])
    keys = []
    for n, req in enumerate(r for r in found if r.get("type") == "signedBy" and r.get("keyType") == "GPGKeys"):
        keys += [Path(p) for p in ([req["keyPath"]] if req.get("keyPath") else []) + list(req.get("keyPaths") or [])]
        if req.get("keyData"):
            path = folder / f"policy-key-{n}.asc"
            path.write_bytes(base64.b64decode(req["keyData"]))
            keys.append(path)
    return keys


def _lookaside_signatures(lookaside: str, repository: str, digest: str) -> list[bytes]:
    """signature-1, -2, … of digest in the lookaside store (a directory, file:// or http(s)://)."""
    algorithm, _, hex_digest = digest.partition(":")
    where = f"{repository}@{algorithm}={hex_digest}"
    found = []
    for n in range(1, 1000):
        url = lookaside_url(lookaside).rstrip("/") + f"/{where}/signature-{n}"
        try:
            if url.startswith("file://"):
                found.append(Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)).read_bytes())
            else:
                with urllib.request.urlopen(url, timeout=30) as r:
                    found.append(r.read())
        except (OSError, urllib.error.URLError):
            break
    return found


def check_index_signature(ref: str, digest: str, manifest: bytes, policy: Path, lookaside: str) -> None:
    """SigningError unless a signature in lookaside says the index digest is ref (a tag: exactly
    that reference; a digest: any tag of its repository) by a key the policy requires for ref.
    Nothing to check when the policy requires no GPG signature for ref."""
    image = reference.Reference.split(ref)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "gnupg"
        home.mkdir(mode=0o700)
        keys = required_keys(json.loads(Path(policy).read_text()), ref, Path(tmp))
        if not keys:
            return
        env = {**os.environ, "GNUPGHOME": str(home)}
        for key in keys:
            subprocess.run(["gpg", "--batch", "--import", str(key)], env=env, capture_output=True)
        listed = subprocess.run(
            ["gpg", "--batch", "--with-colons", "--list-keys"], env=env, capture_output=True, text=True
        )
        prints = [line.split(":")[9] for line in listed.stdout.splitlines() if line.startswith("fpr:")]
        (Path(tmp) / "manifest").write_bytes(manifest)
        for n, signature in enumerate(_lookaside_signatures(lookaside, image.repository, digest)):
            sig = Path(tmp) / f"signature-{n}"
            sig.write_bytes(signature)
            # The identity the signature claims (read, then checked by standalone-verify with the key).
            payload = subprocess.run(["gpg", "--batch", "--decrypt", str(sig)], env=env, capture_output=True)
            try:
                claimed = json.loads(payload.stdout)["critical"]["identity"]["docker-reference"]
            except (ValueError, KeyError, TypeError):
                continue
            # matchRepoDigestOrExact, as skopeo applies it to the platform's image: a reference
            # by digest accepts any tag of the repository, a tag only itself.
            named = reference.Reference.split(claimed)
            if named.full_name != image.full_name or (not image.digest and named.tag != image.tag_or_latest):
                continue
            for fpr in prints:
                check = [skopeo(), "standalone-verify", str(Path(tmp) / "manifest"), claimed, fpr, str(sig)]
                if subprocess.run(check, env=env, capture_output=True).returncode == 0:
                    return
    raise SigningError(
        f"{ref} refused: its index {digest} carries no signature for {ref} by the policy's key, so which "
        "image is which platform is not vouched for"
    )
