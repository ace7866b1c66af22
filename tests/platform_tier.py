"""When CI runs the linux/arm64 tier (tests/integration/test_arm64.py, minutes under qemu): when
what it proves has changed since it last passed. INPUTS are the files the arm64 build and serve
path depends on beyond what every CI run proves on linux/amd64, and the platform parts of
targets.yaml; RECORD (committed) holds their digest as of the last pass, with its figures.

    python -m tests.platform_tier --current   exit 0 if RECORD matches the inputs, else 1 naming it
    python -m tests.platform_tier --record    write RECORD for the inputs now (after a pass: make test-arm64)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "tests" / "platform-tier.json"
FIGURES = ROOT / "reports" / "platform-tier-figures.json"  # what test_arm64 measured
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


def digest() -> str:
    h = hashlib.sha256()
    for rel in INPUTS:
        path = ROOT / rel
        for f in sorted([path] if path.is_file() else path.rglob("*")):
            if f.is_file():
                h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(json.dumps(platform_facts(), sort_keys=True).encode())
    return h.hexdigest()


def current() -> bool:
    try:
        return json.loads(RECORD.read_text())["inputs"] == digest()
    except (OSError, ValueError, KeyError):
        return False


def record() -> dict:
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    # The inputs' digest is what counts; the commit says where, "-dirty" when the tree had changes
    # (record again once they are committed: the digest stays the same).
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    data = {
        "inputs": digest(),
        "passed_at_commit": commit + ("-dirty" if dirty.stdout.strip() else ""),
        "figures": json.loads(FIGURES.read_text()) if FIGURES.is_file() else {},
    }
    RECORD.write_text(json.dumps(data, indent=1) + "\n")
    if data["figures"]:
        # BENCHMARKS.md's arm64 section shows them; the rest of the page is kept as it was.
        from gemma4_images.bench import figures, report

        results = json.loads(figures.RESULTS.read_text())
        results["arm64"] = data
        figures.RESULTS.write_text(json.dumps(results, indent=2, default=str) + "\n")
        figures.OUT.write_text(report.render_results(results))
    return data


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--current", action="store_true")
    group.add_argument("--record", action="store_true")
    args = parser.parse_args(argv)
    if args.record:
        print(f"wrote {RECORD.relative_to(ROOT)}: {record()['figures']}")
        return 0
    if current():
        print("the linux/arm64 tier passed on these inputs (tests/platform-tier.json): not run again")
        return 0
    print("the linux/arm64 tier's inputs changed since it last passed (tests/platform-tier.json): run it")
    return 1


if __name__ == "__main__":
    sys.exit(main())
