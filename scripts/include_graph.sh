#!/bin/sh
# The include graph of dtrain's folders: which folder includes which, and
# every private header reached from outside its folder.
#
#   scripts/include_graph.sh [REV]     (run from the repository root)
#
# Reads the tracked files of the work tree, or of git revision REV. A folder
# is a layer of the library (src/<layer>, its subfolders belong to it), the
# public headers (include), models, tools, examples, bench, fuzz and tests.
# A quoted include is resolved as the build does: beside the including file,
# then under src/, models/ and include/; an angle-bracket include of a
# public header (<dtrain/...>) counts as well. Output, sorted:
#   edge FROM -> TO  N       N includes from files of FROM of headers of TO
#   up FROM -> TO            an edge against the layer order (base, kernels,
#                            comm, tensor, autograd, nn, optim, data,
#                            parallel, ckpt, config, train, plan, models,
#                            tools):
#                            a layer that reaches up
#   internal FILE -> HEADER  a documented layer-internal header under src/
#                            (its top comment says "Layer-internal:" and who
#                            may include it) included from another layer
#   whitebox FILE -> HEADER  a header under src/ included by a test, fuzz
#                            target or benchmark (white-box, allowed)
#   cross FILE -> HEADER     any other header under src/ (private to its
#                            layer) included from outside that layer: the
#                            list the layering wants empty
# System headers (<...> other than <dtrain/...>) are left out.
set -eu

rev=${1:-}
if [ -n "$rev" ]; then
    files=$(git ls-tree -r --name-only "$rev" -- src models tools include examples bench fuzz tests)
    show() { git show "$rev:$1"; }
    exists() { git cat-file -e "$rev:$1" 2>/dev/null; }
else
    files=$(git ls-files -- src models tools include examples bench fuzz tests)
    show() { cat "$1"; }
    exists() { [ -f "$1" ]; }
fi

# the folder (layer) of a path
folder() {
    case $1 in
    src/*) echo "$1" | cut -d/ -f1-2 ;;
    include/dtrain/base.h) echo src/base ;;
    include/dtrain/kernels.h) echo src/kernels ;;
    include/dtrain/comm.h) echo src/comm ;;
    include/dtrain/tensor.h) echo src/tensor ;;
    include/dtrain/autograd.h | include/dtrain/ops.h | include/dtrain/precision.h) echo src/autograd ;;
    include/dtrain/nn.h) echo src/nn ;;
    include/dtrain/optim.h) echo src/optim ;;
    include/dtrain/data.h) echo src/data ;;
    include/dtrain/parallel.h | include/dtrain/tp.h | include/dtrain/mesh.h | include/dtrain/offload.h | include/dtrain/cp.h | \
        include/dtrain/zeropp.h | include/dtrain/pipeline.h) echo src/parallel ;;
    include/dtrain/ckpt.h) echo src/ckpt ;;
    include/dtrain/config.h) echo src/config ;;
    include/dtrain/train.h | include/dtrain/generate.h | include/dtrain/pipe_strategy.h) echo src/train ;;
    include/dtrain/plan.h) echo src/plan ;;
    include/dtrain/models.h) echo models ;;
    include/*) echo include ;;
    *) echo "$1" | cut -d/ -f1 ;;
    esac
}

# normalise a/b/../c to a/c
norm() {
    echo "$1" | awk -F/ '{ n = 0; for (i = 1; i <= NF; i++) { if ($i == "..") n--; else if ($i != "." && $i != "") p[++n] = $i }
                           s = p[1]; for (i = 2; i <= n; i++) s = s "/" p[i]; print s }'
}

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for f in $files; do
    case $f in *.c | *.h) ;; *) continue ;; esac
    dir=$(dirname "$f")
    show "$f" | sed -n -e 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' \
        -e 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*<\(dtrain\/[^>]*\)>.*/\1/p' | while read -r inc; do
        hit=
        for base in "$dir" src models include; do
            p=$(norm "$base/$inc")
            if exists "$p"; then
                hit=$p
                break
            fi
        done
        [ -n "$hit" ] || continue
        from=$(folder "$f")
        to=$(folder "$hit")
        [ "$from" = "$to" ] || echo "edge $from -> $to" >>"$tmp"
        case $hit in
        src/*)
            if [ "$from" != "$to" ]; then
                case $from in
                tests | fuzz | bench) kind=whitebox ;;
                *) if show "$hit" | head -40 | grep -q 'Layer-internal:'; then kind=internal; else kind=cross; fi ;;
                esac
                echo "$kind $f -> $hit" >>"$tmp"
            fi
            ;;
        esac
    done
done
grep '^edge' "$tmp" | sort | uniq -c | awk '{ print $2, $3, $4, $5, $1 }'
grep '^edge' "$tmp" | sort -u | awk '
    BEGIN { n = split("src/base src/kernels src/comm src/tensor src/autograd src/nn src/optim src/data " \
                      "src/parallel src/ckpt src/config src/train models src/plan tools", o, " ")
            for (i = 1; i <= n; i++) rank[o[i]] = i }
    ($2 in rank) && ($4 in rank) && rank[$4] > rank[$2] { print "up", $2, "->", $4 }'
for kind in internal whitebox cross; do
    grep "^$kind " "$tmp" | sort -u || true
done
