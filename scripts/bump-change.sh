#!/usr/bin/env bash
# The release pipelines' scheduled step: which families' vLLM is behind the package index
# (`build.py bump --check`), and for each, `build.py bump FAMILY --vllm NEWEST` committed on a
# branch of its own, bump/<family>-vllm-<version>; prints the branches, from which the CI system's
# step opens a change. A bump that stops (a fix to port by hand, a merge to accept) commits its log
# under bumps/ instead, so the change says what a person must do. Leaves HEAD where it was.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PY:-.venv/bin/python}
mkdir -p .build
status=0
"$py" build.py bump --check > .build/bump-check.txt || status=$?
[ "$status" -le 1 ] || { cat .build/bump-check.txt >&2; exit "$status"; }
start=$(git rev-parse HEAD)
# `FAMILY DIST here V index NEWEST BEHIND`: a family is behind when its vLLM is (its first line).
awk '$NF == "BEHIND" && !seen[$1]++ {print $1, $6}' .build/bump-check.txt | while read -r family version; do
  branch="bump/$family-vllm-$version"
  git switch -q -C "$branch" "$start"
  if "$py" build.py bump "$family" --vllm "$version" > ".build/bump-$family.log" 2>&1; then
    git add -A  # what bump wrote (it starts only on a clean tree)
    git commit -q -m "vLLM $version for the $family family (build.py bump)" -m "$(tail -40 ".build/bump-$family.log")"
  else
    mkdir -p bumps && cp ".build/bump-$family.log" "bumps/$family-vllm-$version.log"
    git add "bumps/$family-vllm-$version.log"
    git commit -q -m "vLLM $version for the $family family: bump stopped" -m "$(tail -5 ".build/bump-$family.log")"
  fi
  echo "$branch"
done
git switch -q --detach "$start"
