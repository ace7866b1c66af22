"""Whether this host can run another architecture's programs: what building or serving an image
for a platform that is not the host's needs (the RUN steps of its build, mmdebstrap's package
scripts, the container itself), through the kernel's binfmt_misc and qemu's user-mode emulator.
scripts/setup-emulation.sh makes a Debian host ready; each refusal here names it."""

from __future__ import annotations

import platform as host
import re
import subprocess
from pathlib import Path

from gemma4_images.spec.platforms import KNOWN, Platform

BINFMT = Path("/proc/sys/fs/binfmt_misc")
FIX = "run scripts/setup-emulation.sh as root"
# scripts/setup-emulation.sh sets up an x86_64 host for arm64 only; another host (an arm64 one
# building linux/amd64) registers the emulator its distribution ships, with the F flag.
FIX_ELSEWHERE = "install your distribution's qemu-user-static and binfmt-support (qemu {major}.{minor} or later)"
# qemu emulates an arm64 /proc/cpuinfo from 8.1 on (linux-user/aarch64/target_proc.h); before it
# the host's x86 one shows through, and PyPI's aarch64 torch segfaults at import (measured with
# bookworm's 7.2; scripts/setup-emulation.sh says more).
MIN_QEMU = (8, 1)


# The CPU qemu emulates for a container served here on another architecture: qemu's newest ("max")
# without SVE and SME. With them, code compiled at run time with -march=native takes torch's SVE
# headers and Debian bookworm's gcc 12 (the image's) stops on them (measured: the CPU sampler's
# inductor compile, "internal compiler error: Segmentation fault" at
# torch/include/ATen/cpu/vec/sve/vec_int.h:110), and numpy's float32 matmul (OpenBLAS's SVE
# kernels) comes out wrong. An older core without SVE is no answer either: on Neoverse N1 the
# worker died of an illegal instruction at the first request (vLLM's CPU kernels use the bf16
# extension, ARMv8.6). qemu reads QEMU_CPU from the environment of the program it runs.
SERVE_CPU = {"arm64": "max,sve=off,sme=off"}


class EmulationUnavailable(Exception):
    pass


def native(p: Platform) -> bool:
    return host.machine() == p.machine


def engine_platform(p: Platform) -> str | None:
    """The --platform a build or pull passes for p: none for the host's own (the engine's default),
    else p's name, so an arm64 build host makes linux/amd64 images when asked for them too."""
    return None if native(p) else p.name


def serve_env(architecture: str) -> dict[str, str]:
    """Environment for a container of an image of this architecture (Docker's name: arm64) served
    on this host: the emulated CPU when it is not the host's own, else nothing."""
    p = next((p for p in KNOWN.values() if p.architecture == architecture), None)
    if p is None or native(p) or architecture not in SERVE_CPU:
        return {}
    return {"QEMU_CPU": SERVE_CPU[architecture]}


def qemu_version(interpreter: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([interpreter, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"version (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def missing(p: Platform, binfmt: Path | None = None) -> str | None:
    """None when this host runs p's programs, natively or through a recent enough qemu; else one
    line naming what is wrong and the fix."""
    if native(p):
        return None
    binfmt = binfmt or BINFMT
    need = f"building or running {p.name} on this {host.machine()} host needs qemu"
    fix = FIX if host.machine() == "x86_64" else FIX_ELSEWHERE.format(major=MIN_QEMU[0], minor=MIN_QEMU[1])
    if not (binfmt / "status").is_file():
        return f"{need} through binfmt_misc, which is not mounted: {fix}"
    # `echo 0 > status` turns every entry off at once (binfmt-misc.rst, "status").
    if (binfmt / "status").read_text().strip() != "enabled":
        return f"{need} through binfmt_misc, which is turned off (its status is disabled): {fix}"
    entry = binfmt / f"qemu-{p.machine}"
    if not entry.is_file():
        return f"{need}'s {p.machine} emulator, which is not registered with binfmt_misc: {fix}"
    fields = dict(line.split(" ", 1) for line in entry.read_text().splitlines() if " " in line)
    if "enabled" not in entry.read_text().splitlines():
        return f"{need}: its {p.machine} emulator is registered but disabled: {fix}"
    # F (fix binary): the kernel opens the emulator when it is registered, so containers, which do
    # not have the host's file, can use it too (binfmt_misc(4), "flags").
    if "F" not in fields.get("flags:", ""):
        return f"{need}: its {p.machine} emulator is registered without the F flag, so containers cannot use it: {fix}"
    version = qemu_version(fields.get("interpreter", ""))
    if version is None or version < MIN_QEMU:
        found = "an unknown version" if version is None else "{}.{}".format(*version)
        return (
            f"{need} {MIN_QEMU[0]}.{MIN_QEMU[1]} or later (it emulates an arm64 /proc/cpuinfo, without which "
            f"torch crashes at import); {fields.get('interpreter')} is {found}: {fix}"
        )
    return None


def require(p: Platform) -> None:
    reason = missing(p)
    if reason:
        raise EmulationUnavailable(reason)
