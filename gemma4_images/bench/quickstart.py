"""How long `make quickstart` takes on a fresh machine (cold) and run again (warm), step by step,
for `make bench --quickstart` (BENCHMARKS.md).

Cold without wiping this machine: a fresh clone of the committed tree, a second Docker daemon with
its own empty data root (no images, no build cache), empty project, uv and pip caches. What stays is
what a fresh machine of this kind has too: the local torch wheel folder pip's configuration names.
The Debian packages a fresh machine lacks (`scripts/setup-host.sh packages`) are timed in a
throwaway container of minbase Debian bookworm, where none of them is installed, and counted in the
cold total. Warm is the same command again in the same clone, daemon and caches (three times: the
median run)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import docker

from gemma4_images.build import localbase, owned
from gemma4_images.spec.image_code import gemma4_bench as harness
from gemma4_images.spec.matrix import ROOT

# make echoes each command of the quickstart recipe before it runs it (setup-host.sh, its
# prerequisite, is silent): a line that starts a step, and what the step is called.
STEPS = [
    (re.compile(r"^\S*python\S* build\.py base cpu\b"), "base: rootfs + wheelhouse + base image"),
    (re.compile(r"^\S*python\S* build\.py build cpu\b"), "build: CPU image, SBOM, provenance"),
    (re.compile(r"^\S*python\S* build\.py smoke cpu\b"), "smoke: start, checks, answers"),
]
PACKAGES = "host packages: apt-get install (fresh Debian)"
FIRST = "host: Docker check, venv"
TARGET_S = {"cold": 300, "warm": 60}  # issue #13
WARM_RUNS = 3


def split_steps(stamped: list[tuple[float, str]], start: float, end: float) -> dict[str, float]:
    """Seconds per step from (time, line) pairs of make's output."""
    marks = [(start, FIRST)]
    for t, line in stamped:
        for pattern, name in STEPS:
            if pattern.match(line):
                marks.append((t, name))
    marks.append((end, None))
    return {name: round(marks[i + 1][0] - t, 1) for i, (t, name) in enumerate(marks[:-1])}


def _run(argv: list[str], cwd: Path, env: dict) -> tuple[int, list[tuple[float, str]], float]:
    start = time.monotonic()
    stamped = []
    with subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
        for line in p.stdout:
            stamped.append((time.monotonic(), line.rstrip("\n")))
    return p.returncode, stamped, start


def host_packages(clone: Path, log) -> float:
    """Seconds `scripts/setup-host.sh packages` takes where none of its packages is installed: a
    throwaway container of the minbase bookworm root filesystem the CPU base is made from (the
    same Debian release and mirror as this host), on this machine's own daemon."""
    client = docker.from_env()
    image = localbase.rootfs(client, log)
    log(f"quickstart, cold: scripts/setup-host.sh packages in a fresh {image} container")
    start = time.monotonic()
    try:
        client.containers.run(
            image,
            ["bash", "scripts/setup-host.sh", "packages"],
            working_dir="/src",
            volumes={str(clone): {"bind": "/src", "mode": "ro"}},
            network_mode="host",
            labels=owned.labels(),
            remove=True,
            stderr=True,
        )
    except docker.errors.ContainerError as e:
        raise RuntimeError(f"scripts/setup-host.sh packages failed in a fresh Debian container: {e.stderr}") from None
    finally:
        client.close()
    return round(time.monotonic() - start, 1)


