"""The stand-ins benchmark (`build.py bench --standins`): for each stand-in targets.yaml lists, its
wheels (count, bytes), a no-cache build of it from its wheelhouse and root filesystem (the install
is nearly all of it), its size, and a no-cache build of one of its targets' images on it. Ratios are
against the CPU stand-in measured in the same run. Each is built under a throwaway tag and removed,
so the stand-ins and images the tests use keep their ids (and the layer cache on them)."""

from __future__ import annotations

import shutil
import subprocess
import time

from gemma4_images.build import images, localbase
from gemma4_images.build.docker_build import local_image
from gemma4_images.build.wheels import lock_entries
from gemma4_images.spec import platforms

BASELINE = localbase.CPU_STANDIN


def _bench_tag(name: str) -> str:
    return f"gemma4-e2b-test/bench-{name}:nocache"


def measure_one(client, m, key: str, tokenizer: str, log) -> dict:
    standin = m.standins[key]
    wheels = [p for p in localbase.standin_wheelhouse(standin).iterdir() if p.suffix == ".whl"]
    target = m.standin_targets(key)[0]
    platform = None if standin.platform == platforms.DEFAULT else standin.platform
    base_tag, image_tag = _bench_tag(key), _bench_tag(target)
    try:
        t = time.monotonic()
        localbase.standin_base(client, m, key, log, tag=base_tag, nocache=True)
        base_s = time.monotonic() - t
        t = time.monotonic()
        images.build_target(
            client,
            m,
            target,
            base_override=base_tag,
            tag=image_tag,
            nocache=True,
            tokenizer_source=tokenizer,
            log=log,
            platform=platform,
        )
        image_s = time.monotonic() - t
        base_bytes = client.images.get(base_tag).attrs["Size"]
        image_bytes = client.images.get(image_tag).attrs["Size"]
    finally:
        for tag in (image_tag, base_tag):
            if local_image(client, tag) is not None:
                client.images.remove(tag, force=True)
    return {
        "standin": key,
        "stands_for": standin.stands_for,
        "python": standin.python,
        "pins": len(lock_entries(standin.lock_path.read_text())),
        "wheels": len(wheels),
        "wheel_bytes": sum(p.stat().st_size for p in wheels),
        "base_s": base_s,
        "base_bytes": base_bytes,
        "target": target,
        "image_s": image_s,
        "image_bytes": image_bytes,
    }


def measure(client, m, log, tokenizer: str) -> dict:
    """tokenizer: the tokenizer copy each image bakes (the tiny model's, as every build here)."""
    keys = [BASELINE, *(k for k in m.standins if k != BASELINE)]
    rows = [measure_one(client, m, key, tokenizer, log) for key in keys]
    if shutil.which("docker"):
        # The no-cache builds' layers stay in BuildKit's cache (tens of GB) until pruned; the
        # stand-ins the tests use are images, which a prune keeps.
        subprocess.run(["docker", "builder", "prune", "-f"], capture_output=True)
    return {"rows": rows}


def section(result: dict) -> list[str]:
    rows = result["rows"]
    base = rows[0]
    gb = lambda b: f"{b / 1e9:.2f} GB"  # noqa: E731
    lines = [
        "## Stand-in bases",
        "",
        "Each stand-in (targets.yaml `standins`) built with no cache from its wheelhouse (already on the "
        "machine: download time not included) and the cached Debian root filesystem, then one of its "
        f"targets' images built on it with no cache, for the stand-in's platform (another one's under qemu "
        "emulation: those times say nothing of a native host). Ratios are against "
        f"`{base['standin']}` in the same run.",
        "",
        "| stand-in | for | Python | wheels | wheel bytes | base build | vs cpu | base size | vs cpu "
        "| image build (target) | vs cpu | image size |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| `{r['standin']}` | `{r['stands_for']}` | {r['python']} | {r['wheels']} | {gb(r['wheel_bytes'])} "
            f"| {r['base_s']:.0f} s | {r['base_s'] / base['base_s']:.2f}x | {gb(r['base_bytes'])} "
            f"| {r['base_bytes'] / base['base_bytes']:.2f}x | {r['image_s']:.0f} s ({r['target']}) "
            f"| {r['image_s'] / base['image_s']:.2f}x | {gb(r['image_bytes'])} |"
        )
    return [*lines, ""]
