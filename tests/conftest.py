"""Markers: `integration` needs a Docker engine; `device` and one marker per target select the
accelerator tiers (`pytest -m gaudi2`); CI runs `-m "not device"`."""
from gemma4_images import matrix


def pytest_configure(config):
    for name in matrix.load().targets:
        config.addinivalue_line("markers", f"{name}: the {name} device tier")
