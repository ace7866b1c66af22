"""python -m testkit.e2b_shape [OUT_DIR] [--seed N]: write the folder (or the cached one) and print its summary;
--remove: remove every cached one."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import cache, folder


def summary(out_dir: Path | None, seed: int) -> dict:
    if out_dir:
        return cache.write_whole(out_dir, seed) | {"out_dir": str(out_dir)}
    out = cache.ensure(seed)
    return json.loads((out / folder.SUMMARY).read_text()) | {"out_dir": str(out)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Random weights of E2B's shape (not Gemma 4), about 10.2 GB.")
    parser.add_argument("out_dir", nargs="?", type=Path, help="where to write; default: the machine cache")
    parser.add_argument("--seed", type=int, default=cache.SEED)
    parser.add_argument("--remove", action="store_true", help="remove every cached folder (10 GB each) instead")
    args = parser.parse_args(argv)
    if args.remove:
        print("\n".join(f"removed {path}" for path in cache.remove()) or "no cached folder")
        return
    try:
        print(json.dumps(summary(args.out_dir, args.seed), indent=2))
    except cache.NotEnoughRoom as error:
        # SystemExit with a message: printed on stderr as one line, exit status 1.
        raise SystemExit(f"error: {error}") from None


if __name__ == "__main__":
    main()
