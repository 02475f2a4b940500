#!/usr/bin/env bash
# check_layers.sh - check that includes between source folders point only
# down the layer order, so a call up (or sideways, between two folders of
# one layer) fails the build's tests instead of growing a circle.
#
# The order, top to bottom (folders on one line are one layer):
#   tools
#   train, bench           (tools/quorum.c runs the benchmarks)
#   worker, ps, model
#   wire
#   optim, cluster, data, ckpt, summary
#   common
# A file under src/X, tools/ or bench/ may include a header of its own folder,
# of a folder in a lower layer, or the public include/quorum.h, nothing else.
# An include without a folder ("proto.h") names a header beside the file.
#
# Usage: scripts/check_layers.sh [--graph] [ROOT]
#   --graph  also print the folder-level include graph ("from -> to  N").
# Exit status 0 if every include points down, 1 otherwise (each offending
# line is printed), 2 on a usage error. Needs only bash and grep.
set -euo pipefail

graph=0
if [ "${1:-}" = "--graph" ]; then
    graph=1
    shift
fi
[ $# -le 1 ] || { echo "usage: $0 [--graph] [ROOT]" >&2; exit 2; }
root=${1:-"$(dirname "$0")/.."}
cd "$root"

# Layer of each folder: larger is higher. A folder missing here is an error,
# so that a new folder gets a place in the order on purpose.
declare -A layer=(
    [tools]=6
    [train]=5 [bench]=5
    [worker]=4 [ps]=4 [model]=4
    [wire]=3
    [optim]=2 [cluster]=2 [data]=2 [ckpt]=2 [summary]=2
    [common]=1
)

# The folder a file belongs to: tools/x.c -> tools, src/ps/x.c -> ps.
folder_of() {
    case $1 in
        src/*) local rest=${1#src/}; echo "${rest%%/*}" ;;
        *) echo "${1%%/*}" ;;
    esac
}

declare -A edges=()
bad=0
files=$(find src tools bench -name '*.[ch]' | sort)
for file in $files; do
    from=$(folder_of "$file")
    if [ -z "${layer[$from]:-}" ]; then
        echo "$file: folder '$from' has no place in the layer order (scripts/check_layers.sh)"
        bad=1
        continue
    fi
    # '#include "x/y.h"' lines; <system> headers are not ours.
    while IFS= read -r line; do
        lineno=${line%%:*}
        header=${line#*\"}
        header=${header%%\"*}
        case $header in
            */*) to=${header%%/*} ;;
            *) continue ;; # beside the file, or include/quorum.h
        esac
        [ "$to" != "$from" ] || continue
        edges["$from -> $to"]=$((${edges["$from -> $to"]:-0} + 1))
        if [ -z "${layer[$to]:-}" ]; then
            echo "$file:$lineno: includes \"$header\" from '$to', a folder with no place in the layer order"
            bad=1
        elif [ "${layer[$to]}" -ge "${layer[$from]}" ]; then
            echo "$file:$lineno: includes \"$header\": $from may include only folders below it, and $to is not"
            bad=1
        fi
    done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file" || true)
done

if [ $graph -eq 1 ]; then
    for edge in "${!edges[@]}"; do
        from=${edge%% *}
        to=${edge##* }
        printf '%s %s %s %-24s %d\n' "${layer[$from]:-0}" "$from" "${layer[$to]:-0}" "$edge" \
            "${edges[$edge]}"
    done | sort -k1,1nr -k2,2 -k3,3nr -k4 | cut -d' ' -f4-
fi

if [ $bad -ne 0 ]; then
    echo "check_layers: an include points up or sideways; see the order at the top of scripts/check_layers.sh" >&2
    exit 1
fi
echo "check_layers: every include between folders points down"
