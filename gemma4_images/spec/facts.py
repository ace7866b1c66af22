"""The facts a build records about itself, as build args: the image's labels and
/etc/gemma4-e2b/build.json are made from them (BUILD_FACTS), the fixes and audio switches. Pure:
no Docker, nothing downloaded, so render and bake use them without the engine."""

from __future__ import annotations

import os
import subprocess
import time
from datetime import datetime, timezone

from gemma4_images.spec.matrix import ROOT, Matrix
from gemma4_images.spec.reference import Reference

# Where every image keeps the records of its build (the entrypoint's --write-build-info, the fixes
# applier's DEFAULT_MANIFEST in patches/apply_all.py, the recipe the template copies).
RECORDS = "/etc/gemma4-e2b"

# Where the build host serves wheels to a build (the audio extras, the CPU base's wheelhouse); fixed,
# so the build arg, and with it the layer cache, stays the same from run to run.
WHEELHOUSE_PORT = 38471

# One table for the image's labels and /etc/gemma4-e2b/build.json: label -> build arg. The
# Dockerfile templates render their ARG/LABEL lines from it, and each image's recipe.json carries
# it, so the entrypoint writes build.json from the same table (gemma4-serve --write-build-info).
BUILD_FACTS = {
    "org.opencontainers.image.title": "GEMMA4_TITLE",
    "org.opencontainers.image.source": "GEMMA4_SOURCE",
    "org.opencontainers.image.revision": "GEMMA4_REVISION",
    "org.opencontainers.image.version": "GEMMA4_VERSION",
    "org.opencontainers.image.created": "GEMMA4_CREATED",
    "org.opencontainers.image.base.name": "GEMMA4_BASE_NAME",
    "org.opencontainers.image.base.digest": "GEMMA4_BASE_DIGEST",
    "io.gemma4-images.target": "GEMMA4_TARGET",
    "io.gemma4-images.model": "GEMMA4_MODEL_ID",
    "io.gemma4-images.vllm-version": "GEMMA4_VLLM_VERSION",
    "io.gemma4-images.fixes": "GEMMA4_FIXES",
    "io.gemma4-images.tokenizer": "GEMMA4_BOS_COPY_OF",
}


def _git(*args: str) -> str | None:
    run = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    return run.stdout.strip() if run.returncode == 0 else None


def revision() -> str:
    sha = _git("rev-parse", "HEAD") or "unknown"
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return f"{sha}-dirty" if dirty else sha


def created() -> str:
    """SOURCE_DATE_EPOCH when set, else the commit's time: two builds of one commit agree."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH") or _git("log", "-1", "--format=%ct") or str(int(time.time()))
    return datetime.fromtimestamp(int(epoch), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def facts(matrix: Matrix, name: str, base_name: str, base_digest: str, bos_copy_of: str = "") -> dict[str, str]:
    """Build args for the Dockerfile; the image's labels and build.json are made from these."""
    tag = matrix.tag(name)
    values = {
        "GEMMA4_TITLE": (
            f"{matrix.project.model} on vLLM {matrix.project.vllm_version} ({matrix.targets[name].hardware})"
        ),
        "GEMMA4_SOURCE": matrix.project.source,
        "GEMMA4_REVISION": revision(),
        "GEMMA4_VERSION": Reference.split(tag).tag,
        "GEMMA4_CREATED": created(),
        "GEMMA4_BASE_NAME": base_name,
        "GEMMA4_BASE_DIGEST": base_digest,
        "GEMMA4_TARGET": name,
        "GEMMA4_MODEL_ID": matrix.project.model,
        "GEMMA4_VLLM_VERSION": matrix.project.vllm_version,
        "GEMMA4_FIXES": ",".join(matrix.fixes(name)),
        "GEMMA4_BOS_COPY_OF": bos_copy_of,
    }
    assert set(values) == set(BUILD_FACTS.values()), "facts() and BUILD_FACTS must name the same args"
    return values


# What GEMMA4_FIXES_PROFILE says for a target built without the fixes (empty is refused: the
# Dockerfile cannot tell it from a build arg left out).
NO_FIXES = "none"


def fix_args(matrix: Matrix, name: str) -> dict[str, str]:
    fixes = matrix.targets[name].fixes
    return {
        "GEMMA4_FIXES_PROFILE": fixes.profile if fixes else NO_FIXES,
        "GEMMA4_FIXES_OPT_IN": " ".join(fixes.opt_in) if fixes else "",
    }


def audio_args(matrix: Matrix, name: str, wheels_url: str) -> dict[str, str]:
    audio = matrix.targets[name].audio
    return {
        "GEMMA4_AUDIO_EXTRAS": " ".join(matrix.audio_extras_of(name)) if audio else "",
        "GEMMA4_WHEELS_URL": wheels_url if audio else "",
    }


def build_args(
    matrix: Matrix, name: str, base: str, base_digest: str, wheels_url, bos_copy_of: str, extra: dict | None = None
) -> dict:
    """Every build arg of a target's Dockerfile, in one order for build, --dry-run and the bake
    file: the base, the fixes, the audio extras, the label facts, then the caller's own."""
    return {
        "BASE_IMAGE": base,
        **fix_args(matrix, name),
        **audio_args(matrix, name, wheels_url),
        **facts(matrix, name, base, base_digest, bos_copy_of),
        **(extra or {}),
    }
