"""Python wheels downloaded on the build host and served to builds on 127.0.0.1: the only way
packages reach an image here (pip inside a build cannot verify PyPI's TLS), and the air-gapped
path for users (the host's pip configuration, mirrors and proxies apply)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from gemma4_images.spec.facts import WHEELHOUSE_PORT
from gemma4_images.spec.upstream import cache_dir


class WheelsError(Exception):
    pass


def wheelhouse(
    requirements: list[str], python: str = "3.11", platforms: list[str] | None = None, name: str | None = None
) -> Path:
    """Wheels for requirements and their dependencies, for CPython `python` on `platforms` (pip's
    tags; default: this host's), downloaded once per machine into wheelhouse-<name or a hash>."""
    key = hashlib.sha256("\n".join([*requirements, python, *(platforms or [])]).encode()).hexdigest()[:16]
    dest = cache_dir() / f"wheelhouse-{name or key}"
    done = dest / ".complete"
    if not done.exists():
        args = [a for p in platforms or [] for a in ("--platform", p)]
        _pip_download(requirements, dest, "--python-version", python, *args)
        done.write_text("\n".join(requirements) + "\n")
    return dest


def lock_entries(text: str) -> list[str]:
    """The requirements of a hashed lock (uv pip compile --generate-hashes), one line each: its
    `name==version` and `--hash` options joined, comments left out."""
    entries, current = [], []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            current.append(line.removesuffix("\\").strip())
            if not line.endswith("\\"):
                entries.append(" ".join(current))
                current = []
    return entries


def locked_wheelhouse(lock: Path, python: str = "3.11", parallel: int = 4, platforms: list[str] | None = None) -> Path:
    """Exactly the wheels lock pins, their hashes checked, downloaded once per machine into
    wheelhouse-<lock name>-<its hash>, for `platforms` (pip's tags; default: this host's). The lock
    holds every dependency, so pip resolves nothing and `parallel` downloads share the pins
    (measured here for the CPU base's 887 MB: 68 s in one `pip download` that resolves, 32 s in four
    `--no-deps` ones)."""
    text = lock.read_text()
    key = hashlib.sha256("".join([text, python, *(platforms or [])]).encode()).hexdigest()[:16]
    dest = cache_dir() / f"wheelhouse-{lock.stem}-{key}"
    done = dest / ".complete"
    if not done.exists():
        entries = lock_entries(text)
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(parallel) as pool:
            parts = [Path(tmp) / f"part-{n}.txt" for n in range(parallel)]
            for n, part in enumerate(parts):
                part.write_text("\n".join(entries[n::parallel]) + "\n")
            tags = [a for p in platforms or [] for a in ("--platform", p)]
            args = ("--python-version", python, *tags, "--no-deps", "--require-hashes")
            try:
                jobs = [pool.submit(_pip_download, ["-r", str(part)], dest, *args, nice=True) for part in parts]
                for job in jobs:
                    job.result()
            except WheelsError as e:
                raise WheelsError(f"the wheels {lock} pins: {e}") from None
        done.write_text(text)
    return dest


def wheel(requirement: str, python: str = "3.11") -> Path:
    """The one wheel of requirement (no dependencies) for CPython `python`, downloaded once per
    machine (vllm-tpu is a cp312 wheel only)."""
    name, version = requirement.split("==")
    dest = cache_dir() / "pip" / f"{name}-{version}"
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    if not any(dest.glob(pattern)):
        _pip_download([requirement], dest, "--python-version", python, "--no-deps")
    return sorted(dest.glob(pattern))[0]


def manylinux_platforms(machine: str, glibc: str) -> list[str]:
    """pip's platform tags for a Linux base with this glibc, newest first (PEP 600 and the legacy
    aliases pip still accepts)."""
    major, minor = (int(p) for p in glibc.split(".")[:2])
    tags = [f"manylinux_{major}_{m}_{machine}" for m in range(minor, 16, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return tags + [f"{name}_{machine}" for m, name in legacy.items() if minor >= m]


def _pip_download(requirements: list[str], dest: Path, *args: str, nice: bool = False) -> None:
    """nice: at the lowest CPU priority. pip spends about a minute of CPU on the CPU base's 887 MB,
    and the base's root filesystem (mmdebstrap) builds beside it, on the critical path: measured on
    2 cores, mmdebstrap took 97 s beside four plain downloads and 70 s beside four niced ones
    (download 45 s and 61 s), 51 s alone."""
    dest.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(
        [
            *(["nice", "-n", "19"] if nice else []),
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--only-binary=:all:",
            "-d",
            str(dest),
            *requirements,
            *args,
        ],
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        errors = [line for line in run.stderr.splitlines() if not line.startswith("WARNING: Location")]
        raise WheelsError(f"pip download {' '.join(requirements)} failed:\n" + "\n".join(errors[-10:]))


@contextmanager
def serve_directory(path: Path, port: int = WHEELHOUSE_PORT):
    """An HTTP server for path on 127.0.0.1 (port, else a free one) while the block runs."""
    handler = functools.partial(_QuietHandler, directory=str(path))
    try:
        server = _Server(("127.0.0.1", port), handler)
    except OSError:
        server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # A client that hangs up mid-file is not our error: uv abandons some downloads of the CUDA
        # stand-in's large wheels and fetches them again (seen as BrokenPipeError tracebacks in the
        # build log, the install unaffected). Anything else is still printed.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
