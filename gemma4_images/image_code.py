"""The image's own Python files, loaded on the host as modules, so the host composes launches and
checks with exactly the code the images run: gemma4_serve is image/gemma4_serve.py (the
entrypoint, `gemma4-serve` in every image)."""

from .matrix import ROOT
from .modules import load_file

gemma4_serve = load_file("gemma4_serve", ROOT / "image" / "gemma4_serve.py")
