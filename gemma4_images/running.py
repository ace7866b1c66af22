"""`docker run` lines per target, and reading what an image says about itself."""

from __future__ import annotations

import json
import re
import shlex

from .matrix import Matrix

HF_CACHE = "/root/.cache/huggingface"


def run_args(
    matrix: Matrix,
    name: str,
    image: str | None = None,
    env: dict[str, str] | None = None,
    extra: list[str] | None = None,
) -> list[str]:
    """The recipe's `docker run` for a target: its device flags, the HF cache, then the image."""
    target = matrix.targets[matrix.resolve(name)]
    args = ["docker", "run", "--rm", *target.run_flags, "-v", f"$HOME/.cache/huggingface:{HF_CACHE}"]
    for key, value in (env or {}).items():
        args += ["-e", f"{key}={value}"]
    return args + [image or matrix.tag(name), *(extra or [])]


def run_line(*a, **kw) -> str:
    # $HOME stays unquoted so the user's shell expands it.
    return " ".join(arg if arg.startswith("$HOME/") else shlex.quote(arg) for arg in run_args(*a, **kw))


def describe(image) -> dict:
    """Labels, build.json and recipe of a local image, read without running a server."""
    attrs = image.attrs
    config = attrs.get("Config") or {}
    return {
        "id": image.id,
        "tags": image.tags,
        "size_mb": round(attrs.get("Size", 0) / 1e6, 1),
        "labels": config.get("Labels") or {},
        "entrypoint": config.get("Entrypoint"),
        "healthcheck": config.get("Healthcheck"),
        "env": config.get("Env"),
    }


def python_of(client, image: str) -> dict:
    """The base's Python as pip needs it to choose wheels: version, machine and glibc."""
    script = (
        "import json, platform, sys; print(json.dumps({'python': '%d.%d' % sys.version_info[:2], "
        "'machine': platform.machine(), 'glibc': platform.libc_ver()[1]}))"
    )
    out = client.containers.run(image, ["-c", script], entrypoint=["python3"], remove=True, network_mode="host")
    return json.loads(out.decode().strip().splitlines()[-1])


def rss_bytes(container) -> int:
    """Resident memory of every process in a running container (the server and its engine)."""
    out = container.exec_run(["sh", "-c", "cat /proc/[0-9]*/status 2>/dev/null"]).output.decode()
    return sum(int(kb) * 1024 for kb in re.findall(r"^VmRSS:\s+(\d+) kB", out, re.M))


def processes(container) -> list[tuple[int, str, str]]:
    """(pid, state, command) of every process in a running container; state Z is a zombie."""
    out = container.exec_run(["sh", "-c", "for s in /proc/[0-9]*/stat; do cat $s 2>/dev/null; echo; done"]).output
    rows = []
    for line in out.decode(errors="replace").splitlines():
        m = re.match(r"(\d+) \((.*)\) (\S)", line)
        if m:
            rows.append((int(m.group(1)), m.group(3), m.group(2)))
    return rows


def read_file(client, image: str, path: str) -> str:
    out = client.containers.run(image, entrypoint=["cat", path], remove=True, network_mode="host")
    return out.decode()


def build_json(client, image: str) -> dict:
    return json.loads(read_file(client, image, "/etc/gemma4-e2b/build.json"))
