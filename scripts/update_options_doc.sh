#!/usr/bin/env bash
# Rewrite the "Every option" table of docs/TRAINING.md (between the
# <!-- options: ... --> and <!-- /options --> markers) from
# `dtrain train --help-markdown`, after a row of tools/train_args.c's option
# table changed; tests/tools/test_help.c checks that the two agree.
#   scripts/update_options_doc.sh        (DT_CLI: the dtrain program, default build/dtrain)
set -euo pipefail
cd "$(dirname "$0")/.."
cli=${DT_CLI:-build/dtrain}
doc=docs/TRAINING.md
table=$(mktemp)
out=$(mktemp)
trap 'rm -f "$table" "$out"' EXIT
"$cli" train --help-markdown > "$table"
awk -v table="$table" '
  /^<!-- options: dtrain train --help-markdown -->$/ { print; while ((getline l < table) > 0) print l; skip = 1; next }
  /^<!-- \/options -->$/ { skip = 0 }
  !skip { print }
' "$doc" > "$out"
grep -q '^<!-- /options -->$' "$out" || { echo "update_options_doc: markers not found in $doc" >&2; exit 1; }
cat "$out" > "$doc"
echo "updated $doc from $cli train --help-markdown"
