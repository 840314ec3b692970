#!/bin/sh
# Runs each libFuzzer harness for SECONDS, one after the other, and prints its
# executions and crashes. Corpora grow in build/fuzz/<name>/ (seeded from
# tests/fuzz/corpus/<name>/, which is never written); crash inputs land in
# build/fuzz/crash-<name>-*. Totals of every run are appended to
# build/fuzz/totals.log. A harness uses tests/fuzz/<name>.dict when there is
# one, else tests/fuzz/gemma4.dict.   usage: run.sh SECONDS name...
secs=$1; shift
mkdir -p build/fuzz
status=0
for name in "$@"; do
  mkdir -p "build/fuzz/$name"
  log="build/fuzz/$name.log"
  dict=tests/fuzz/gemma4.dict
  [ -f "tests/fuzz/$name.dict" ] && dict="tests/fuzz/$name.dict"
  "./build/fuzz_$name" -max_total_time="$secs" -print_final_stats=1 -dict="$dict" \
      -artifact_prefix="build/fuzz/crash-$name-" "build/fuzz/$name" "tests/fuzz/corpus/$name" > "$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  crashes=$(ls build/fuzz/ 2>/dev/null | grep -c "^crash-$name-")
  [ $rc -eq 0 ] || { tail -n 40 "$log"; status=1; [ "$crashes" -gt 0 ] || crashes="1 (exit $rc)"; }
  echo "fuzz $name: ${execs:-0} executions in ${secs} s, $crashes crashes"
  echo "$(date -u +%FT%TZ) $name ${execs:-0} $crashes" >> build/fuzz/totals.log
done
exit $status
