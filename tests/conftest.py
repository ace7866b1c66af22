"""Markers: `integration` needs a Docker engine; `device` and one marker per target select the
accelerator tiers (`pytest -m gaudi2`); CI runs `-m "not device"`."""

import os

import pytest

from gemma4_images.build.docker_build import OFFLINE
from gemma4_images.spec import matrix
from testkit import tiny_gemma4

# Nothing the tests build asks a registry off this machine for a base (only a loopback one, as
# tests/integration/test_pin_registry.py runs): the stand-ins serve. Inherited by every command the
# tests run.
os.environ.setdefault(OFFLINE, "1")


def pytest_xdist_make_scheduler(config, log):
    """`make test`'s two lanes (tests/lanes.py): each lane one unit of work, so xdist's scope
    scheduler gives the two (the largest units) to the two workers first; everything else is a
    unit of one test."""
    from xdist.scheduler import LoadScopeScheduling

    from tests import lanes

    class Lanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lanes.lane(nodeid) or nodeid

    return Lanes(config, log)


def pytest_configure(config):
    for name in matrix.load().targets:
        config.addinivalue_line("markers", f"{name}: the {name} device tier")


def pytest_collection_modifyitems(items):
    """The publishing lane (tests/lanes.py PUBLISH): `make test-publish`, `pytest -m publish`."""
    from tests import lanes

    for item in items:
        if lanes.publishing(item.nodeid):
            item.add_marker(pytest.mark.publish)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A fresh tiny Gemma 4 (model + tokenizer, seed 0) for tests that inspect or copy it."""
    out = tmp_path_factory.mktemp("tiny-gemma4") / "model"
    tiny_gemma4.write_tiny_gemma4(out, seed=0)
    return out
