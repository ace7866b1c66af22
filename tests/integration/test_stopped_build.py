"""A `build.py build` stopped by SIGTERM or SIGINT in the middle leaves neither the image of its last
finished step (`<none>`) nor the container of the step it was in, and exits 128 + N after one line,
as a failed build leaves nothing. In the engine lane (tests/lanes.py): it builds."""

import shutil
import signal
import subprocess
import time
import uuid

import pytest

from gemma4_images.spec import matrix
from tests import cli, signals

pytestmark = pytest.mark.integration


# A build with a step that finishes and a slow one: stopped during the slow one, the first's image
# is what the engine would keep (`<none>`), and the slow one's container what it runs.
SLOW_BUILD = """\
ARG BASE_IMAGE
FROM ${{BASE_IMAGE}}
LABEL io.gemma4-images.test={label}
RUN echo one > /one
RUN sleep 600
"""


def containers(client, label: dict) -> list[dict]:
    return client.api.containers(all=True, filters=label)


def tree_building(tmp_path, dockerfile: str):
    """A copy of what `build.py build cpu` reads, its Dockerfile.cpu replaced by dockerfile."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for item in ("build.py", "gemma4_images", "targets.yaml", "releases", "image", "patches", "testkit"):
        src = matrix.ROOT / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tree / item)
    (tree / "Dockerfile.cpu").write_text(dockerfile)
    return tree


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_build_leaves_no_image_and_no_container(client, rootfs, tmp_path, signum):
    value = f"stopped-build-{uuid.uuid4().hex[:12]}"  # nothing cached: every step is this build's
    label = {"label": f"io.gemma4-images.test={value}"}
    tree = tree_building(tmp_path, SLOW_BUILD.format(label=value))
    out = tmp_path / "build.log"
    args = ["build", "cpu", "--tiny", "--no-reports", "--base-image", rootfs, "--tag", "gemma4-e2b-test/stopped:x"]
    proc = subprocess.Popen(
        cli.command(*args, "--build-arg", "GEMMA4_AUDIO_EXTRAS=", cwd=tree),
        cwd=tree,
        stdout=out.open("w"),
        stderr=subprocess.STDOUT,
        preexec_fn=signals.default_stop_signals,
    )
    deadline = time.monotonic() + 600
    while not ("RUN sleep 600" in out.read_text() and containers(client, label)):  # the slow step runs
        assert proc.poll() is None and time.monotonic() < deadline, out.read_text()[-3000:]
        time.sleep(0.2)
    proc.send_signal(signum)
    sent = time.monotonic()
    assert proc.wait(timeout=120) == 128 + signum, out.read_text()[-3000:]
    print(f"the build exited {proc.returncode} {time.monotonic() - sent:.1f} s after {signal.Signals(signum).name}")
    last = out.read_text().strip().splitlines()[-1]
    assert last.startswith(f"stopped by {signal.Signals(signum).name}; removed "), last
    assert containers(client, label) == [], "the build's container is left"
    assert client.api.images(all=True, filters=label) == [], "the build's images are left (<none>)"
