"""Markers: `integration` needs a Docker engine; `device` and one marker per target select the
accelerator tiers (`pytest -m gaudi2`); CI runs `-m "not device"`."""

import pytest

from gemma4_images.spec import matrix
from testkit import tiny_gemma4


def pytest_configure(config):
    for name in matrix.load().targets:
        config.addinivalue_line("markers", f"{name}: the {name} device tier")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A fresh tiny Gemma 4 (model + tokenizer, seed 0) for tests that inspect or copy it."""
    out = tmp_path_factory.mktemp("tiny-gemma4") / "model"
    tiny_gemma4.write_tiny_gemma4(out, seed=0)
    return out
