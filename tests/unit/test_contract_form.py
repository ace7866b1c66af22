"""The image contract's form (spec/contract.py): every target renders at every release it is built
at, and its patterns say what they mean (read here with Python's re, whose syntax these use only
where it agrees with Go's RE2; container-structure-test itself reads them in
tests/integration/test_contract.py)."""

import json
import re
import shlex

import pytest
import yaml

from gemma4_images.spec import contract, matrix
from tests.cli import build_py


def all_targets():
    for version in matrix.releases():
        m = matrix.load(vllm=version)
        for name in m.targets:
            yield m, name


@pytest.mark.parametrize("m, name", list(all_targets()), ids=lambda v: getattr(v, "report_release", None) or v)
def test_every_target_at_every_release_has_a_contract(m, name):
    config = contract.config(m, name)
    assert config["schemaVersion"] == "2.0.0"
    (launch,) = [c for c in config["commandTests"] if c["args"] == ["--print-command"]]
    (pattern,) = launch["expectedOutput"]
    assert re.fullmatch(pattern, shlex.join(m.recipe_launch(name)) + "\n")
    assert not re.fullmatch(pattern, shlex.join(m.recipe_launch(name)) + " --enforce-eager\n")
    labels = {entry["key"]: entry["value"] for entry in config["metadataTest"]["labels"]}
    assert labels["io.gemma4-images.vllm-version"] == m.project.vllm_version
    assert labels["io.gemma4-images.fixes"] == ",".join(m.fixes(name))


def fixes_record(states: dict[str, str]) -> str:
    """fixes.json as apply_all.py writes it: keys sorted, two-space indent."""
    fixes = [
        {"files": {"a.py": {"after": "1", "before": "0"}}, "name": n, "package": "vllm", "port": "p", "state": s}
        for n, s in states.items()
    ]
    return json.dumps({"fixes": fixes}, indent=2, sort_keys=True)


def test_the_fixes_patterns_want_each_fix_applied():
    m = matrix.load_default("xeon6")
    (content,) = contract.config(m, "xeon6")["fileContentTests"]
    fixes = m.fixes("xeon6")
    applied = fixes_record({f: "applied" for f in fixes})
    assert all(re.search(p, applied) for p in content["expectedContents"])
    by_base = fixes_record({f: "already-applied" for f in fixes})
    assert all(re.search(p, by_base) for p in content["expectedContents"])
    one_failed = fixes_record({**{f: "applied" for f in fixes}, fixes[1]: "fails"})
    missing = [p for p in content["expectedContents"] if not re.search(p, one_failed)]
    assert len(missing) == 1 and fixes[1] in missing[0].replace("\\", "")


def test_literals_escape_only_what_re2_reads_as_syntax():
    assert contract._literal("a b-c.d (e) [f] $x ^y |z *+?{}\\") == r"a b-c\.d \(e\) \[f\] \$x \^y \|z \*\+\?\{\}\\"


def test_the_command_writes_the_release_asked_for(tmp_path):
    run = build_py("contract", "xeon6", "--vllm", "0.32.0", "--out", str(tmp_path / "c.yaml"))
    assert run.returncode == 0, run.stderr
    labels = {e["key"]: e["value"] for e in yaml.safe_load((tmp_path / "c.yaml").read_text())["metadataTest"]["labels"]}
    assert labels["org.opencontainers.image.version"] == "xeon6-v0.32.0"
    bad = build_py("contract", "xeon7", "--out", str(tmp_path / "bad.yaml"))
    assert bad.returncode == 2 and not (tmp_path / "bad.yaml").exists()


def test_a_path_it_cannot_write_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    run = build_py("contract", "xeon6", "--out", str(blocker / "c.yaml"))
    assert run.returncode == 1 and run.stderr.startswith(f"error: cannot write {blocker / 'c.yaml'}: ")
    assert run.stderr.count("\n") == 1 and blocker.read_text() == ""
