"""The single-file tools scripts/setup-tools.sh installs from Debian trixie (cosign, oras;
requirements/trixie-tools.lock pins each .deb's sha256): where they are, and the one line that
names the fix when one is not."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

TOOLS = Path(os.environ.get("GEMMA4_TOOLS_DIR", "/usr/local/lib/gemma4-images/bin"))


def find(name: str) -> str | None:
    """The pinned tool in the setup script's folder, else one on PATH (a host's own; the code relies
    on the pinned releases' flags and messages); None when neither has it."""
    return str(TOOLS / name) if (TOOLS / name).is_file() else shutil.which(name)


def require(name: str, error: type[Exception]) -> str:
    """find(name), else error with the one line naming the setup command."""
    found = find(name)
    if found is None:
        raise error(missing(name))
    return found


def missing(name: str) -> str:
    return (
        f"{name} is not installed: run scripts/setup-tools.sh (Debian trixie's {name}, requirements/trixie-tools.lock)"
    )
