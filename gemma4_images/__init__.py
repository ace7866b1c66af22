"""gemma4-images: targets.yaml turned into pinned, tested images, in stages. Each package imports
only from the ones above it in this list (tests/unit/test_layers.py holds it to that):

- spec: what to build, read from targets.yaml, the recipes and vLLM's release (no engine, no network)
- generate: text made from the spec (Dockerfiles, recipes, FIXES.md, the bake file, Kubernetes)
- build: the Docker engine and what it makes (bases, wheelhouses, images, pins, probes of an image)
- check: images run and judged (the server harness, the smoke checks, traffic, `run` lines)
- publish: what leaves the machine and what proves it (push, SBOM, provenance, signatures, verify)
- bench: the measured costs (`make bench`, BENCHMARKS.md)
- cli: the commands (build.py), the top floor
"""
