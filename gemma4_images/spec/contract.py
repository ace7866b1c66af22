"""What an image promises, as data a consumer can check without this project's Python: a
container-structure-test config (schemaVersion 2.0.0, github.com/GoogleContainerTools/
container-structure-test) rendered from targets.yaml and the target's release. `build` writes it
beside the image's SBOM and provenance (reports/contract-<target>[…].cst.yaml):

    container-structure-test test --image IMAGE --config reports/contract-xeon6-v0.32.0.cst.yaml

Only what every build of the target at that release shares is in it (not the commit, the build
time or the base digest, which the provenance records)."""

from __future__ import annotations

import re
import shlex

from gemma4_images.spec import facts
from gemma4_images.spec.facts import RECORDS
from gemma4_images.spec.matrix import Matrix

ENTRYPOINT = "/usr/local/bin/gemma4-serve"
# Labels every build of a target at one release carries alike (facts.BUILD_FACTS holds them all).
STABLE_LABELS = (
    "org.opencontainers.image.title",
    "org.opencontainers.image.source",
    "org.opencontainers.image.version",
    "io.gemma4-images.target",
    "io.gemma4-images.model",
    "io.gemma4-images.vllm-version",
    "io.gemma4-images.fixes",
)


def _literal(text: str) -> str:
    """text as a Go (RE2) regexp: only its metacharacters escaped (RE2 refuses an escaped space)."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", text)


def _exactly(text: str) -> str:
    """A Go regexp matching text as the whole output (one trailing newline allowed)."""
    return "^" + _literal(text) + "\\n?$"


def _python(name: str, script: str, expected: str) -> dict:
    return {"name": name, "command": "python3", "args": ["-c", script], "expectedOutput": [_exactly(expected)]}


def config(matrix: Matrix, name: str) -> dict:
    """The container-structure-test config of target name's image at matrix's release."""
    target, family = matrix.targets[name], matrix.families[matrix.targets[name].family]
    values = facts.facts(matrix, name, base_name="", base_digest="")
    labels = {label: values[facts.BUILD_FACTS[label]] for label in STABLE_LABELS}
    commands = [
        {
            "name": "the launch is the recipe's",
            "command": "gemma4-serve",
            "args": ["--print-command"],
            "expectedOutput": [_exactly(shlex.join(matrix.recipe_launch(name)))],
        },
        {
            # vLLM's version, the launch parsed by vLLM's own parser, every file a flag names
            "name": "the build's self-check passes",
            "command": "gemma4-serve",
            "args": ["--self-check"],
            "exitCode": 0,
            "excludedOutput": ["."],
        },
    ]
    if family.pypi:
        script = f"import importlib.metadata as m; print(m.version({family.pypi[0]!r}).split('+')[0])"
        commands.append(
            _python(f"{family.pypi[0]} is vLLM {matrix.project.vllm_version}", script, matrix.project.vllm_version)
        )
    pinned = [r for r in matrix.audio_extras_of(name) if "==" in r] if target.audio else []
    if pinned:
        names = [r.split("==")[0] for r in pinned]
        script = f"import importlib.metadata as m; print(' '.join(n + '==' + m.version(n) for n in {names!r}))"
        commands.append(_python("the audio extras are the pinned ones", script, " ".join(pinned)))
    files = [
        {"name": "the entrypoint", "path": ENTRYPOINT, "shouldExist": True, "isExecutableBy": "any"},
        {"name": "the recipe", "path": f"{RECORDS}/recipe.json", "shouldExist": True},
        {"name": "the build's record", "path": f"{RECORDS}/build.json", "shouldExist": True},
    ]
    contents = []
    fixes = matrix.fixes(name)
    if fixes:
        files.append({"name": "the fixes' record", "path": f"{RECORDS}/fixes.json", "shouldExist": True})
        # apply_all.py's record: keys sorted, each fix's state applied (or already applied by the base)
        contents.append(
            {
                "name": "every fix of the target is applied",
                "path": f"{RECORDS}/fixes.json",
                "expectedContents": [
                    f'"name": "{_literal(fix)}",(\\s*"[a-z_]+": "[^"]*",)*?\\s*"state": "(already-)?applied"'
                    for fix in fixes
                ],
            }
        )
    return {
        "schemaVersion": "2.0.0",
        "metadataTest": {
            "entrypoint": ["gemma4-serve"],
            "cmd": [],
            "workdir": "/opt/gemma4-e2b",
            "envVars": [{"key": k, "value": v} for k, v in family.env.items()],
            "labels": [{"key": k, "value": v} for k, v in labels.items()],
        },
        "fileExistenceTests": files,
        "fileContentTests": contents,
        "commandTests": commands,
    }
