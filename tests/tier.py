"""A test tier CI runs only when what it proves has changed since it last passed (the arm64 tier
under qemu, the full-size tier): its inputs' digest is kept in a committed record with the figures
the tier wrote, and `--current` compares it with the inputs now.

    python -m tests.<tier> --current   exit 0 if the record matches the inputs, 1 naming the tier if not,
                                       2 if the inputs cannot be read
    python -m tests.<tier> --record    write the record for the inputs now (after the tier passed)
    python -m tests.<tier> --clean     remove the tens of GB the tier wrote (after it ran, passed or not)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class TierError(Exception):
    """The inputs could not be read: neither "current" nor "changed" (exit 2, not 1)."""


@dataclass
class Tier:
    name: str  # as the messages say it
    record_path: Path  # committed: the inputs' digest as of the last pass, and its figures
    figures_path: Path  # what the tier's tests wrote during the pass
    inputs: list[str]  # files and folders below root whose bytes the tier depends on
    facts: Callable[[], dict] = dict  # the parts of targets.yaml it depends on
    after_record: Callable[[dict], None] = lambda data: None
    clean: Callable[[], list[str]] = list  # removes what the tier wrote; says what went
    root: Path = ROOT

    def files(self, rel: str) -> list[Path]:
        """An input's files git would commit (tracked, or new and not ignored): bytecode and other
        leftovers a run writes beside them must not make a clean clone's digest differ."""
        ls = ["git", "-C", str(self.root), "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", rel]
        out = subprocess.run(ls, capture_output=True)
        if out.returncode != 0:
            raise TierError(f"git cannot list {rel} in {self.root}: {out.stderr.decode().strip()[:200]}")
        return sorted(p for f in out.stdout.decode().split("\0") if f and (p := self.root / f).is_file())

    def digest(self) -> str:
        h = hashlib.sha256()
        for rel in self.inputs:
            for f in self.files(rel):
                h.update(str(f.relative_to(self.root)).encode() + b"\0" + f.read_bytes() + b"\0")
        h.update(json.dumps(self.facts(), sort_keys=True).encode())
        return h.hexdigest()

    def current(self) -> bool:
        try:
            return json.loads(self.record_path.read_text())["inputs"] == self.digest()
        except (OSError, ValueError, KeyError):
            return False

    def record(self) -> dict:
        git = ["git", "-C", str(self.root)]
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        # The digest is what counts; the commit says where, "-dirty" when the tree had changes
        # (record again once they are committed: the digest stays the same).
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
        data = {
            "inputs": self.digest(),
            "passed_at_commit": commit + ("-dirty" if dirty.stdout.strip() else ""),
            "figures": json.loads(self.figures_path.read_text()) if self.figures_path.is_file() else {},
        }
        self.record_path.write_text(json.dumps(data, indent=1) + "\n")
        self.after_record(data)
        return data

    def main(self, argv=None) -> int:
        parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        group = parser.add_mutually_exclusive_group(required=True)
        group.add_argument("--current", action="store_true")
        group.add_argument("--record", action="store_true")
        group.add_argument("--clean", action="store_true")
        args = parser.parse_args(argv)
        shown = self.record_path.relative_to(self.root)
        if args.clean:
            print("\n".join(f"removed {what}" for what in self.clean()) or f"the {self.name} tier left nothing")
            return 0
        if args.record:
            print(f"wrote {shown}: {self.record()['figures']}")
            return 0
        try:
            current = self.current()
        except TierError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if current:
            print(f"the {self.name} tier passed on these inputs ({shown}): not run again")
            return 0
        print(f"the {self.name} tier's inputs changed since it last passed ({shown}): run it")
        return 1
