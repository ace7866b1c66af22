"""python -m testkit.e2b_shape [OUT_DIR] [--seed N]: write the folder (or the cached one) and print its summary."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import cache, folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Random weights of E2B's shape (not Gemma 4), about 10.2 GB.")
    parser.add_argument("out_dir", nargs="?", type=Path, help="where to write; default: the machine cache")
    parser.add_argument("--seed", type=int, default=cache.SEED)
    args = parser.parse_args(argv)
    try:
        if args.out_dir:
            summary = cache.write_whole(args.out_dir, args.seed) | {"out_dir": str(args.out_dir)}
        else:
            out = cache.ensure(args.seed)
            summary = json.loads((out / folder.SUMMARY).read_text()) | {"out_dir": str(out)}
    except cache.NotEnoughRoom as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
