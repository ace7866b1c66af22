"""Image references: `Reference`, the one parser of them here (the distribution project's
grammar, read as Docker reads it), and the registry part push takes."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

DOCKER_HUB = "docker.io"
LATEST = "latest"  # the tag Docker assumes when a reference names none


# The distribution project's reference grammar (github.com/distribution/reference, reference.go),
# with Docker's reading of the first part as a host only when it has a "." or ":" or is localhost.
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_HOST = re.compile(
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
    r"|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
)
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"[a-z0-9]+(?:[+._-][a-z0-9]+)*:[0-9a-fA-F]{32,}")
REFERENCE_RULE = (
    "[HOST[:PORT]/]NAME[:TAG][@sha256:DIGEST], the name in lowercase letters, digits and "
    "the separators . _ __ -, a tag of at most 128 letters, digits, _ . -"
)


class BadReference(ValueError):
    """An image reference the engine would refuse; the message names it and the rule."""


def _is_host(part: str) -> bool:
    return "." in part or ":" in part or part == "localhost"


def _host_and_path(name: str) -> tuple[str | None, str]:
    """(host, path) of NAME as written. The first part is a host only when more follows it and it
    looks like one (Docker's reading: `team/img` is Docker Hub's, `registry.io/img` another's)."""
    head, _, rest = name.partition("/")
    return (head, rest) if rest and _is_host(head) else (None, name)


def _valid_name(name: str) -> bool:
    host, path = _host_and_path(name)
    return (
        (host is None or _HOST.fullmatch(host) is not None)
        and len(name) <= 255
        and all(_COMPONENT.fullmatch(p) for p in path.split("/"))
    )


def _split(ref: str) -> tuple[str, str | None, str | None]:
    """(name, tag, digest) as written, tag and digest None when absent: parse must tell `img:`
    and `img@` (a separator with nothing after it, refused) from `img`. A ':' is a tag's only in
    the last path part; before it, it is a host's port."""
    name, at, digest = ref.partition("@")
    if ":" not in name.rsplit("/", 1)[-1]:
        return name, None, digest if at else None
    name, _, tag = name.rpartition(":")
    return name, tag, digest if at else None


@dataclass(frozen=True)
class Reference:
    """An image reference, `[HOST[:PORT]/]PATH[:TAG][@DIGEST]`, in the parts it was written in
    (str() gives it back exactly); host and repository apply Docker's defaults."""

    name: str  # [HOST[:PORT]/]PATH as written, without tag or digest
    tag: str = ""  # "" when it names none
    digest: str = ""  # "sha256:<hex>", or "" when it names none

    @classmethod
    def parse(cls, ref: str, what: str = "reference") -> Reference:
        """ref read, or BadReference naming `what` (the option it came from) and the rule it breaks:
        for references a user gives, checked before the engine answers with a traceback."""
        name, tag, digest = _split(ref or "")
        ok = (
            _valid_name(name)
            and (tag is None or _TAG.fullmatch(tag) is not None)
            and (digest is None or _DIGEST.fullmatch(digest) is not None)
        )
        if not ok:
            raise BadReference(f"{what} {ref!r} is not a valid image reference: expected {REFERENCE_RULE}")
        return cls(name, tag or "", digest or "")

    @classmethod
    def split(cls, ref: str) -> Reference:
        """ref read as parse reads it, unchecked: for references this program composed, or that the
        engine, a label or a file already holds (refusing those is not ours to do)."""
        name, tag, digest = _split(ref)
        return cls(name, tag or "", digest or "")

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")

    @property
    def host(self) -> str:
        """The registry it is pulled from: Docker Hub when it names no host."""
        return _host_and_path(self.name)[0] or DOCKER_HUB

    @property
    def repository(self) -> str:
        """Its path in that registry: a one-part Docker Hub name is library/NAME."""
        host, path = _host_and_path(self.name)
        return f"library/{path}" if host is None and "/" not in path else path

    @property
    def full_name(self) -> str:
        """HOST/REPOSITORY, the defaults spelled out (what a signature's identity names)."""
        return f"{self.host}/{self.repository}"

    @property
    def basename(self) -> str:
        """The last part of its path (what a purl or a model folder names the image by)."""
        return self.name.rsplit("/", 1)[-1]

    @property
    def tag_or_latest(self) -> str:
        return self.tag or LATEST

    @property
    def tag_or_digest(self) -> str:
        """What a pull or the registry's /v2/REPOSITORY/manifests/<reference> fetches for it: the
        digest when it pins one (the tag is then only a label), else its tag, else latest."""
        return self.digest or self.tag_or_latest

    def with_digest(self, digest: str) -> Reference:
        return replace(self, digest=digest)


def recorded_digest(repo_digests: list[str], name: str) -> str | None:
    """The digest the engine's RepoDigests (`NAME@DIGEST` entries) records for repository name."""
    for entry in repo_digests:
        ref = Reference.split(entry)
        if ref.name == name:
            return ref.digest
    return None


def check_registry_spec(spec: str, what: str = "--registry") -> str:
    """'HOST[:PORT][/NAMESPACE]' as push takes it, or BadReference."""
    parts = spec.strip().rstrip("/").split("/")
    if not (_is_host(parts[0]) and _HOST.fullmatch(parts[0]) and all(_COMPONENT.fullmatch(p) for p in parts[1:])):
        raise BadReference(
            f"{what} {spec!r} is not a valid registry: expected HOST[:PORT][/NAMESPACE], the "
            "namespace in lowercase letters, digits and the separators . _ __ - "
            "(e.g. 127.0.0.1:5000/ml)"
        )
    return spec
