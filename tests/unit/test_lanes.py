"""`make test`'s lanes (tests/lanes.py) name real modules, and every integration module has one."""

from pathlib import Path

from tests import lanes

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"


def test_every_named_module_exists():
    # A renamed module would silently move to the engine lane (or lose its lane): name it again.
    modules = {p.name for p in INTEGRATION.glob("test_*.py")}
    assert (lanes.SERVE | lanes.NO_ENGINE) - modules == set()


def test_every_publishing_module_exists_and_is_marked():
    # A renamed module would silently leave `make test-publish`.
    modules = {p.name for p in INTEGRATION.parent.glob("*/test_*.py")}
    assert lanes.PUBLISH - modules == set()
    assert lanes.publishing("tests/unit/test_sbom.py::test_x") and not lanes.publishing("tests/unit/test_k8s.py::t")


def test_each_integration_module_is_in_one_lane_and_unit_tests_in_none():
    got = {p.name: lanes.lane(f"tests/integration/{p.name}::test_x") for p in INTEGRATION.glob("test_*.py")}
    assert {n for n, lane in got.items() if lane == "serve"} == lanes.SERVE
    assert {n for n, lane in got.items() if lane is None} == lanes.NO_ENGINE
    assert lanes.lane("tests/unit/test_matrix.py::test_x") is None
    assert lanes.lane("tests/integration/test_smoke_cpu.py::test_each[logit_bias]") == "serve"
