"""The registry's HTTP API (distribution API v2), as `pin` and `push` need it: find the registry's
digest for a tag, authenticate the way registries ask to, move blobs and manifests."""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from gemma4_images.spec.reference import DOCKER_HUB, Reference

# What a HEAD on a tag may answer with: the daemon pushes Docker v2 manifests, other tools OCI;
# multi-platform tags are indexes (their digest is what `docker pull` records for the tag).
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
MANIFEST_TYPES = ", ".join(
    [
        *INDEX_TYPES,
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)
DOCKER_HUB_API = "registry-1.docker.io"
DOCKER_HUB_AUTH_KEY = "https://index.docker.io/v1/"  # the key `docker login` writes for Docker Hub


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


def reason(error: Exception) -> str:
    cause = getattr(error, "reason", error)
    text = getattr(cause, "strerror", None) or str(cause)
    return text.lower().removeprefix("[errno 111] ")


def docker_config_path() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"


def credentials(host: str) -> str | None:
    """'user:password' that `docker login HOST` stored in the Docker config file, if any (credential
    helpers are not asked: their secrets stay where they are)."""
    path = docker_config_path()
    try:
        auths = json.loads(path.read_text()).get("auths") or {}
    except (OSError, ValueError):
        return None
    entry = auths.get(DOCKER_HUB_AUTH_KEY if host == DOCKER_HUB else host) or {}
    try:
        return base64.b64decode(entry["auth"]).decode() if entry.get("auth") else None
    except (ValueError, UnicodeDecodeError):
        return None


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    kind, _, params = header.strip().partition(" ")
    return kind.lower(), dict(re.findall(r'(\w+)="([^"]*)"', params))


def _authorization(host: str, challenge: str, scope: str, timeout: float) -> str | None:
    """The Authorization header answering a 401's WWW-Authenticate: Basic with the stored login,
    or a Bearer token from the realm it names (anonymous when there is no login)."""
    kind, params = _challenge(challenge)
    login = credentials(host)
    basic = "Basic " + base64.b64encode(login.encode()).decode() if login else None
    if kind == "basic":
        return basic
    if kind != "bearer" or "realm" not in params:
        return None
    query = {k: v for k, v in (("service", params.get("service")), ("scope", params.get("scope") or scope)) if v}
    req = urllib.request.Request(params["realm"] + "?" + urllib.parse.urlencode(query))
    if basic:
        req.add_header("Authorization", basic)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = json.load(r)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise RegistryError(f"{host}: the token service {params['realm']} refused: {reason(e)}") from None
    token = body.get("token") or body.get("access_token")
    return f"Bearer {token}" if token else None


def _request(
    host: str,
    path: str,
    method: str,
    scope: str,
    timeout: float,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
):
    """urlopen of the registry's API path (or the absolute URL an upload's Location names),
    answering one authentication challenge if it asks."""
    url = path if path.startswith(("http://", "https://")) else f"{scheme(host)}://{api_host(host)}{path}"
    headers = {"Accept": MANIFEST_TYPES, **(headers or {})}
    for attempt in range(2):
        try:
            request = urllib.request.Request(url, data=data, method=method, headers=headers)
            return urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as e:
            challenge = e.headers.get("WWW-Authenticate")
            if e.code != 401 or attempt or not challenge:
                raise
            auth = _authorization(host, challenge, scope, timeout)
            if auth is None:
                raise
            headers["Authorization"] = auth
    raise AssertionError("not reached")


def check(host: str, timeout: float = 10) -> None:
    """The registry answers its API root (200, or 401 for one that wants a login), or one line."""
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
        raise RegistryUnavailable(f"{host}: {reason(e)} — is the registry running?") from None


def manifest_digest(host: str, repository: str, tag: str, timeout: float = 20) -> str | None:
    """The digest the registry holds for repository:tag; None when it holds no such tag."""
    return (manifest_head(host, repository, tag, timeout) or (None, ""))[0]


def manifest_head(host: str, repository: str, tag: str, timeout: float = 20) -> tuple[str, str] | None:
    """(digest, media type) of repository:tag from a HEAD, which Docker Hub does not count as a
    pull (a GET of a manifest is one); None when the registry holds no such tag."""
    try:
        with _request(host, f"/v2/{repository}/manifests/{tag}", "HEAD", f"repository:{repository}:pull", timeout) as r:
            digest, media_type = r.headers.get("Docker-Content-Digest"), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise RegistryError(
            f"{host}/{repository}:{tag}: the registry answered {e.code} {e.reason}"
            + (" (log in with `docker login " + host + "`)" if e.code in (401, 403) else "")
        ) from None
    except (urllib.error.URLError, OSError) as e:
        raise RegistryUnavailable(f"{api_host(host)}: {reason(e)} — is the registry reachable?") from None
    if not digest:
        raise RegistryError(f"{host}/{repository}:{tag}: the registry sent no Docker-Content-Digest")
    return digest, media_type


def digest_of(ref: str, timeout: float = 20) -> str | None:
    """The registry's current digest for an image reference's tag."""
    image = Reference.split(ref)
    return manifest_digest(image.host, image.repository, image.tag_or_latest, timeout)


# -- writing: what `push` needs to store an index, and the tests to tamper with a registry (distribution API v2 spec,
# github.com/distribution/distribution docs/spec/api.md: "Pushing An Image", monolithic upload) --


def _call(host: str, repository: str, path: str, method: str, what: str, timeout: float, **kw):
    """_request for repository (push scope unless it only reads), its errors as one RegistryError line."""
    scope = f"repository:{repository}:" + ("pull" if method in ("GET", "HEAD") else "pull,push")
    try:
        return _request(host, path, method, scope, timeout, **kw)
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace").strip()[:200]
        raise RegistryError(f"{host}/{repository}: {what} answered {e.code} {e.reason} {detail}".rstrip()) from None
    except (urllib.error.URLError, OSError) as e:
        raise RegistryUnavailable(f"{api_host(host)}: {reason(e)} — is the registry reachable?") from None


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def push_blob(host: str, repository: str, data: bytes, timeout: float = 60) -> str:
    """Upload data as a blob (skipped when the registry already has it); returns its digest."""
    digest = sha256_digest(data)
    try:
        with _request(host, f"/v2/{repository}/blobs/{digest}", "HEAD", f"repository:{repository}:pull", timeout):
            return digest
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise RegistryError(f"{host}/{repository}: checking blob {digest} answered {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise RegistryUnavailable(f"{api_host(host)}: {reason(e)} — is the registry reachable?") from None
    with _call(host, repository, f"/v2/{repository}/blobs/uploads/", "POST", "starting an upload", timeout) as r:
        location = urllib.parse.urljoin(f"{scheme(host)}://{api_host(host)}/", r.headers["Location"])
    url = location + ("&" if "?" in location else "?") + urllib.parse.urlencode({"digest": digest})
    headers = {"Content-Type": "application/octet-stream"}
    with _call(host, repository, url, "PUT", f"uploading blob {digest}", timeout, data=data, headers=headers):
        return digest


def put_manifest(host: str, repository: str, tag: str, body: bytes, media_type: str, timeout: float = 30) -> str:
    """Store body as the manifest of repository:tag; returns the digest the registry gives it."""
    headers = {"Content-Type": media_type}
    path = f"/v2/{repository}/manifests/{tag}"
    with _call(host, repository, path, "PUT", f"storing manifest {tag}", timeout, data=body, headers=headers) as r:
        digest = r.headers.get("Docker-Content-Digest") or sha256_digest(body)
    if digest != sha256_digest(body):
        raise RegistryError(f"{host}/{repository}:{tag}: the registry stored {digest}, not the manifest sent")
    return digest


def get_manifest(host: str, repository: str, ref: str, timeout: float = 30) -> tuple[bytes, str]:
    """The manifest bytes of repository:ref (a tag or digest) and their media type."""
    with _call(host, repository, f"/v2/{repository}/manifests/{ref}", "GET", f"manifest {ref}", timeout) as r:
        return r.read(), r.headers.get("Content-Type", "")


def get_blob(host: str, repository: str, digest: str, timeout: float = 60) -> bytes:
    """A blob's bytes, checked against its digest."""
    with _call(host, repository, f"/v2/{repository}/blobs/{digest}", "GET", f"blob {digest}", timeout) as r:
        data = r.read()
    if sha256_digest(data) != digest:
        raise RegistryError(f"{host}/{repository}: blob {digest} came back with other bytes")
    return data


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
