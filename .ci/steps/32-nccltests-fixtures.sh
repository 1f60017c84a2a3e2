#!/usr/bin/env bash
# nccl-tests: the committed logs in tests/fixtures/nccl-tests are exactly what make_fixtures.py writes
# (rerun it after editing it). The parser's reading of the formats is checked independently by
# tests/nccltests.rs (lines_in_nccl_and_nccl_tests_own_formats_parse: nccl-tests' and NCCL's printf
# strings, cited, through the C library's snprintf).
set -euo pipefail
cd "$(dirname "$0")/../.."
fx=tests/fixtures/nccl-tests
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$fx/make_fixtures.py" --out "$tmp/gen"
diff -r --exclude make_fixtures.py --exclude README.md --exclude __pycache__ "$tmp/gen" "$fx" > "$tmp/diff" ||
  { echo "32-nccltests-fixtures: FAIL: $fx differs from make_fixtures.py's output (rerun python3 $fx/make_fixtures.py):" >&2
    head -20 "$tmp/diff" >&2; exit 1; }
n=$(find "$tmp/gen" -type f | wc -l)
[ "$n" -ge 9 ] || { echo "32-nccltests-fixtures: FAIL: make_fixtures.py wrote only $n files" >&2; exit 1; }
echo "32-nccltests-fixtures: $n files match make_fixtures.py"
