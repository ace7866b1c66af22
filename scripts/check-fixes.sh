#!/usr/bin/env bash
# Check the pack's vllm_gaudi fixes against a vllm-gaudi checkout.
#
#   scripts/check-fixes.sh [--allow-skips] [--hunk-coverage [--record]] VLLM_GAUDI_SRC
#
# 1. copies the files the vllm_gaudi fixes touch from the checkout to a temporary tree;
# 2. applies every vllm_gaudi fix of profile vllm-gaudi-0.30.0 present in patches/, in pack order,
#    with the pack's own applier (patches/apply_all.py): each hunk must match exactly at
#    its stated line (fuzz 0, no offset); reports whether each file is the one the fix was
#    written against (pre_sha256);
# 3. py_compiles the patched files;
# 4. runs tests/unit/test_gaudi_fix_*.py with VLLM_GAUDI_SRC set. They need vllm 0.30.0
#    importable by $PYTHON (default python3); a test that cannot run (no vllm, no xgrammar)
#    fails, unless --allow-skips (then it skips and says so);
# 5. with --hunk-coverage: scripts/hunk_coverage.py drops each hunk of each fix in turn and
#    runs that fix's tests (fix.json "tests"); --record writes the figures into fix.json.
# Exit status: non-zero if a fix does not apply exactly, a file does not compile, a test
# fails or (without --allow-skips) skips, or a hunk's removal goes unnoticed.
set -euo pipefail

ALLOW_SKIPS= COVERAGE= RECORD=
while [ $# -gt 1 ]; do
    case "$1" in
        --allow-skips) ALLOW_SKIPS=1 ;;
        --hunk-coverage) COVERAGE=1 ;;
        --record) RECORD=--record ;;
        *) break ;;
    esac
    shift
done
if [ $# -ne 1 ] || [ ! -d "$1/vllm_gaudi" ] || { [ -n "$RECORD" ] && [ -z "$COVERAGE" ]; }; then
    echo "usage: $0 [--allow-skips] [--hunk-coverage [--record]] VLLM_GAUDI_SRC   (a vllm-gaudi checkout: the directory holding vllm_gaudi/)" >&2
    exit 2
fi
SRC=$(cd "$1" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
TREE=$(mktemp -d "${TMPDIR:-/tmp}/check-fixes.XXXXXX")
trap 'rm -rf "$TREE"' EXIT

if [ -d "$SRC/.git" ] || git -C "$SRC" rev-parse --git-dir >/dev/null 2>&1; then
    echo "vllm-gaudi checkout: $SRC at $(git -C "$SRC" rev-parse HEAD 2>/dev/null || echo '?')"
fi

"$PYTHON" - "$REPO" "$SRC" "$TREE" <<'EOF'
import hashlib, importlib.util, json, os, py_compile, shutil, sys

repo, src, tree = sys.argv[1:4]
pack = os.path.join(repo, "patches")
spec = importlib.util.spec_from_file_location("apply_all", os.path.join(pack, "apply_all.py"))
aa = importlib.util.module_from_spec(spec)
spec.loader.exec_module(aa)

prof = aa.load_profile(pack, "vllm-gaudi-0.30.0")
fixes = []
for name in prof["generic"] + prof["opt_in"]:
    if not os.path.isfile(os.path.join(pack, name, "fix.json")):
        print(f"  (absent)      {name}")
        continue
    fix = aa.load_fix(pack, name, name in prof["opt_in"])  # validates fix.json and fix.diff
    if fix["package"] == "vllm_gaudi":
        fixes.append(fix)
if not fixes:
    sys.exit("no vllm_gaudi fix in the pack")

files = sorted({path for fix in fixes for path in fix["files"]})
for path in files:
    os.makedirs(os.path.dirname(os.path.join(tree, path)), exist_ok=True)
    shutil.copy2(os.path.join(src, path), os.path.join(tree, path))

bad = 0
for fix in fixes:
    for path, want in fix["pre_sha256"].items():
        with open(os.path.join(src, path), "rb") as f:
            got = hashlib.sha256(f.read()).hexdigest()
        if got != want:
            print(f"  note: {path} in the checkout is not the file {fix['name']} was written against "
                  f"(sha256 {got[:12]}, expected {want[:12]}); exact application is still required")

tree_files, report, _ = aa.plan(fixes, tree)
for entry in report:
    name, state = entry["fix"]["name"], entry["state"]
    if state == "apply" and not entry["notes"]:
        print(f"  applies       {name}  (exact, fuzz 0)")
        continue
    bad += 1
    what = {"already": "ALREADY IN CHECKOUT", "fails": "FAILS"}.get(state, "OFFSET ONLY")
    print(f"  {what:<13} {name}")
    for line in entry["errors"] + entry["notes"]:
        print(f"      {line}")
if bad:
    sys.exit(f"{bad} fix(es) do not apply exactly to {src}")

for path in files:
    with open(os.path.join(tree, path), "wb") as f:
        f.write(aa.encode(tree_files[path]))
    py_compile.compile(os.path.join(tree, path), doraise=True)
    print(f"  compiles      {path}")
EOF

echo "tests (VLLM_GAUDI_SRC=$SRC, $("$PYTHON" -c 'import sys; print(sys.executable)'))$([ -n "$ALLOW_SKIPS" ] && echo ', skips allowed'):"
cd "$REPO"
NO_SKIP=1
[ -n "$ALLOW_SKIPS" ] && NO_SKIP=0
VLLM_GAUDI_SRC="$SRC" GEMMA4_GAUDI_FIXES_NO_SKIP=$NO_SKIP "$PYTHON" tests/fix_tests.py

if [ -n "$COVERAGE" ]; then
    echo "hunk coverage (each hunk dropped in turn, its fix's tests run):"
    PYTHON="$PYTHON" "$PYTHON" "$REPO/scripts/hunk_coverage.py" $RECORD "$SRC"
fi
