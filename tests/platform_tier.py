"""When CI runs the linux/arm64 tier (tests/integration/test_arm64.py, minutes under qemu): when
what it proves has changed since it last passed (tests/tier.py). INPUTS are the files the arm64
build and serve path depends on beyond what every CI run proves on linux/amd64, and the platform
parts of targets.yaml; RECORD (committed) holds their digest as of the last pass, with its figures.

    python -m tests.platform_tier --current | --record | --clean
"""

from __future__ import annotations

import json
import sys

from tests.tier import ROOT, Tier

INPUTS = [
    "requirements/arm64",
    # Whole folders: what their Dockerfiles COPY in (the CPU stand-in's sbgemm check) counts too.
    "bases/vllm-cpu-local",
    "bases/vllm-cuda-local",
    "gemma4_images/spec/platforms.py",
    "gemma4_images/build/emulation.py",
    "gemma4_images/build/localbase.py",
    "gemma4_images/build/wheels.py",
    "scripts/setup-emulation.sh",
    "tests/integration/test_arm64.py",
]


def platform_facts() -> dict:
    """targets.yaml's platform parts: every target's other platforms and the stand-ins for them."""
    from gemma4_images.spec import matrix, platforms

    m = matrix.load()
    return {
        "targets": {n: {p: b.model_dump() for p, b in t.base.platforms.items()} for n, t in m.targets.items()},
        "standins": {k: s.model_dump() for k, s in m.standins.items() if s.platform != platforms.DEFAULT},
    }


def show_figures(data: dict) -> None:
    """BENCHMARKS.md's arm64 section shows the figures; the rest of the page is kept as it was."""
    if not data["figures"]:
        return
    from gemma4_images.bench import figures, report

    results = json.loads(figures.RESULTS.read_text())
    results["arm64"] = data
    figures.RESULTS.write_text(json.dumps(results, indent=2, default=str) + "\n")
    figures.OUT.write_text(report.render_results(results))


def remove_arm64_images() -> list[str]:
    """The tier's arm64 images (its stand-in bases, images and indexes: ~15 GB here): the tier runs
    only when its inputs changed, and a fresh CI machine's disk does not hold them beside the rest."""
    import docker

    client, gone = docker.from_env(), []
    for image in client.images.list():
        tags = [t for t in image.tags if t.startswith("gemma4-e2b")]
        if tags and image.attrs.get("Architecture") == "arm64":
            for tag in tags:
                client.images.remove(tag, noprune=False)
            gone += tags
    # Earlier builds' images whose tags moved on: untagged leaves the untagging above cannot reach.
    for image in client.images.list(filters={"dangling": True}):
        if image.attrs.get("Architecture") == "arm64":
            client.images.remove(image.id, noprune=False)
            gone.append(image.short_id)
    # BuildKit's cache records keep the removed bases' layers on disk (measured: 14 GB of arm64 layers
    # left in the layer store after the images were gone); the records of images still here can go.
    reclaimed = client.api.prune_builds().get("SpaceReclaimed") or 0
    return [*gone, f"BuildKit's unused cache records ({reclaimed / 1e9:.1f} GB)"]


TIER = Tier(
    name="linux/arm64",
    record_path=ROOT / "tests" / "platform-tier.json",
    figures_path=ROOT / "reports" / "platform-tier-figures.json",  # what test_arm64 measured
    inputs=INPUTS,
    facts=platform_facts,
    after_record=show_figures,
    clean=remove_arm64_images,
)

if __name__ == "__main__":
    sys.exit(TIER.main())
