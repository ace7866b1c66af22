"""Who owns a container: the label's owner is judged gone only when it is (owned.py)."""

import os
import shutil
import signal
import socket
import subprocess

import pytest

from gemma4_images import owned


@pytest.fixture
def sleeper(tmp_path):
    """A live process whose command name has a space and a ')' in it, as /proc/PID/stat allows."""
    odd = tmp_path / "a) b"
    shutil.copy(shutil.which("sleep"), odd)
    proc = subprocess.Popen([str(odd), "600"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_live_owner_is_not_gone_and_a_dead_one_is(sleeper):
    value = owned.owner(sleeper.pid)
    assert value.split("/")[:3] == [socket.gethostname(), owned._boot_id(), str(sleeper.pid)]
    assert not owned.gone(value)
    sleeper.kill()
    sleeper.wait()
    assert owned.gone(value)


def test_a_reused_pid_is_not_the_owner(sleeper):
    host, boot, pid, start = owned.owner(sleeper.pid).split("/")
    assert owned.gone(f"{host}/{boot}/{pid}/{int(start) - 1}")


def test_another_boot_is_gone_another_host_and_unreadable_labels_are_left():
    host, boot, pid, start = owned.owner().split("/")
    assert not owned.gone(owned.owner())
    assert owned.gone(f"{host}/00000000-0000-0000-0000-000000000000/{pid}/{start}")
    assert not owned.gone(f"not-{host}/00000000-0000-0000-0000-000000000000/1/1")
    for unreadable in ("", "someone", f"{host}/{boot}/x/{start}", f"{host}/{boot}/{pid}"):
        assert not owned.gone(unreadable), unreadable


def test_a_stop_signal_raises_stopped_ignores_a_second_and_restores_the_handlers():
    before = {s: signal.getsignal(s) for s in owned.STOP_SIGNALS}
    with pytest.raises(owned.Stopped) as e, owned.stopping():
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()  # not reached: the handler raises at once
    assert e.value.signum == signal.SIGTERM and str(e.value) == "SIGTERM"
    assert {s: signal.getsignal(s) for s in owned.STOP_SIGNALS} == before


def test_during_the_clean_up_a_second_signal_is_ignored():
    with pytest.raises(owned.Stopped), owned.stopping():
        try:
            os.kill(os.getpid(), signal.SIGHUP)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # would raise again mid clean-up were it not ignored
            assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
