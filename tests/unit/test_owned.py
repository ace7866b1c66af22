"""Who owns a container: the label's owner is judged gone only when it is (owned.py)."""

import os
import shutil
import signal
import socket
import subprocess

import pytest

from gemma4_images.build import owned


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
    host, machine, boot, namespace, pid, _ = value.split("/")
    assert (host, boot, pid) == (socket.gethostname(), owned._boot_id(), str(sleeper.pid))
    assert machine == owned._machine_id() and namespace == os.readlink("/proc/self/ns/pid")[5:-1]
    assert not owned.gone(value)
    sleeper.kill()
    sleeper.wait()
    assert owned.gone(value)


def test_a_reused_pid_is_not_the_owner(sleeper):
    *same, start = owned.owner(sleeper.pid).split("/")
    assert owned.gone("/".join([*same, str(int(start) - 1)]))


def test_another_boot_is_gone_other_machines_namespaces_and_unreadable_labels_are_left():
    host, machine, boot, ns, pid, start = owned.owner().split("/")
    other_boot = "00000000-0000-0000-0000-000000000000"
    assert not owned.gone(owned.owner())
    assert owned.gone(f"{host}/{machine}/{other_boot}/{ns}/{pid}/{start}")
    assert not owned.gone(f"not-{host}/{machine}/{other_boot}/{ns}/1/1"), "another host"
    assert not owned.gone(f"{host}/other-machine/{other_boot}/{ns}/1/1"), "the same name on another machine"
    # a run in another container (its own pid namespace, our host name and boot): its pid is not ours
    assert not owned.gone(f"{host}/{machine}/{boot}/1/999999999/1"), "another pid namespace"
    for unreadable in ("", "someone", f"{host}/{machine}/{boot}/{ns}/x/{start}", f"{host}/{boot}/{pid}/{start}"):
        assert not owned.gone(unreadable), unreadable


def test_a_process_proc_will_not_show_is_not_gone(monkeypatch):
    """hidepid or permissions: /proc/PID/stat unreadable is not 'no such process'."""
    host, machine, boot, ns, pid, start = owned.owner().split("/")
    monkeypatch.setattr(owned, "_start_ticks", lambda pid: owned.UNKNOWN)
    assert not owned.gone(f"{host}/{machine}/{boot}/{ns}/{pid}/{start}")


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


def test_a_signal_the_process_was_started_ignoring_stays_ignored():
    # `nohup build.py bench`: a closed terminal must not stop it.
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with owned.stopping():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) == owned._raise
            os.kill(os.getpid(), signal.SIGHUP)  # nothing happens
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_session_stamps_every_container_and_the_docker_run_line(monkeypatch):
    monkeypatch.delenv(owned.SESSION_ENV, raising=False)
    assert set(owned.labels()) == {owned.LABEL}
    monkeypatch.setenv(owned.SESSION_ENV, "ci-job-7")
    assert owned.labels()[owned.SESSION_LABEL] == "ci-job-7"
    flags = owned.cli_flags()
    assert flags[0::2] == ["--label", "--label"] and f"{owned.SESSION_LABEL}=ci-job-7" in flags
