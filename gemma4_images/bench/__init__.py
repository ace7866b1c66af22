"""The measured costs behind `make bench`: rebuilds, image overhead, start-up, load, the serving
harness, the quick start and the stand-ins, written to BENCHMARKS.md."""
