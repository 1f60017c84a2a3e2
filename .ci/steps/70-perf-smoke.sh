#!/usr/bin/env bash
# The performance page's generator works (scripts/perf.py --smoke: `switchless bench --model` with
# --json and --plot, and --cpu, on a tiny spec). Checks that the commands run, not timings.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 scripts/perf.py --smoke
