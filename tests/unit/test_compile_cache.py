"""The smoke's kept compile cache (server.compile_cache_dir): one folder per image id under a
root-only folder per target in the machine cache, owned by the container user that writes it, the
most recently used few kept; or none at all when the owner cannot be arranged."""

import os

import pytest

from gemma4_images.check import server

IMAGE = "sha256:" + "ab" * 32


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMA4_CACHE", str(tmp_path))
    return tmp_path


def test_one_folder_per_image_owned_by_the_numeric_smoke_user(cache):
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another uid needs root")
    path = server.compile_cache_dir("xeon6", IMAGE, "2000")
    assert path == cache / "smoke-compile" / "xeon6" / ("ab" * 8) and path.stat().st_uid == 2000
    # Nobody but root gets through to it on the host.
    assert (path.parent.stat().st_mode & 0o777) == 0o700 and path.parent.stat().st_uid == 0
    other = server.compile_cache_dir("xeon6", "sha256:" + "cd" * 32, "2000")
    assert other != path and path.is_dir()


def test_only_the_most_recently_used_folders_stay(cache):
    first = server.compile_cache_dir("xeon6", IMAGE, None)
    (first / "entry").write_text("compiled")
    for n in range(server.KEPT_COMPILE_CACHES):
        os.utime(first, (1, 1))  # the oldest from here on
        server.compile_cache_dir("xeon6", f"sha256:{n:02d}" + "e" * 62, None)
    assert not first.exists()
    assert len(list(first.parent.iterdir())) == server.KEPT_COMPILE_CACHES


def test_a_root_container_needs_no_change_of_owner(cache):
    path = server.compile_cache_dir("xeon6", IMAGE, None)
    assert path.is_dir() and path.stat().st_uid == os.geteuid()


def test_a_user_name_gets_no_cache_and_a_note(capsys):
    # A name means nothing on the host: rather no cache than a folder the container cannot write.
    assert server.compile_cache_dir("xeon6", IMAGE, "vllm") is None
    assert "no compile cache" in capsys.readouterr().err
