"""A smoke run stopped by a signal leaves no container behind: SIGINT, SIGTERM (what `timeout`, a
cancelled CI job and a Kubernetes Job send) and SIGHUP clean up at once; after SIGKILL, which no
process can catch, the next run removes the stray (owned.py). Containers are counted before and
after, through the real `build.py smoke` on the tiny CPU image."""

import signal
import subprocess
import time

import pytest

from gemma4_images.build import owned
from gemma4_images.spec import matrix
from tests import cli, signals

pytestmark = pytest.mark.integration


def everything(client) -> set[str]:
    """Every container this test session or its children started (all carry its session label,
    conftest's SESSION): a parallel lane's, or other work on the same engine, does not count."""
    return {c["Id"] for c in ids(client, {"label": f"{owned.SESSION_LABEL}={owned.session()}"})}


def ids(client, filters) -> list[dict]:
    """The engine's own list, one call: the SDK's containers.list inspects each container after
    listing it, and fails with NotFound when one goes in between (the smoke's short-lived probe
    containers do; seen in a two-lane run)."""
    return client.api.containers(all=True, filters=filters)


def started_smoke(client, tmp_path, wait_for: str):
    """`build.py smoke cpu --tiny` in the background, returned once its server container exists
    ("created") or has answered /health and the checks are under way ("checks")."""
    out = tmp_path / "smoke.log"
    proc = subprocess.Popen(
        cli.command("smoke", "cpu", "--tiny", "--report", str(tmp_path / "r.json")),
        cwd=matrix.ROOT,
        stdout=out.open("w"),
        stderr=subprocess.STDOUT,
        preexec_fn=signals.default_stop_signals,
    )
    label = {"label": f"{owned.LABEL}={owned.owner(proc.pid)}"}
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if ids(client, label) and (wait_for == "created" or "healthy after" in out.read_text()):
            time.sleep(2 if wait_for == "checks" else 0)  # into the checks, requests in flight
            return proc, label, out
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"the smoke run never got to {wait_for!r}:\n{out.read_text()[-3000:]}")


@pytest.mark.parametrize(
    "signum, wait_for",
    [(signal.SIGTERM, "checks"), (signal.SIGHUP, "created"), (signal.SIGINT, "created")],
    ids=["SIGTERM-during-checks", "SIGHUP-while-starting", "SIGINT-while-starting"],
)
def test_a_stopped_smoke_run_removes_its_server(client, cpu_image, tmp_path, signum, wait_for):
    before = everything(client)
    proc, label, out = started_smoke(client, tmp_path, wait_for)
    assert everything(client) - before, "the run's server is up"
    proc.send_signal(signum)
    assert proc.wait(timeout=120) == 128 + signum, out.read_text()[-3000:]
    assert everything(client) == before, "containers left behind"
    last = out.read_text().strip().splitlines()[-1]
    assert last.startswith(f"stopped by {signal.Signals(signum).name}; removed "), last


def test_after_sigkill_the_next_run_removes_the_stray_and_nothing_else(client, cpu_image, tmp_path):
    before = everything(client)
    # A container whose owner is alive (a process of ours that is not a smoke run) must survive.
    sleeper = subprocess.Popen(["sleep", "600"])
    alive = client.containers.create(cpu_image, ["true"], network_mode="none", labels=owned.labels(sleeper.pid))
    try:
        proc, label, _ = started_smoke(client, tmp_path, "created")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        stray = client.containers.list(all=True, filters=label)
        assert len(stray) == 1, "SIGKILL leaves the server: nothing in the process can remove it"
        r = cli.build_py("smoke", "cpu", "--image", "gemma4-e2b-test/no-such-image:x")
        assert r.returncode == 1 and "no local image gemma4-e2b-test/no-such-image:x" in r.stderr, r.stderr
        assert f"removed container {stray[0].name}: the run that started it is gone" in r.stderr, r.stderr
        assert everything(client) == before | {alive.id}, "the stray is gone, the live owner's container stays"
    finally:
        alive.remove(force=True)
        sleeper.kill()
        sleeper.wait()
    assert everything(client) == before
