"""The image's entrypoint (image/gemma4_serve.py) loaded as a module, so the host composes
launches and labels with exactly the code the image runs."""
import importlib.util
import sys

from .matrix import ROOT

_PATH = ROOT / "image" / "gemma4_serve.py"
_spec = importlib.util.spec_from_file_location("gemma4_serve", _PATH)
gemma4_serve = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("gemma4_serve", gemma4_serve)
_spec.loader.exec_module(gemma4_serve)

BUILD_FACTS = gemma4_serve.BUILD_FACTS
compose = gemma4_serve.compose
UsageError = gemma4_serve.UsageError
