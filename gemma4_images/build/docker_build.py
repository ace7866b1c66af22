"""Talk to the Docker engine: connect, find or pull bases, build with streamed progress."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import docker
from docker.errors import APIError, DockerException, ImageNotFound

from gemma4_images.build import registry
from gemma4_images.spec.matrix import MatrixError
from gemma4_images.spec.reference import Reference, recorded_digest

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
LOG_TAIL = 25


class DockerUnavailable(Exception):
    pass


class BuildFailed(Exception):
    def __init__(self, tag: str, step: str | None, error: str, tail: list[str]):
        self.tag, self.step, self.error, self.tail = tag, step, error, tail
        super().__init__(f"building {tag} failed at {step or 'the start'}: {error}")


class BaseUnavailable(Exception):
    pass


def connect() -> docker.DockerClient:
    """A client for a daemon that answers, or one clear line saying how to get one."""
    try:
        client = docker.from_env(timeout=900)
        client.ping()
        return client
    except DockerException as e:
        reason = str(e).split("(")[0].strip().rstrip(":") or type(e).__name__
        raise DockerUnavailable(
            f"cannot reach the Docker daemon ({reason}). Start it (`dockerd --bridge=none "
            "--iptables=false &`, or `systemctl start docker`) or point DOCKER_HOST at one."
        ) from None


def local_image(client, ref: str):
    try:
        return client.images.get(ref)
    except ImageNotFound:
        return None


def wrong_platform(image, ref: str, platform: str) -> str | None:
    """None when the local image (client.images.get's) was built for platform (linux/arm64), else
    one line saying what it is: the engine would run it anyway, emulated or not, under the wrong
    name."""
    built_for = f"{image.attrs.get('Os', 'linux')}/{image.attrs.get('Architecture')}"
    return None if built_for == platform else f"{ref} is a {built_for} image, not {platform}; give the {platform} image"


# Set to 1 (or true, yes): no registry off this machine is asked for an image. An air-gapped build
# host then fails fast, or takes the stand-in, instead of waiting on a registry it cannot reach; the
# test suite sets it, so nothing it builds sends traffic off the machine.
OFFLINE = "GEMMA4_OFFLINE"
OFFLINE_ON, OFFLINE_OFF = ("1", "true", "yes"), ("0", "false", "no", "")


def offline() -> bool:
    """Whether GEMMA4_OFFLINE is on; any value but those two sets is one line (MatrixError, exit 2):
    a misspelt `on` taken for off would send an air-gapped host's build to a registry after all."""
    value = os.environ.get(OFFLINE, "").strip().lower()
    if value not in OFFLINE_ON + OFFLINE_OFF:
        raise MatrixError(
            f"{OFFLINE}={os.environ[OFFLINE]!r} is neither on ({', '.join(OFFLINE_ON)}) nor off "
            f"({', '.join(OFFLINE_OFF[:-1])} or empty); set one of those"
        )
    return value in OFFLINE_ON


def pull(client, ref: str, platform: str | None = None) -> str | None:
    """Pull ref (for platform; None: the engine's own); returns None on success, else the
    registry's reason in one line. Offline, only a loopback registry is asked."""
    image = Reference.split(ref)
    if offline() and not registry.is_loopback(image.host):
        return f"{OFFLINE} is set: {image.host} is not asked"
    try:
        # A digest goes where the tag goes (docker-py and the engine then pull NAME@DIGEST; a tag
        # beside a digest only labels it).
        client.images.pull(image.name, tag=image.tag_or_digest, **({"platform": platform} if platform else {}))
        return None
    except (APIError, DockerException) as e:
        text = getattr(e, "explanation", None) or str(e)
        return text.strip().splitlines()[0][:300]


def base_digest(image, ref: str) -> str:
    """What the base.digest label records for a build on ref: the digest ref pins (the engine
    pulled exactly it), else the registry digest of ref's own repository, else the local image id
    (a base built here has no registry digest; its id is as stable)."""
    base = Reference.split(ref)
    return base.digest or recorded_digest(image.attrs.get("RepoDigests") or [], base.name) or image.id


@dataclass
class BuildSpec:
    dockerfile: str
    tag: str
    buildargs: dict[str, str]
    context: Path
    nocache: bool = False
    platform: str | None = None  # another architecture's build runs its RUN steps under qemu

    def argv(self, docker: str = "docker") -> list[str]:
        """The same build as a `docker build` command line (-f relative to the context)."""
        parts = [docker, "build", "--network", "host", "-f", self.dockerfile, "-t", self.tag]
        if self.platform:
            parts += ["--platform", self.platform]
        if self.nocache:
            parts.append("--no-cache")
        for k, v in self.buildargs.items():
            parts += ["--build-arg", f"{k}={v}"]
        return parts + [str(self.context)]

    def command_line(self) -> str:
        """The build as a shell command, for --dry-run and for people to read."""
        return shlex.join(self.argv())


def build(client, spec: BuildSpec, log: Callable[[str], None], verbose: bool = False) -> str:
    """Build spec; returns the image id. On failure raises BuildFailed; nothing is tagged and
    forcerm removes the failed step's container. Stopped midway (a stop signal, Ctrl-C), it leaves
    no image or container of its own either, and the exception goes on."""
    responses = []  # the build's HTTP response: requests hands it to the session's response hooks

    def keep(response, **kwargs):
        responses.append(response)

    client.api.hooks["response"].append(keep)
    try:
        stream = client.api.build(
            path=str(spec.context),
            dockerfile=spec.dockerfile,
            tag=spec.tag,
            buildargs=spec.buildargs,
            network_mode="host",
            rm=True,
            forcerm=True,
            nocache=spec.nocache,
            pull=False,
            decode=True,
            platform=spec.platform,
        )
    finally:
        client.api.hooks["response"].remove(keep)
    step, image_id, last_layer, tail = None, None, None, deque(maxlen=LOG_TAIL)
    try:
        for chunk in stream:
            if "error" in chunk:
                raise BuildFailed(spec.tag, step, ANSI.sub("", chunk["error"]).strip(), list(tail))
            if "aux" in chunk and "ID" in chunk["aux"]:
                image_id = chunk["aux"]["ID"]
            for line in ANSI.sub("", chunk.get("stream", "")).splitlines():
                done = re.fullmatch(r"\s*---> ([0-9a-f]{12,})", line)
                if done:
                    last_layer = done.group(1)
                if line.startswith("Step "):
                    step = line
                    log(f"  {line}")
                    tail.clear()
                elif line.strip():
                    tail.append(line)
                    if verbose or line.strip() == "---> Using cache":
                        log(f"    {line.strip()}")
    except BaseException:
        # A step failed (forcerm removed its container), or a stop signal or Ctrl-C came: the engine
        # cancels a classic build when its client hangs up, then removes the running step's
        # container (moby's builder runs it under the request's context), which until then holds
        # the last finished step's image.
        for response in responses:
            response.close()
        _remove_dangling(client, last_layer, wait_s=STOPPED_BUILD_WAIT_S)
        raise
    if image_id is None:
        raise BuildFailed(spec.tag, step, "the engine reported no image id", list(tail))
    return image_id


STOPPED_BUILD_WAIT_S = 60  # for the engine to remove a cancelled step's container


def _remove_dangling(client, image_id: str | None, wait_s: float = 0) -> None:
    """After a failed or stopped build: the last step that did succeed left an untagged image with
    no children (`<none>` in `docker images`); remove it and the untagged parents only it used.
    Steps shared with other images stay, so their cache does too. wait_s: how long to keep trying
    while a container still uses it (409)."""
    if not image_id:
        return
    deadline = time.monotonic() + wait_s
    while True:
        try:
            dangling = {i.id for i in client.images.list(filters={"dangling": True})}
            full = client.images.get(image_id).id
            if full in dangling:
                client.images.remove(full, noprune=False)
            return
        except ImageNotFound:
            return
        except APIError as e:
            if e.status_code != 409 or time.monotonic() > deadline:
                return  # best effort: the build's own error is the one to report
            time.sleep(0.5)


# BuildKit is reached through a docker CLI, since docker-py speaks only the classic builder: the one
# on PATH, else the docker.io package's (20.10: BuildKit built in). A newer CLI builds with BuildKit
# only through its buildx plugin, and without that plugin `DOCKER_BUILDKIT=1 docker build --help`
# already fails: that is the probe.
BUILDKIT_CLIS = ("docker", "/usr/bin/docker")
BUILDKIT_ENV = {"DOCKER_BUILDKIT": "1"}
BUILDKIT_STEP = re.compile(r"#\d+ \[(?:[\w.-]+ )?(\d+/\d+)\] (.*)")  # "#6 [3/3] RUN ..."
BUILDKIT_OUTPUT = re.compile(r"#\d+ \d+\.\d+ (.*)")  # "#6 0.189 what the step printed"
BUILDKIT_ERROR = re.compile(r"#\d+ ERROR: (.*)")


def buildkit_cli() -> str:
    """A docker CLI that builds with BuildKit, or one line saying how to get one."""
    env = {**os.environ, **BUILDKIT_ENV}
    for name in BUILDKIT_CLIS:
        path = shutil.which(name)
        if path and subprocess.run([path, "build", "--help"], env=env, capture_output=True).returncode == 0:
            return path
    raise DockerUnavailable(
        "no docker CLI here builds with BuildKit (DOCKER_BUILDKIT=1): install the docker.io "
        "package's (`apt-get install docker.io`: /usr/bin/docker), or the buildx plugin of yours"
    )


def build_with_buildkit(client, spec: BuildSpec, log: Callable[[str], None], verbose: bool = False) -> str:
    """Build spec with BuildKit (through buildkit_cli) into the engine's image store; returns the
    image id. Faster for a big RUN layer: the CPU stand-in base (3.25 GB in one layer) built in
    92-93 s with it and in 119-124 s with the classic builder (two runs each, same Dockerfile, 2
    cores). On failure raises BuildFailed; BuildKit tags nothing and leaves no image or container.
    The image must land in client's engine: a CLI whose context is another engine fails here."""
    with tempfile.TemporaryDirectory(prefix="gemma4-buildkit-") as tmp:
        iidfile = Path(tmp) / "iid"
        argv = spec.argv(buildkit_cli())
        argv[2:2] = ["--progress=plain", "--iidfile", str(iidfile)]
        step, error, last, tail = None, None, "", deque(maxlen=LOG_TAIL)
        with subprocess.Popen(
            argv,
            cwd=spec.context,
            env={**os.environ, **BUILDKIT_ENV},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        ) as proc:
            for raw in proc.stdout:
                line = ANSI.sub("", raw).rstrip()
                last = line or last
                if m := BUILDKIT_STEP.fullmatch(line):
                    if f"Step {m.group(1)} : {m.group(2)}" != step:  # plain progress repeats a step's name
                        step = f"Step {m.group(1)} : {m.group(2)}"
                        log(f"  {step}")
                        tail.clear()
                elif m := BUILDKIT_OUTPUT.fullmatch(line):
                    tail.append(m.group(1))
                    if verbose:
                        log(f"    {m.group(1)}")
                elif line.endswith(" CACHED") and step:
                    log("    CACHED")
                elif m := BUILDKIT_ERROR.fullmatch(line):
                    error = m.group(1)
        if proc.returncode != 0:
            raise BuildFailed(spec.tag, step, error or last or f"docker build exited {proc.returncode}", list(tail))
        image_id = iidfile.read_text().strip() if iidfile.is_file() else ""
    if not image_id or local_image(client, image_id) is None:
        raise BuildFailed(
            spec.tag,
            step,
            f"{argv[0]} reported success, but the image is not in the engine build.py talks to: point the "
            "CLI's context and DOCKER_HOST at the same daemon",
            list(tail),
        )
    return image_id
