"""The smoke's kept compile cache (smoke.compile_cache_dir): one folder per target in the machine
cache, owned by the container user that writes it, or none at all when that cannot be arranged."""

import os

import pytest

from gemma4_images import smoke


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMA4_CACHE", str(tmp_path))
    return tmp_path


def test_the_folder_belongs_to_the_numeric_smoke_user(cache):
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another uid needs root")
    path = smoke.compile_cache_dir("xeon6", "2000")
    assert path == cache / "smoke-compile" / "xeon6" and path.stat().st_uid == 2000


def test_a_root_container_needs_no_change_of_owner(cache):
    path = smoke.compile_cache_dir("xeon6", None)
    assert path.is_dir() and path.stat().st_uid == os.geteuid()


def test_a_user_name_gets_no_cache_and_a_note(capsys):
    # A name means nothing on the host: rather no cache than a folder the container cannot write.
    assert smoke.compile_cache_dir("xeon6", "vllm") is None
    assert "no compile cache" in capsys.readouterr().err
