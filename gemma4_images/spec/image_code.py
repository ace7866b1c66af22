"""The image's own Python files, loaded on the host as modules, so the host composes launches and
checks with exactly the code the images run: gemma4_serve is image/gemma4_serve.py (the
entrypoint, `gemma4-serve` in every image), gemma4_bench is image/gemma4_bench.py (the serving
harness, `gemma4-bench`; the host uses its table helpers)."""

from gemma4_images.spec.matrix import ROOT
from gemma4_images.spec.modules import load_file

gemma4_serve = load_file("gemma4_serve", ROOT / "image" / "gemma4_serve.py")
gemma4_bench = load_file("gemma4_bench", ROOT / "image" / "gemma4_bench.py")
