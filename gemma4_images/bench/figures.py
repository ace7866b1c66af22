"""What every benchmark shares: the bench's tags and files, and the pure parts (steps read from
a build log, ratios, verdicts and their tables), unit-tested without an engine."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gemma4_images.spec import matrix, measured
from gemma4_images.spec.image_code import gemma4_bench as harness
from gemma4_images.spec.matrix import ROOT

TARGET = "xeon6"
BENCH_TAG = "gemma4-e2b-bench/xeon6:build"
BASE_BENCH_TAG = "gemma4-e2b-bench/vllm-cpu:cold"
TINY = matrix.model_path("tiny")  # where every run mounts the tiny trained model
CONTEXT_ITEMS = ["image", "patches", ".dockerignore"]
FS_INSTRUCTIONS = ("COPY", "ADD", "RUN")
NOCHANGE_MAX_STEPS = 0
PATCH_MAX_RATIO = 0.05
SIZE_OVERHEAD_MAX = 0.01
OUT = ROOT / "BENCHMARKS.md"
# Every part's figures from its last run (spec/measured.py): a run of some parts keeps the others'
# (BENCHMARKS.md is rendered from this file, and a unit test fails when the two drift).
RESULTS = measured.RESULTS


# -- pure parts (unit-tested) --------------------------------------------------------------------


@dataclass
class Step:
    number: int
    instruction: str
    cached: bool
    seconds: float = 0.0

    @property
    def kind(self) -> str:
        return self.instruction.split(None, 1)[0].upper()

    @property
    def layer(self) -> bool:
        return self.kind in FS_INSTRUCTIONS


def parse_steps(lines: list[str], stamps: list[float] | None = None, end: float | None = None) -> list[Step]:
    """Steps of a classic-builder log (as docker_build.build logs them) and whether each came from
    the cache. Steps before and including FROM are never cached or rebuilt: they are left out.
    With the time each line arrived (stamps) and the end time, each step gets its seconds."""
    steps: list[Step] = []
    seen_from = False
    pending: list[Step] = []
    started: list[float] = []
    for i, raw in enumerate(lines):
        line = raw.strip()
        m = re.match(r"Step (\d+)/\d+ : (.*)", line)
        if m:
            step = Step(int(m.group(1)), m.group(2), False)
            if seen_from:
                steps.append(step)
                started.append(stamps[i] if stamps else 0.0)
            elif step.kind == "FROM":
                seen_from = True
            pending = [step]
        elif line == "---> Using cache" and pending:
            pending[0].cached = True
    if stamps and steps:
        for n, step in enumerate(steps):
            step.seconds = round((started[n + 1] if n + 1 < len(steps) else (end or started[n])) - started[n], 3)
    return steps


def slowest(steps: list[Step], n: int = 3) -> list[str]:
    top = sorted(rebuilt(steps), key=lambda s: s.seconds, reverse=True)[:n]
    return [
        f"{s.instruction.split(None, 1)[0]} {s.instruction.split(None, 1)[1][:40] if ' ' in s.instruction else ''}"
        f" ({s.seconds:.2f} s)"
        for s in top
    ]


def rebuilt(steps: list[Step]) -> list[Step]:
    return [s for s in steps if not s.cached]


def expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), text)


def why_rebuilt(step: Step, changed_files: list[str], before_args: dict, after_args: dict) -> str:
    """Why the classic builder missed the cache at step: what its COPY source or ARG changed."""
    words = step.instruction.split()
    if step.kind in ("COPY", "ADD"):
        srcs = [expand(w, after_args).rstrip("/") for w in words[1:-1] if not w.startswith("--")]
        hits = [f for f in changed_files for s in srcs if f == s or f.startswith(s + "/")]
        if hits:
            return f"its source changed: {', '.join(sorted(hits)[:5])}"
        return "its sources are unchanged: the cache was pruned, or a step above it missed"
    if step.kind == "ARG":
        name = words[1].split("=", 1)[0]
        if before_args.get(name) != after_args.get(name):
            return f"build arg {name} changed: {before_args.get(name)!r} -> {after_args.get(name)!r}"
        return f"build arg {name} is unchanged: the cache was pruned, or a step above it missed"
    changed = sorted(k for k in set(before_args) | set(after_args) if before_args.get(k) != after_args.get(k))
    if changed:
        return f"build args in scope changed: {', '.join(changed)}"
    return "no input of this step changed: the cache was pruned, or a step above it missed"


def step_label(created_by: str, width: int = 80) -> str:
    """A history entry's CreatedBy as the Dockerfile step it came from, shortened."""
    if "#(nop)" in created_by:
        text = created_by.split("#(nop)", 1)[1].strip()
    else:
        m = re.search(r"/bin/(?:ba)?sh (?:-o pipefail )?-c (.*)", created_by, re.S)
        text = "RUN " + (m.group(1) if m else created_by)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def ratio(seconds: float, baseline: float) -> float:
    return seconds / baseline if baseline > 0 else float("nan")


@dataclass
class Scenario:
    name: str
    seconds: float
    steps: int
    steps_rebuilt: int
    layers_rebuilt: int
    first_rebuilt: str | None
    ratio: float = 1.0
    target: str = ""
    ok: bool = True
    layers_ok: bool = True
    time_ok: bool = True
    why: str = ""
    rebuilt_steps: list[str] = field(default_factory=list)
    slowest: list[str] = field(default_factory=list)


def judge(s: Scenario, first_allowed: str | None, forbidden: tuple[str, ...] = ()) -> Scenario:
    """Marks s against its target: first_allowed None means nothing may be rebuilt."""
    if first_allowed is None:
        s.target = "0 layers rebuilt"
        s.ok = s.layers_ok = s.steps_rebuilt == NOCHANGE_MAX_STEPS
    else:
        s.target = f"first rebuilt `{first_allowed}`, <= {PATCH_MAX_RATIO:.0%} of cold"
        s.layers_ok = (s.first_rebuilt or "").startswith(first_allowed) and not any(
            r.startswith(f) for r in s.rebuilt_steps for f in forbidden
        )
        s.time_ok = s.ratio <= PATCH_MAX_RATIO
        s.ok = s.layers_ok and s.time_ok
    return s


def scenario_table(rows: list[Scenario]) -> str:
    table = [
        (
            "build",
            "steps rebuilt",
            "layers rebuilt",
            "seconds",
            "vs cold",
            "first step rebuilt",
            "target",
            "layers",
            "time",
        )
    ]
    for s in rows:
        table.append(
            (
                s.name,
                f"{s.steps_rebuilt}/{s.steps}",
                str(s.layers_rebuilt),
                f"{s.seconds:.1f}",
                f"{s.ratio:.1%}",
                f"`{s.first_rebuilt}`" if s.first_rebuilt else "-",
                s.target or "baseline",
                "-" if not s.target else "met" if s.layers_ok else "NOT met",
                "-" if not s.target or "%" not in s.target else "met" if s.time_ok else "NOT met",
            )
        )
    return harness._markdown(table)


def size_verdict(image_bytes: int, base_bytes: int, added_bytes: int) -> dict:
    delta = image_bytes - base_bytes
    overhead = delta - added_bytes
    limit = added_bytes * (1 + SIZE_OVERHEAD_MAX)
    return {
        "image": image_bytes,
        "base": base_bytes,
        "delta": delta,
        "added": added_bytes,
        "overhead": overhead,
        "overhead_pct": overhead / added_bytes * 100 if added_bytes else 0.0,
        "ok": delta <= limit,
    }
