"""Load a Python file that is not part of a package (the image's entrypoint, the pack's tools)
as a module, so the host runs exactly the code the images and the recipe run."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_file(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)  # dataclasses and pickling look their module up by name
    spec.loader.exec_module(module)
    return module
