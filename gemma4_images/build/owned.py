"""Containers this tool starts, and who owns them.

Each one carries LABEL naming the process that started it: host name, machine id, boot, pid
namespace, pid and the pid's start time (so a reused pid is not taken for its owner, and a run in
another container or on another machine sharing the daemon is never judged by our /proc).
A run stopped by SIGINT, SIGTERM or SIGHUP removes its own (`stopping`); after SIGKILL, a crash
or a power cut nothing in the process can, so the next `smoke` or `bench` (and every test
session) removes those whose owner is gone (`reap`): what testcontainers' Ryuk does, without an
image to pull. A container owned by another machine, another pid namespace, or a live process
here, is never touched."""

from __future__ import annotations

import contextlib
import os
import signal
import socket

LABEL = "io.gemma4-images.owner"
# Runs that share one engine (parallel test lanes, CI jobs on one daemon) set GEMMA4_SESSION; every
# container such a run or its children start carries it, so each can tell its own containers from
# the others' (`docker ps --filter label=io.gemma4-images.session=ID`) while both are alive.
SESSION_LABEL = "io.gemma4-images.session"
SESSION_ENV = "GEMMA4_SESSION"

# The signals that stop a run and should clean up: Ctrl-C, what `timeout`, a cancelled CI job and
# a Kubernetes Job send, and a closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def _machine_id() -> str:
    try:
        with open("/etc/machine-id") as f:
            return f.read().strip() or "none"
    except OSError:
        return "none"


def _pid_namespace() -> str:
    """This process's pid namespace (`pid:[4026531836]`): a pid means something only inside it."""
    return os.readlink("/proc/self/ns/pid").removeprefix("pid:[").removesuffix("]")


UNKNOWN = "unknown"


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (proc(5): /proc/PID/stat field 22),
    None when there is no such process, UNKNOWN when /proc does not say (hidepid, permissions)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return UNKNOWN
    # The command name (field 2) is in parentheses and may hold spaces or ')': split after the last.
    return stat.rsplit(")", 1)[1].split()[19]


def owner(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return "/".join(
        (socket.gethostname(), _machine_id(), _boot_id(), _pid_namespace(), str(pid), str(_start_ticks(pid)))
    )


def session() -> str | None:
    return os.environ.get(SESSION_ENV) or None


def labels(pid: int | None = None) -> dict[str, str]:
    """For every container this process (or pid) creates (docker-py or testcontainers `labels=`)."""
    shared = session()
    return {LABEL: owner(pid), **({SESSION_LABEL: shared} if shared else {})}


def cli_flags() -> list[str]:
    """The same labels for a `docker run` command line."""
    return [flag for key, value in labels().items() for flag in ("--label", f"{key}={value}")]


def gone(value: str) -> bool:
    """The owner a label names has stopped: this host and machine, and another boot, or (same boot
    and pid namespace) its pid is no process or another one. A label this code cannot read, another
    machine's or another pid namespace's, or a process /proc will not show, is not ours to judge."""
    parts = value.split("/")
    if len(parts) != 6 or not parts[4].isdigit():
        return False
    host, machine, boot, namespace, pid, start = parts
    if (host, machine) != (socket.gethostname(), _machine_id()):
        return False
    if boot != _boot_id():
        return True
    if namespace != _pid_namespace():
        return False
    now = _start_ticks(int(pid))
    return now != UNKNOWN and now != start


def _remove(client, filters: dict, keep) -> list[str]:
    from docker.errors import NotFound

    removed = []
    for container in client.containers.list(all=True, filters=filters):
        if keep(container):
            continue
        with contextlib.suppress(NotFound):  # removed meanwhile (its own `--rm`, or a parallel reap)
            container.remove(force=True)
            removed.append(container.name)
    return removed


def reap(client, log) -> int:
    """Remove containers whose owner is gone, one line each; the number removed."""
    removed = _remove(client, {"label": LABEL}, lambda c: not gone(c.labels.get(LABEL, "")))
    for name in removed:
        log(f"removed container {name}: the run that started it is gone (killed, or its machine restarted)")
    return len(removed)


def remove_mine(client) -> int:
    return len(_remove(client, {"label": f"{LABEL}={owner()}"}, lambda c: False))


class Stopped(BaseException):
    """A stop signal, raised in the main thread so every `finally` runs. A BaseException, as
    KeyboardInterrupt is: no `except Exception` on the way may swallow it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum, frame):
    # The first signal starts the clean-up; a second one (an impatient `kill`, a CI runner's
    # repeat) must not cut it short. SIGKILL still can: that is what `reap` is for.
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    raise Stopped(signum)


@contextlib.contextmanager
def stopping():
    """Turn the stop signals into Stopped for the body; the previous handlers come back after. A
    signal this process was started ignoring (`nohup`, a background job's SIGINT) stays ignored."""
    previous = {s: signal.signal(s, _raise) for s in STOP_SIGNALS if signal.getsignal(s) != signal.SIG_IGN}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
