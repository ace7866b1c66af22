"""The image's entrypoint (image/gemma4_serve.py) loaded as a module, so the host composes
launches and labels with exactly the code the image runs."""
from .matrix import ROOT
from .modules import load_file

gemma4_serve = load_file("gemma4_serve", ROOT / "image" / "gemma4_serve.py")

BUILD_FACTS = gemma4_serve.BUILD_FACTS
compose = gemma4_serve.compose
UsageError = gemma4_serve.UsageError
