"""The platforms an image can be built for (OCI `os/architecture`), and what each one is called by
the tools that meet it: Debian (mmdebstrap --arch), pip/uv wheel tags, the kernel (binfmt_misc)
and this project's local tags. Pure: no Docker, no host checks (build/emulation.py does those)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Platform:
    name: str  # what `docker build --platform` and an OCI image index say: linux/arm64
    machine: str  # uname -m and the wheel tags' architecture: aarch64
    debian: str  # Debian's architecture name: arm64
    # Appended to a target's local tag for this platform. A Docker 20.10 engine keeps one image per
    # tag, so the platforms of one target sit side by side under their own tags here; a registry
    # joins them into one index under the plain tag (`push`).
    tag_suffix: str
    variant: str = ""  # the OCI variant: arm64's is v8, the only 64-bit Arm one (OCI image-index.md)

    @property
    def os(self) -> str:
        return self.name.split("/")[0]

    @property
    def architecture(self) -> str:
        return self.name.split("/")[1]

    @property
    def oci(self) -> dict[str, str]:
        """As an image config and an index entry say it: os, architecture and any variant."""
        return {"architecture": self.architecture, "os": self.os, **({"variant": self.variant} if self.variant else {})}

    @property
    def option(self) -> str:
        """The `--platform` a command line needs for it: none for the default platform."""
        return "" if self.name == DEFAULT else f" --platform {self.name}"


DEFAULT = "linux/amd64"  # every target's `base` is its linux/amd64 base; `base.platforms` adds others
KNOWN = {
    p.name: p
    for p in (
        Platform("linux/amd64", "x86_64", "amd64", ""),
        Platform("linux/arm64", "aarch64", "arm64", "-arm64", "v8"),
    )
}


class PlatformError(Exception):
    pass


def parse(name: str | None) -> Platform:
    """The platform called name (None: the default), or one line listing the known ones (an empty
    name too: `--platform ''` is a mistake, not a request for the default)."""
    name = DEFAULT if name is None else name
    # What Docker also accepts: a name with its variant, and the kernel's machine names.
    aliases = {f"{p.name}/{p.variant}": p.name for p in KNOWN.values() if p.variant}
    aliases |= {f"{p.os}/{p.machine}": p.name for p in KNOWN.values()}
    name = aliases.get(name, name)
    if name not in KNOWN:
        raise PlatformError(f"unknown platform {name!r}; known platforms: {', '.join(KNOWN)}")
    return KNOWN[name]
