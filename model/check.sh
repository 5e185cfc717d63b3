#!/usr/bin/env bash
# Model-check every model/*.pml with spin.
#
#   models whose name contains "counterexample" must be REJECTED (errors > 0);
#   every other model must verify with errors: 0, on a complete search that
#   was not cut short by the depth limit.
#
# Models with an ltl (or never) claim are checked for acceptance cycles under
# weak fairness (pan -a -f); the others get a plain safety run (-DSAFETY).
# Usage: bash model/check.sh   (from any directory; needs spin and gcc)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
depth=100000
start=$SECONDS

for tool in spin gcc; do
	command -v "$tool" >/dev/null || { echo "check.sh: $tool not found" >&2; exit 2; }
done

work="$(mktemp -d /tmp/pg_envelopes_model.XXXXXX)"
trap 'rm -rf "$work"' EXIT

shopt -s nullglob
models=("$here"/*.pml)
if [ ${#models[@]} -eq 0 ]; then
	echo "check.sh: no .pml files in $here" >&2
	exit 2
fi

report() {	# PASS|FAIL model text
	printf '%-4s  %-52s  %s\n' "$1" "$2" "$3"
}

# One model: spin, gcc, pan, then one report line on stdout.
check_one() {
	model="$1"
	file="$(basename "$model")"
	dir="$work/${file%.pml}"
	mkdir -p "$dir"
	cp "$model" "$dir/"

	if grep -Eq '^[[:space:]]*(ltl|never)[[:space:]{]' "$model"; then
		kind="ltl, weak fairness"
		cflags=(-DNFAIR=3)
		pflags=(-a -f)
	else
		kind="safety"
		cflags=(-DSAFETY)
		pflags=()
	fi

	if ! (cd "$dir" && spin -a "$file") >"$dir/spin.log" 2>&1; then
		report FAIL "$file" "spin -a failed: $(grep -m1 -i error "$dir/spin.log" || tail -n1 "$dir/spin.log")"
		return
	fi
	if ! (cd "$dir" && gcc -O2 -w "${cflags[@]}" -o pan pan.c) >"$dir/gcc.log" 2>&1; then
		report FAIL "$file" "gcc failed: $(head -n1 "$dir/gcc.log")"
		return
	fi
	# Bounded by CPU time, not wall time: on a loaded machine the larger models
	# take minutes of wall time for under two of CPU.
	(cd "$dir" && ulimit -t 600 && timeout 3600 ./pan "${pflags[@]}" -m"$depth") >"$dir/pan.log" 2>&1 || true
	log="$dir/pan.log"

	errors="$(sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' "$log" | head -n1)"
	if [ -z "$errors" ]; then
		report FAIL "$file" "no verdict from pan: $(tail -n1 "$log")"
		return
	fi
	truncated=no
	if grep -q 'depth too small' "$log"; then truncated=yes; fi
	states="$(sed -n 's/^ *\([0-9][0-9]*\) states, stored.*/\1/p' "$log" | head -n1)"
	reached="$(sed -n 's/.*depth reached \([0-9][0-9]*\).*/\1/p' "$log" | head -n1)"

	what=""
	if [ "$errors" -gt 0 ]; then
		what="$(grep -m1 '^pan:[0-9]*:' "$log" | sed -e 's/^pan:[0-9]*: //' \
			-e 's/assertion violated .* (at depth/assertion violated (at depth/')"
		# replay the trail to name a failing assertion by its source line
		line="$(cd "$dir" && spin -t "$file" 2>&1 | sed -n 's/^spin: .*\.pml:\([0-9][0-9]*\), Error: assertion violated.*/\1/p' | head -n1 || true)"
		if [ -n "$line" ]; then
			what="$what; line $line: $(sed -n "${line}p" "$model" | grep -o 'assert([^;]*)' | head -n1)"
		fi
	fi

	if [[ "$file" == *counterexample* ]]; then
		if [ "$errors" -gt 0 ]; then
			report PASS "$file" "rejected as expected ($kind): errors: $errors, $what"
		else
			report FAIL "$file" "expected a violation, got errors: 0 ($states states)"
		fi
	else
		if [ "$errors" -ne 0 ]; then
			report FAIL "$file" "errors: $errors, $what"
		elif [ "$truncated" = yes ]; then
			report FAIL "$file" "errors: 0 but the search hit the depth limit ($depth)"
		elif grep -q 'Search not completed' "$log"; then
			report FAIL "$file" "errors: 0 but the search was not completed"
		elif [ ${#pflags[@]} -gt 0 ] && ! grep -Eq 'acceptance +cycles.*\+ \(fairness enabled\)' "$log"; then
			report FAIL "$file" "errors: 0 but acceptance cycles under fairness were not checked"
		else
			report PASS "$file" "verified ($kind): errors: 0, $states states, depth $reached"
		fi
	fi
}

# The models are independent: as many at a time as there are cores (pan is
# single-threaded), the reports printed in the models' order.
parallel="$(nproc 2>/dev/null || echo 1)"
for model in "${models[@]}"; do
	while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n || true; done
	check_one "$model" >"$work/$(basename "$model").report" 2>&1 &
done
wait

failures=0
for model in "${models[@]}"; do
	out="$work/$(basename "$model").report"
	if [ ! -s "$out" ]; then
		report FAIL "$(basename "$model")" "no report (the check itself failed)"
		failures=$((failures + 1))
		continue
	fi
	cat "$out"
	if grep -q '^FAIL' "$out"; then failures=$((failures + 1)); fi
done

echo "$(( ${#models[@]} - failures ))/${#models[@]} as expected, $((SECONDS - start))s"
[ "$failures" -eq 0 ]
