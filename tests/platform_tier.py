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
    from gemma4_images.spec import matrix

    # At each target's default release: the tier builds what the CLI builds without --vllm, on the
    # stand-in each of its other platforms names there, with that stand-in's lock.
    views = {n: matrix.load_default(n) for n in matrix.load().targets}
    standins = {}
    for n, v in views.items():
        for p in v.targets[n].base.platforms:
            s = v.standin(n, p)
            if s is not None:
                standins[f"{n} {p}"] = {**s.model_dump(), "lock_text": s.lock_path.read_text()}
    return {
        "targets": {n: {p: b.model_dump() for p, b in v.targets[n].base.platforms.items()} for n, v in views.items()},
        "standins": standins,
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
    from docker.errors import APIError

    client, gone, kept = docker.from_env(), [], []

    def remove(ref: str) -> None:
        try:
            client.images.remove(ref, noprune=False)
            gone.append(ref)
        except APIError as e:  # one in use (a stopped container, a child image): the rest still go
            kept.append(f"{ref} ({e.explanation or e})")

    for image in client.images.list():
        if image.attrs.get("Architecture") == "arm64":
            for tag in [t for t in image.tags if t.startswith("gemma4-e2b")]:
                remove(tag)
    # Earlier builds' images whose tags moved on: untagged leaves the untagging above cannot reach.
    for image in client.images.list(filters={"dangling": True}):
        if image.attrs.get("Architecture") == "arm64":
            remove(image.id)
    # BuildKit's cache records keep removed bases' layers on disk (measured: 14 GB of arm64 layers
    # after the images were gone). This prunes every unused record of the engine, not arm64's only:
    # a base is reused by its inputs label (localbase), so only a rebuild of a changed base loses cache.
    reclaimed = client.api.prune_builds().get("SpaceReclaimed") or 0
    if kept:
        raise SystemExit("error: kept (in use): " + "; ".join(kept))
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
