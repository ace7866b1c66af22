#!/usr/bin/env python3
"""gemma4-images' command line, run from a checkout: `python build.py --help`. The same CLI is the
`gemma4-images` console script of `pip install -e .` (pyproject.toml); it lives in gemma4_images/cli.py."""

from gemma4_images.cli import main

if __name__ == "__main__":
    main()
