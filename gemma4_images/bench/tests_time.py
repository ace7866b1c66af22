"""How long `make test` takes (what CI runs, the README's test command): a fresh clone of the
committed tree beside this one (so it finds ../shared as CI's clone does), on this machine's
engine with its images and caches (as CI's machines keep them between runs), run in two lanes and
then in one (LANES=0), the baseline measured in the same run. And as a fresh machine runs it
(`make test-fresh`): the project's images removed and the build cache emptied first, its time and
the disk it takes (the engine's data root's filesystem, sampled every 5 s)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from gemma4_images.build import owned
from gemma4_images.spec.image_code import gemma4_bench as harness
from gemma4_images.spec.matrix import ROOT

TARGET_S = 15 * 60  # issue 23: `make test` under 15 minutes on 2 cores
FRESH_TARGET_S = 25 * 60  # issue 43: under 25 minutes from an empty build cache
# What the suite builds and tags (images, stand-in bases, test images, also under a loopback
# registry's host): a repository with a path part `gemma4-e2b` or `gemma4-e2b-…`.
PROJECT = re.compile(r"^gemma4-e2b(-[a-z0-9-]+)?$")
SUITE_TIMEOUT_S = 3 * 3600
GB = 1e9
RUNS = {"two lanes": "2", "one lane (baseline)": "0"}
SUMMARY = re.compile(r"=+ (.*\d+ passed.*) in [\d.]+s")


def measure(log=print) -> dict:
    clone = Path(tempfile.mkdtemp(prefix=".bench-tests-", dir=ROOT.parent))
    try:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True)
        out = {"commit": head.stdout.strip(), "target_s": TARGET_S, "runs": {}}
        for name, lanes in RUNS.items():
            seconds, run = _make_test(clone, lanes, log)
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


def _make_test(clone: Path, lanes: str, log) -> tuple[float, subprocess.CompletedProcess]:
    log(f"tests: make test LANES={lanes} in {clone}")
    start = time.monotonic()
    run = subprocess.run(
        ["make", "test", f"LANES={lanes}"], cwd=clone, capture_output=True, text=True, timeout=SUITE_TIMEOUT_S
    )
    return time.monotonic() - start, run


def project_image(tag: str) -> bool:
    repository = tag.rpartition(":")[0] if ":" in tag.rpartition("/")[2] else tag
    return any(PROJECT.match(part) for part in repository.split("/"))


def _empty_the_engine(client, log) -> None:
    """The project's images removed and the build cache emptied (the engine's whole cache: a fresh
    machine has none), refused while a container of this project runs (a job using them)."""
    running = client.containers.list(filters={"label": owned.LABEL})
    if running:
        names = ", ".join(c.name for c in running)
        raise RuntimeError(f"containers of this project are running ({names}): let that job end first")
    for image in client.images.list():
        if any(project_image(t) for t in image.tags):
            client.images.remove(image.id, force=True)
    client.api.prune_builds(all=True)
    log(f"tests: engine emptied of the project's images and build cache ({len(client.images.list())} images left)")


def measure_fresh(client, log=print) -> dict:
    """`make test` (two lanes) in a fresh clone after _empty_the_engine: seconds and disk."""
    clone = Path(tempfile.mkdtemp(prefix=".bench-tests-fresh-", dir=ROOT.parent))
    peak, done = [0], threading.Event()

    data_root = client.info()["DockerRootDir"]

    def sample() -> None:
        while not done.wait(5):
            peak[0] = max(peak[0], shutil.disk_usage(data_root).used)

    try:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True)
        _empty_the_engine(client, log)
        before = peak[0] = shutil.disk_usage(data_root).used
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        seconds, run = _make_test(clone, "2", log)
        done.set()
        sampler.join()
        after = shutil.disk_usage(data_root).used
        found = SUMMARY.findall(run.stdout)
        out = {
            "commit": head.stdout.strip(),
            "target_s": FRESH_TARGET_S,
            "seconds": round(seconds),
            "exit": run.returncode,
            "summary": found[-1] if found else "",
            "disk_used_before_gb": round(before / GB, 1),
            "disk_peak_added_gb": round((peak[0] - before) / GB, 1),
            "disk_kept_gb": round((after - before) / GB, 1),
        }
        log(f"tests: fresh: {seconds:.0f} s, exit {run.returncode}, {out['summary']}")
        log(f"tests: fresh: disk +{out['disk_peak_added_gb']} GB at the peak, +{out['disk_kept_gb']} GB kept")
        if run.returncode:
            kept = Path(tempfile.gettempdir()) / "gemma4-bench-tests-fresh.log"
            kept.write_text(run.stdout + run.stderr)
            raise RuntimeError(f"make test from an empty build cache exited {run.returncode} (whole log: {kept})")
        return out
    finally:
        done.set()
        shutil.rmtree(clone, ignore_errors=True)


def section(t: dict) -> list[str]:
    out = ["## The test suite: `make test`", ""]
    runs = t.get("runs")
    if runs:
        base = runs["one lane (baseline)"]["seconds"]
        rows = [("run", "seconds", "vs one lane", "tests")]
        rows += [(name, f"{r['seconds']}", f"{r['seconds'] / base:.2f}x", r["summary"]) for name, r in runs.items()]
        lanes = runs["two lanes"]["seconds"]
        verdict = "met" if lanes <= t["target_s"] else "NOT met"
        out += [
            f"`make test` in a fresh clone (commit {t['commit']}) beside this one, on this machine's engine with "
            "its images and caches, as CI's machines keep them (`gemma4_images/bench/tests_time.py`): two "
            "lanes (what CI runs), then one lane (`LANES=0`) as the baseline measured in the same run. "
            f"Two lanes: {lanes / 60:.1f} min (target <= {t['target_s'] // 60} min: {verdict}).",
            "",
            harness._markdown(rows),
            "",
        ]
    fresh = t.get("fresh")
    if fresh:
        verdict = "met" if fresh["seconds"] <= fresh["target_s"] else "NOT met"
        out += [
            f"As a fresh machine runs it (`make test-fresh`, commit {fresh['commit']}): the project's images "
            "removed and the engine's build cache emptied first, then `make test` in two lanes in a fresh "
            "clone (its venv made anew; the pip and uv download caches kept). "
            f"{fresh['seconds'] / 60:.1f} min (target <= {fresh['target_s'] // 60} min: {verdict}), "
            f"{fresh['summary']}; disk: {fresh['disk_used_before_gb']} GB used before, "
            f"+{fresh['disk_peak_added_gb']} GB at the peak, +{fresh['disk_kept_gb']} GB kept after.",
            "",
        ]
    return out
