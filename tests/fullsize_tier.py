"""When CI runs the full-size tier (tests/integration/test_fullsize.py: random weights of E2B's shape,
10.2 GB, served by the CPU image; `make test-fullsize`, alone on the machine): when what it proves
has changed since it last passed (tests/tier.py). INPUTS: the shape, the CPU image's files, the
fixes pack, and the tier's own code (cpu_facts adds the CPU default's release and base lock);
RECORD (committed) holds their digest and the figures of the last pass.

    python -m tests.fullsize_tier --current | --record | --clean
"""

from __future__ import annotations

import sys

from tests.tier import ROOT, Tier

INPUTS = [
    "testkit/e2b_shape",
    "Dockerfile.cpu",
    "image",
    "patches",
    "bases/vllm-cpu-local",
    "gemma4_images/bench/fullsize.py",
    "tests/integration/test_fullsize.py",
    "tests/integration/test_fullsize_tp.py",
    "tests/integration/multinode.py",
]


def cpu_facts() -> dict:
    """targets.yaml's xeon6 target and CPU family at the CPU default: its release, launch, run
    options, pod resources, and its stand-in with the lock it installs."""
    from gemma4_images.spec import matrix

    m = matrix.load_default("xeon6")  # the tier serves the CPU default's image
    standin = m.standin("xeon6")
    return {
        "xeon6": m.targets["xeon6"].model_dump(),
        "cpu": m.families["cpu"].model_dump(),
        "vllm": m.project.vllm_version,
        "standin": {**standin.model_dump(), "lock_text": standin.lock_path.read_text()},
    }


def remove_folder() -> list[str]:
    """The 10.2 GB folder the tier wrote into the machine cache (rewritten in ~1 min when needed)."""
    from testkit.e2b_shape import cache

    return [str(path) for path in cache.remove()]


TIER = Tier(
    name="full-size",
    record_path=ROOT / "tests" / "fullsize-tier.json",
    figures_path=ROOT / "reports" / "fullsize-tier-figures.json",
    inputs=INPUTS,
    facts=cpu_facts,
    clean=remove_folder,
)
FIGURES = TIER.figures_path

if __name__ == "__main__":
    sys.exit(TIER.main())
