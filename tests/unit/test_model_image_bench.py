"""bench --model-image checks each disk before it writes anything: one line naming the disk, what it
needs and what is free (the cached folder it would remove counted as free)."""

from collections import namedtuple

import pytest

from gemma4_images.bench import model_image_fullsize as bench

GB = 10**9
Usage = namedtuple("Usage", "total used free")


class Engine:
    def __init__(self, root):
        self.root = str(root)

    def info(self):
        return {"DockerRootDir": self.root}


@pytest.fixture
def disk(tmp_path, monkeypatch):
    """One filesystem (the cache and Docker's root on it) with 40 GB free."""
    monkeypatch.setattr(bench, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(bench.shutil, "disk_usage", lambda where: Usage(100 * GB, 60 * GB, 40 * GB))
    return tmp_path


def test_short_disk_is_one_line_before_anything_is_written(disk):
    with pytest.raises(RuntimeError) as e:
        bench.preflight(Engine(disk), 13 * GB, None)  # 3 x 13 GB + the margin > 40 GB
    assert str(e.value) == (
        f"the model image at E2B's size needs 42.0 GB of free disk in {disk}; 40.0 GB (counting the cached "
        "folder it removes): remove images or caches first (`docker system df`)"
    )
    assert list(disk.iterdir()) == []


def test_the_cached_folder_counts_as_free(disk, monkeypatch):
    bench.preflight(Engine(disk), 12 * GB, None)  # 3 x 12 GB + the margin: 39 GB of 40
    monkeypatch.setattr(bench.shutil, "disk_usage", lambda where: Usage(100 * GB, 61 * GB, 39 * GB - 500))
    with pytest.raises(RuntimeError):
        bench.preflight(Engine(disk), 12 * GB, None)  # 500 bytes short
    folder = disk / "folder"
    folder.mkdir()
    (folder / "w.safetensors").write_bytes(b"\0" * 1000)
    bench.preflight(Engine(disk), 12 * GB, folder)  # the folder it removes makes up for them
