"""How long `make test` takes (what CI runs, the README's test command): a fresh clone of the
committed tree beside this one (so it finds ../shared as CI's clone does), on this machine's
engine with its images and caches (as CI's machines keep them between runs), run in two lanes and
then in one (LANES=0), the baseline measured in the same run."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from gemma4_images.spec.image_code import gemma4_bench as harness
from gemma4_images.spec.matrix import ROOT

TARGET_S = 15 * 60  # issue 23: `make test` under 15 minutes on 2 cores
RUNS = {"two lanes": "2", "one lane (baseline)": "0"}
SUMMARY = re.compile(r"=+ (.*\d+ passed.*) in [\d.]+s")


def measure(log=print) -> dict:
    clone = Path(tempfile.mkdtemp(prefix=".bench-tests-", dir=ROOT.parent))
    try:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True)
        out = {"commit": head.stdout.strip(), "target_s": TARGET_S, "runs": {}}
        for name, lanes in RUNS.items():
            log(f"tests: make test LANES={lanes} in {clone}")
            start = time.monotonic()
            run = subprocess.run(["make", "test", f"LANES={lanes}"], cwd=clone, capture_output=True, text=True)
            seconds = time.monotonic() - start
            found = SUMMARY.findall(run.stdout)
            out["runs"][name] = {
                "seconds": round(seconds),
                "exit": run.returncode,
                "summary": found[-1] if found else "",
            }
            log(f"tests: {name}: {seconds:.0f} s, exit {run.returncode}, {out['runs'][name]['summary']}")
            if run.returncode:
                kept = Path(tempfile.gettempdir()) / f"gemma4-bench-tests-lanes{lanes}.log"
                kept.write_text(run.stdout + run.stderr)
                marks = [run.stdout.find(m) for m in ("= ERRORS =", "= FAILURES =") if m in run.stdout]
                problems = run.stdout[min(marks) :] if marks else run.stdout[-6000:]
                raise RuntimeError(
                    f"make test LANES={lanes} exited {run.returncode} (whole log: {kept}):\n{problems[:6000]}"
                )
        return out
    finally:
        shutil.rmtree(clone, ignore_errors=True)


def section(t: dict) -> list[str]:
    runs = t["runs"]
    base = runs["one lane (baseline)"]["seconds"]
    rows = [("run", "seconds", "vs one lane", "tests")]
    rows += [(name, f"{r['seconds']}", f"{r['seconds'] / base:.2f}x", r["summary"]) for name, r in runs.items()]
    lanes = runs["two lanes"]["seconds"]
    verdict = "met" if lanes <= t["target_s"] else "NOT met"
    return [
        "## The test suite: `make test`",
        "",
        f"`make test` in a fresh clone (commit {t['commit']}) beside this one, on this machine's engine with "
        "its images and caches, as CI's machines keep them (`gemma4_images/bench/tests_time.py`): two "
        "lanes (what CI runs), then one lane (`LANES=0`) as the baseline measured in the same run. "
        f"Two lanes: {lanes / 60:.1f} min (target <= {t['target_s'] // 60} min: {verdict}).",
        "",
        harness._markdown(rows),
        "",
    ]
