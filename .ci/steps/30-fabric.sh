#!/usr/bin/env bash
# fabric: the committed fixture trees are exactly what tests/fixtures/fabric/gen.py generates
# (file contents and relative symlinks), and `doctor --capture` of a fixture replays to the same JSON.
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 tests/fixtures/fabric/gen.py --out "$tmp/gen" >/dev/null
for d in "$tmp"/gen/*/; do
  name=$(basename "$d")
  diff -r --no-dereference "$d" "tests/fixtures/fabric/$name" >/dev/null \
    || { echo "fixture $name differs from gen.py output: rerun python3 tests/fixtures/fabric/gen.py" >&2; diff -r --no-dereference "$d" "tests/fixtures/fabric/$name" | head -20 >&2; exit 1; }
done
n_gen=$(find "$tmp/gen" -mindepth 1 -maxdepth 1 | wc -l)
n_git=$(find tests/fixtures/fabric -mindepth 1 -maxdepth 1 -type d ! -name captured | wc -l)
[ "$n_gen" -eq "$n_git" ] || { echo "fixture count: gen.py $n_gen, committed $n_git" >&2; exit 1; }
# Built every time (a no-op when fresh): run on its own after an edit, the step tests the new code.
cargo build --quiet --locked --bin switchless
bin=${CARGO_TARGET_DIR:-target}/debug/switchless
rc=0; "$bin" doctor --json --root tests/fixtures/fabric/gb10-2cable --capture "$tmp/cap" >"$tmp/a.json" || rc=$?
[ "$rc" -eq 0 ] || { echo "doctor on gb10-2cable exited $rc, expected 0" >&2; exit 1; }
"$bin" doctor --json --root "$tmp/cap" >"$tmp/b.json"
diff <(grep -v '"root"' "$tmp/a.json") <(grep -v '"root"' "$tmp/b.json")
echo "fabric: $n_gen fixture trees match gen.py; capture replays identically"
