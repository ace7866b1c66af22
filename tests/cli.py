"""The tests' one way to run the command line as a user does: `python build.py ARGS` in its own
process, so its exit code, stdout and stderr are exactly what the user would see."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def command(*args: str, cwd: Path | str = ROOT) -> list[str]:
    """The argv: the build.py in cwd when it has one (a test's copy of the tree), else the checkout's."""
    script = "build.py" if (Path(cwd) / "build.py").is_file() else str(ROOT / "build.py")
    return [sys.executable, script, *args]


def build_py(*args: str, env: dict | None = None, cwd: Path | str = ROOT) -> subprocess.CompletedProcess:
    """Run it to the end; text output captured."""
    return subprocess.run(command(*args, cwd=cwd), cwd=cwd, capture_output=True, text=True, env=env)
