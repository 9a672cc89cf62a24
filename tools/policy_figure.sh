#!/usr/bin/env bash
# The expert cache's policies on held-out text, over --cache-cap: LRU alone,
# LRU with the pins the pin policy takes, and the optimal policy (Belady).
# Not run in CI; docs/benchmarks.md ("Learned placement") has its output.
#
#   tools/policy_figure.sh [path/to/coli] [work dir] [model dir] [caps]
#
# 1. History: `coli run` answers "What does W mean?" for 12 training words,
#    recording the usage history and its routing trace into a fresh state
#    directory (--pin off: nothing pinned yet).
# 2. Held-out text: the model's own transcripts for 10 other words, as one
#    replay file; `coli bench --replay --trace-out` records its routing.
# 3. `coli policy` replays the held-out trace at each cap, with pins chosen
#    on the history's trace; and, as a check, `coli bench` runs the engine
#    itself at each cap with --pin off and with --pin FILE (the pilot off,
#    so the hit rate is the cache's alone).
set -euo pipefail
COLI=${1:-target/release/coli}
WORK=${2:-$(mktemp -d)}
MODEL=${3:-models/colibri-tiny}
CAPS=${4:-2-8}
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

bench=(bench "${common[@]}" --replay "$replay" --prompt-len 8 --warmup 4 --tokens 300
    --no-compute-bound --probe-mb 1 --probe-repeats 1 --no-usage)
"$COLI" "${bench[@]}" --trace-out "$WORK/held-out.trace" >/dev/null 2>&1

echo "## coli policy (replayed)"
"$COLI" policy --trace "$WORK/held-out.trace" --history "$STATE/routing.trace" --caps "$CAPS"

echo
echo "## coli bench (the engine, measured pass hit rate)"
echo "| cache-cap | --pin off | --pin history | pins at start-up |"
echo "|---|---|---|---|"
hit() { awk '/^measured +[0-9]/ { print $3 }'; }
first=${CAPS%-*}
last=${CAPS#*-}
for cap in $(seq "$first" "$last"); do
    lru=$("$COLI" "${bench[@]}" --cache-cap "$cap" --pin off 2>/dev/null | hit)
    out=$("$COLI" "${bench[@]}" --cache-cap "$cap" --pin "$STATE/usage.hist" 2>/dev/null)
    pinned=$(echo "$out" | hit)
    pins=$(echo "$out" | sed -n 's/.*pins at start-up: \([^ ]*\).*/\1/p')
    echo "| $cap | $lru | $pinned | $pins |"
done
