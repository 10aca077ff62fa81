#!/usr/bin/env bash
# The closing lines of `make test`: for each build tree given, CTest's count
# line from its last run (DIR/ctest.log, written by ctest -O) and the tests
# that did not run, skipped ones (exit code 77, DT_TEST_SKIP) by name.
# Usage: scripts/test_summary.sh DIR...
set -euo pipefail
cd "$(dirname "$0")/.."
echo
echo "== make test: summary"
status=0
for d in "$@"; do
  log="$d/ctest.log"
  if [ ! -f "$log" ]; then
    echo "$d: no CTest log ($log)"; status=1; continue
  fi
  count=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -1)
  [ -n "$count" ] || { echo "$d: no CTest summary in $log"; status=1; continue; }
  # "The following tests did not run:" then one indented line per test
  notrun=$(sed -n '/^The following tests did not run:/,/^$/{/^[[:space:]]/p}' "$log")
  skipped=$(printf '%s\n' "$notrun" | grep -c '(Skipped)' || true)
  echo "$d: $count; $skipped skipped"
  if [ -n "$notrun" ]; then
    printf '%s\n' "$notrun" | sed 's/^[[:space:]]*[0-9]* - /    not run: /'
  fi
done
exit $status
