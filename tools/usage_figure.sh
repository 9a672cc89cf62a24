#!/usr/bin/env bash
# Hit rate of the expert cache with and without pins from the usage history,
# on the bundled model (models/colibri-tiny), over --cache-cap.
# Not run in CI; docs/benchmarks.md ("Learned placement") has its output.
#
#   tools/usage_figure.sh [path/to/coli] [work dir] [pin shares...]
#
# 1. History: `coli run` answers "What does W mean?" for 12 training words,
#    recording into a fresh state directory (--pin off: nothing pinned yet).
# 2. Held-out text: the model's own transcripts for 10 other words, written
#    as one replay file (recording off).
# 3. For each cap, `coli bench --replay` on the held-out text: LRU alone
#    (--pin off) against pins from the history (--pin FILE), neither
#    recording, the pilot off so the hit rate is the cache's alone.
set -euo pipefail
COLI=${1:-target/release/coli}
WORK=${2:-$(mktemp -d)}
shift $(($# > 2 ? 2 : $#))
SHARES=("${@:-0.5}")
MODEL=models/colibri-tiny
STATE=$WORK/state
mkdir -p "$WORK"
common=(--model "$MODEL" --placement streamed --pilot off)

train=(cat dog bread king ship garden money winter doctor school fire road)
held=(river house music light water tree stone bank run star)

for w in "${train[@]}"; do
    "$COLI" run "${common[@]}" --prompt "What does $w mean?" --max-tokens 60 \
        --state-dir "$STATE" --pin off >/dev/null 2>&1
done

replay=$WORK/held-out.txt
: >"$replay"
for w in "${held[@]}"; do
    answer=$("$COLI" run "${common[@]}" --prompt "What does $w mean?" --max-tokens 60 \
        --no-usage --pin off 2>/dev/null)
    printf '<|user|>\nWhat does %s mean?\n<|assistant|>\n%s<|end|>\n' "$w" "$answer" >>"$replay"
done

hit() {
    "$COLI" bench "${common[@]}" --replay "$replay" --prompt-len 8 --warmup 4 --tokens 300 \
        --no-compute-bound --probe-mb 1 --no-usage "$@" \
        | awk '/^measured +[0-9]/ { sub("%", "", $3); print $3 }'
}

for share in "${SHARES[@]}"; do
    echo
    echo "--pin-share $share"
    echo
    echo "| cache-cap | LRU alone | pins (history) + LRU | pinned per layer | gain (points) |"
    echo "|---|---|---|---|---|"
    for cap in 2 3 4 5 6; do
        lru=$(hit --cache-cap "$cap" --pin off)
        pinned=$(hit --cache-cap "$cap" --pin "$STATE/usage.hist" --pin-share "$share")
        per_layer=$(echo "$cap * $share / 1" | bc)
        printf '| %d | %s %% | %s %% | %d | %+.1f |\n' "$cap" "$lru" "$pinned" "$per_layer" \
            "$(echo "$pinned - $lru" | bc -l)"
    done
done
