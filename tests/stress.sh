#!/usr/bin/env bash
# Runs a pytest selection N times in a row under load, stopping at the first failure:
#   tests/stress.sh N LOAD TEST...   (or `make stress TEST=... N=20 LOAD=2`)
# LOAD busy loops run beside it, so a test whose outcome hangs on timing meets a slow machine.
# The whole selection repeats as one (pytest-repeat's session scope): run 1 of every test,
# then run 2, as in N CI runs, with the services started once.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:?usage: tests/stress.sh N LOAD TEST...}
load=${2:?usage: tests/stress.sh N LOAD TEST...}
shift 2
[ $# -gt 0 ] || { echo "stress: name the tests, e.g. TEST=tests/integration/test_master_faults.py" >&2; exit 2; }
busy=()
trap '[ ${#busy[@]} -eq 0 ] || kill "${busy[@]}" 2>/dev/null' EXIT
for _ in $(seq "$load"); do
    (while :; do :; done) &
    busy+=($!)
done
echo "stress: $runs runs of $* under $load busy loops"
start=$(date +%s)
.venv/bin/python -m pytest -x -q -p no:cacheprovider --count "$runs" --repeat-scope session "$@"
echo "stress: $runs runs passed in $(( $(date +%s) - start )) s"
