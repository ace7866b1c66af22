"""A registry, as `pin`, `push` and `verify` need it, by oras (Debian trixie's 1.2.0, pinned in
requirements/trixie-tools.lock and installed by scripts/setup-tools.sh): the digest of a tag,
manifests and blobs read and stored. oras speaks the distribution API, its authentication (the
logins `docker login` stored, credential helpers included) and Docker Hub's naming; this module
only says which registries are on this machine and turns oras's errors into one line."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from gemma4_images.build import tools
from gemma4_images.spec.reference import DOCKER_HUB, Reference

# Manifest types that are an index: a multi-platform tag (what `docker pull` records for the tag).
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
DOCKER_HUB_API = "registry-1.docker.io"


class RegistryError(Exception):
    """The registry could not be asked, or would not say; the message is one line."""


class RegistryUnavailable(RegistryError):
    pass


def is_loopback(host: str) -> bool:
    """A registry on this machine: localhost or a loopback address, with or without a port."""
    name = host[1:].partition("]")[0] if host.startswith("[") else host.partition(":")[0]
    try:
        return name == "localhost" or ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def scheme(host: str) -> str:
    # The daemon itself speaks plain HTTP to loopback registries (127.0.0.0/8 is insecure by
    # default); anything else is HTTPS.
    return "http" if is_loopback(host) else "https"


def api_host(host: str) -> str:
    return DOCKER_HUB_API if host == DOCKER_HUB else host


def docker_config_path() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"


def binary() -> str:
    return tools.require("oras", RegistryError)


def _oras(args: list[str], host: str, what: str, timeout: float, data: bytes | None = None) -> bytes:
    """oras's output for args against host; its error as one RegistryError line (unreachable: a
    RegistryUnavailable; a login it lacks: the `docker login` that fixes it)."""
    flags = ["--plain-http"] if scheme(host) == "http" else []  # oras assumes HTTPS but for `localhost`
    stdin = {"input": data} if data is not None else {"stdin": subprocess.DEVNULL}
    try:
        run = subprocess.run([binary(), *args, *flags], capture_output=True, timeout=timeout, **stdin)
    except subprocess.TimeoutExpired:
        raise RegistryUnavailable(f"{host}: no answer in {timeout:.0f} s — is the registry reachable?") from None
    if run.returncode == 0:
        return run.stdout
    said = " ".join(run.stderr.decode(errors="replace").split()).removeprefix("Error: ")
    if any(s in said for s in ("connection refused", "no such host", "i/o timeout", "network is unreachable")):
        raise RegistryUnavailable(f"{api_host(host)}: {said} — is the registry reachable?")
    # oras 1.2.0 says "basic credential not found" without a login, "401: Unauthorized" with a wrong one
    if re.search(r"unauthorized|\b401\b|credential not found|authentication required|denied", said, re.I):
        said += f" (log in with `docker login {host}`)"
    raise RegistryError(f"{what}: {said}")


def _not_found(error: RegistryError) -> bool:
    return str(error).endswith(": not found") or "manifest unknown" in str(error)


def check(host: str, timeout: float = 10) -> None:
    """The registry answers its API root (200, or 401 for one that wants a login), or one line:
    said before a push or a verify starts, as oras would only say it midway. oras must be here."""
    binary()
    url = f"{scheme(host)}://{api_host(host)}/v2/"
    try:
        with urllib.request.urlopen(urllib.request.Request(url), timeout=timeout):
            return
    except urllib.error.HTTPError as e:
        if e.code == 401:
            return
        raise RegistryUnavailable(
            f"{host}: {url} answered {e.code} {e.reason} — is it a Docker registry (distribution API v2)?"
        ) from None
    except (urllib.error.URLError, OSError) as e:
        text = getattr(getattr(e, "reason", e), "strerror", None) or str(getattr(e, "reason", e))
        raise RegistryUnavailable(f"{host}: {text.lower()} — is the registry running?") from None


def manifest_head(host: str, repository: str, tag: str, timeout: float = 20) -> tuple[str, str] | None:
    """(digest, media type) of repository:tag from a HEAD, which Docker Hub does not count as a
    pull (a GET of a manifest is one); None when the registry holds no such tag."""
    ref = f"{host}/{repository}:{tag}"
    try:
        descriptor = json.loads(_oras(["manifest", "fetch", "--descriptor", ref], host, ref, timeout))
    except RegistryError as e:
        if isinstance(e, RegistryUnavailable) or not _not_found(e):
            raise
        return None
    return descriptor["digest"], descriptor.get("mediaType", "")


def manifest_digest(host: str, repository: str, tag: str, timeout: float = 20) -> str | None:
    """The digest the registry holds for repository:tag; None when it holds no such tag."""
    return (manifest_head(host, repository, tag, timeout) or (None, ""))[0]


def digest_of(ref: str, timeout: float = 20) -> str | None:
    """The registry's current digest for an image reference's tag."""
    image = Reference.split(ref)
    return manifest_digest(image.host, image.repository, image.tag_or_latest, timeout)


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _at(host: str, repository: str, ref: str) -> str:
    return f"{host}/{repository}{'@' if ref.startswith('sha256:') else ':'}{ref}"


def get_manifest(host: str, repository: str, ref: str, timeout: float = 30) -> tuple[bytes, str]:
    """The manifest bytes of repository:ref (a tag, or a digest oras checks them against) and
    their media type."""
    where = _at(host, repository, ref)
    body = _oras(["manifest", "fetch", where], host, where, timeout)
    media_type = json.loads(body).get("mediaType")
    if not media_type:  # optional in an OCI manifest: the registry's Content-Type says it
        media_type = json.loads(_oras(["manifest", "fetch", "--descriptor", where], host, where, timeout))["mediaType"]
    return body, media_type


def get_blob(host: str, repository: str, digest: str, timeout: float = 60) -> bytes:
    """A blob's bytes (oras checks them against the digest)."""
    where = f"{host}/{repository}@{digest}"
    return _oras(["blob", "fetch", "--output", "-", where], host, where, timeout)


def push_blob(host: str, repository: str, data: bytes, timeout: float = 60) -> str:
    """Upload data as a blob; returns its digest."""
    with tempfile.NamedTemporaryFile(prefix="gemma4-blob-") as f:
        f.write(data)
        f.flush()
        _oras(["blob", "push", f"{host}/{repository}", f.name], host, f"{host}/{repository}: blob", timeout)
    return sha256_digest(data)


def put_manifest(host: str, repository: str, tag: str, body: bytes, media_type: str, timeout: float = 30) -> str:
    """Store body as the manifest of repository:tag; returns its digest."""
    where = f"{host}/{repository}:{tag}"
    _oras(["manifest", "push", "--media-type", media_type, where, "-"], host, where, timeout, data=body)
    return sha256_digest(body)


def platform_manifests(host: str, repository: str, ref: str) -> tuple[bytes, dict[str, str] | None]:
    """The manifest bytes at ref and, when they are an index (a multi-platform tag), {os/arch:
    manifest digest} of its entries; None for one image."""
    data, media_type = get_manifest(host, repository, ref)
    if media_type not in INDEX_TYPES:
        return data, None
    found = {}
    for entry in json.loads(data).get("manifests") or []:
        p = entry.get("platform") or {}
        found[f"{p.get('os')}/{p.get('architecture')}"] = entry["digest"]
    return data, found
