#!/usr/bin/env bash
# The rank-count sweep that rafi.bench.model fits: empty rounds and small rounds of uniform,
# ring and hot traffic, dense against sparse counts, on the cpu backend of one node.
#
#   bench/sweep.sh OUTDIR [RANKS...]          (default ranks: 2 4 8 12 16)
#   python3 -m rafi.bench.model OUTDIR/*.json --plot bench/results/model.png
#
# For each rank count N and exchange EX it writes OUTDIR/empty-N-EX.json (rafi.bench.empty)
# and OUTDIR/bench-N-EX.json (rafi.bench), each run through launch/local.sh under `timeout`.
# A run that fails or times out is reported and the sweep goes on; the exit status is then 1.
# Environment: PYTHON (python3), EMPTY_ROUNDS (2000), ROUNDS (10), ITEMS ("100 1000 10000"),
# ITEMSIZE (64), LIMIT (seconds per run, 150).
set -uo pipefail
out=${1:?usage: $0 OUTDIR [RANKS...]}
shift
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(2 4 8 12 16)
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
read -ra items <<<"${ITEMS:-100 1000 10000}"
mkdir -p "$out"
failed=0

run() { # NAME N ARGS...: one MPI run under the time limit, timed
  local name=$1 n=$2 start=$SECONDS
  shift 2
  if timeout "${LIMIT:-150}" "$here/launch/local.sh" "$n" "$python" -m "$@"; then
    echo "== $name: ${n} ranks, $((SECONDS - start)) s"
  else
    echo "== $name: ${n} ranks, FAILED (exit $?) after $((SECONDS - start)) s" >&2
    failed=1
  fi
}

for n in "${ranks[@]}"; do
  for ex in dense sparse; do
    rm -f "$out/empty-$n-$ex.json" # rafi.bench.empty appends to its file
    run "empty $ex" "$n" rafi.bench.empty --backend cpu --exchange "$ex" --rounds "${EMPTY_ROUNDS:-2000}" \
      --json "$out/empty-$n-$ex.json"
    run "bench $ex" "$n" rafi.bench --backend cpu --exchange "$ex" --pattern uniform ring hot \
      --items "${items[@]}" --itemsize "${ITEMSIZE:-64}" --rounds "${ROUNDS:-10}" --json "$out/bench-$n-$ex.json"
  done
done
echo "== sweep done in $SECONDS s: $out"
exit $failed