def _daemon(root: Path) -> subprocess.Popen:
    sock = root / "docker.sock"
    d = subprocess.Popen(
        [
            "dockerd", "--bridge=none", "--iptables=false", "--ip-forward=false", "--ip-masq=false",
            "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
            "--pidfile", str(root / "docker.pid"), "-H", f"unix://{sock}",
        ],
        stdout=open(root / "dockerd.log", "w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    for _ in range(60):
        if subprocess.run(["docker", "-H", f"unix://{sock}", "info"], capture_output=True).returncode == 0:
            return d
        time.sleep(1)
    d.terminate()
    raise RuntimeError(f"the cold Docker daemon did not start; see {root / 'dockerd.log'}")


def measure(log=print) -> dict:
    """{"cold": {...}, "warm": {...}}: total seconds, seconds per step, exit status, and the
    smoke table's last lines."""
    root = Path(tempfile.mkdtemp(prefix="gemma4-quickstart-", dir="/var/tmp"))
    daemon = _daemon(root)
    try:
        clone = root / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True)
        env = {
            **os.environ,
            "DOCKER_HOST": f"unix://{root / 'docker.sock'}",
            "GEMMA4_CACHE": str(root / "cache"),
            "UV_CACHE_DIR": str(root / "uv-cache"),
            "PIP_CACHE_DIR": str(root / "pip-cache"),
            "XDG_CACHE_HOME": str(root / "xdg-cache"),
        }
        out = {"commit": head.stdout.strip()}
        packages_s = host_packages(clone, log)
        runs = {"cold": [], "warm": []}
        for kind in ["cold", *["warm"] * WARM_RUNS]:
            log(f"quickstart, {kind}: make quickstart in {clone}")
            rc, stamped, start = _run(["make", "quickstart"], clone, env)
            end = time.monotonic()
            # A fresh machine installs the packages once, before its first (cold) run.
            steps = {PACKAGES: packages_s} if kind == "cold" else {}
            steps |= split_steps(stamped, start, end)
            runs[kind].append(
                {
                    "seconds": round(end - start + (packages_s if kind == "cold" else 0), 1),
                    "target_s": TARGET_S[kind],
                    "steps": steps,
                    "exit": rc,
                    "tail": [line for _, line in stamped[-3:]],
                }
            )
            log(f"quickstart, {kind}: {runs[kind][-1]['seconds']} s, exit {rc}")
            if rc:
                tail = "\n".join(line for _, line in stamped[-30:])
                raise RuntimeError(f"make quickstart ({kind}) exited {rc}:\n{tail}")
        out["cold"] = runs["cold"][0]
        # Warm runs differ by seconds (vLLM's start on 2 cores): the median run, with every total.
        ordered = sorted(runs["warm"], key=lambda r: r["seconds"])
        out["warm"] = {**ordered[len(ordered) // 2], "runs_s": [r["seconds"] for r in runs["warm"]]}
        return out
    finally:
        daemon.terminate()
        daemon.wait(60)
        # dockerd leaves its default network namespace mounted under the exec root
        subprocess.run(["umount", str(root / "exec" / "netns" / "default")], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def quickstart_section(q: dict) -> list[str]:
    names = list(dict.fromkeys([*q["cold"]["steps"], *q["warm"]["steps"]]))
    rows = [("step", "cold s", "warm s")]
    rows += [(n, f"{q['cold']['steps'].get(n, 0):.0f}", f"{q['warm']['steps'].get(n, 0):.0f}") for n in names]

    def verdict(r):
        met = "met" if r["seconds"] <= r["target_s"] else "NOT met"
        runs = r.get("runs_s")
        of = f", the median of {len(runs)} runs: {', '.join(f'{x:.0f}' for x in runs)} s" if runs else ""
        return f"{r['seconds']:.0f} s (target <= {r['target_s']} s: {met}{of})"

    return [
        "## Quick start: cold and warm",
        "",
        f"`make quickstart` in a fresh clone (commit {q['commit']}) against a second Docker daemon with an "
        "empty data root and empty project, uv and pip caches (`gemma4_images/bench/quickstart.py`), then the "
        "same command again (warm; the table's warm column is the median run); the Debian packages "
        "`scripts/setup-host.sh packages` installs are timed first in a throwaway minbase bookworm container "
        "and counted in the cold total. The local torch wheel folder is what this machine kind has anyway. "
        f"Cold: {verdict(q['cold'])}; warm: {verdict(q['warm'])}.",
        "",
        harness._markdown([*rows, ("total", f"{q['cold']['seconds']:.0f}", f"{q['warm']['seconds']:.0f}")]),
        "",
    ]
