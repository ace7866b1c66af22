"""The tests' loopback registry lives with the code that benchmarks use it too."""

from gemma4_images.publish.loopback import forget, registry, start_registry, stop_registry  # noqa: F401
