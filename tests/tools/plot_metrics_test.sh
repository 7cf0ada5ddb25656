#!/usr/bin/env bash
# tools/plot_metrics.py: two runs' metrics files (one from a GPU with memory figures, one from the
# CPU without, resumed so that a step repeats) make one PNG of a useful size, and bad input is
# refused with exit status 2 and a message naming the file and line. Skipped (77) where python3
# or matplotlib is missing.
#   plot_metrics_test.sh <plot_metrics.py> <work dir>
set -euo pipefail
script=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

# The GPU run: every 10 steps, validation every 50, memory keys.
for s in $(seq 10 10 300); do
  val=""
  if ((s % 50 == 0)); then val=",\"val_loss\":$(awk -v s="$s" 'BEGIN { printf "%.4f", 3.2 + 4 / (1 + s / 40) }')"; fi
  awk -v s="$s" -v val="$val" 'BEGIN {
    printf "{\"step\":%d,\"time\":%.3f,\"loss\":%.4f%s,\"lr\":%.6g,\"grad_norm\":%.3f,\"tokens_per_s\":%d,", \
      s, 1765090000 + s * 0.4, 3 + 4 / (1 + s / 40), val, 6e-4 * (s < 50 ? s / 50 : 1 - (s - 50) / 300), 0.9, 51000 + (s % 7) * 300
    printf "\"step_ms\":%.2f,\"mem_allocated_gib\":%.3f,\"mem_reserved_gib\":%.3f,\"mem_peak_gib\":%.3f}\n", \
      40.1, 2.1 + (s % 3) * 0.01, 6.0, 5.4 }'
done >"$work/gpu_run.jsonl"
# The CPU run: no memory keys, a null loss (NaN), and resumed at step 100 after reaching 120: the
# second line of each of steps 110 and 120 replaces the first.
{
  for s in $(seq 10 10 120); do
    printf '{"step":%d,"time":%d,"loss":%s,"lr":0.002,"tokens_per_s":%d}\n' "$s" $((1765090000 + s)) \
      "$( ((s == 30)) && echo null || awk -v s="$s" 'BEGIN { printf "%.4f", 3.5 + 3 / (1 + s / 30) }')" $((4000 + s))
  done
  for s in $(seq 110 10 200); do
    printf '{"step":%d,"time":%d,"loss":%.4f,"val_loss":%.4f,"lr":0.002,"tokens_per_s":%d}\n' "$s" \
      $((1765099000 + s)) "$(awk -v s="$s" 'BEGIN { print 3.5 + 3 / (1 + s / 30) }')" \
      "$(awk -v s="$s" 'BEGIN { print 3.7 + 3 / (1 + s / 30) }')" $((4000 + s))
  done
} >"$work/cpu_run.jsonl"

# ---- bad input (read before matplotlib is needed) ----
expect_error() {  # expect_error <message part> <arguments...>
  local want=$1 rc=0
  shift
  "$script" "$@" -o "$work/bad.png" >"$work/out.txt" 2>"$work/err.txt" || rc=$?
  [[ $rc == 2 ]] || fail "plot_metrics.py $* exited $rc, not 2: $(cat "$work/err.txt")"
  grep -qF -- "$want" "$work/err.txt" || fail "plot_metrics.py $*: no '$want' in: $(cat "$work/err.txt")"
  [[ ! -e "$work/bad.png" ]] || fail "plot_metrics.py $* wrote an image"
}
printf '{"step":1,"loss":4.0}\n{"step":2,"loss":\n{"step":3,"loss":3.0}\n' >"$work/bad_json.jsonl"
expect_error "plot_metrics: $work/bad_json.jsonl:2: bad JSON" "$work/bad_json.jsonl"
expect_error "plot_metrics: $work/missing.jsonl: cannot read: No such file or directory" \
  "$work/gpu_run.jsonl" "$work/missing.jsonl"
printf '{"step":1,"loss":4.0}\n{"loss":3.0}\n' >"$work/no_step.jsonl"
expect_error "plot_metrics: $work/no_step.jsonl:2: no \"step\" key" "$work/no_step.jsonl"
printf '{"step":1.5,"loss":4.0}\n' >"$work/float_step.jsonl"
expect_error "plot_metrics: $work/float_step.jsonl:1: \"step\" must be an integer, got 1.5" "$work/float_step.jsonl"
printf '{"step":1,"loss":"low"}\n' >"$work/text_value.jsonl"
expect_error "plot_metrics: $work/text_value.jsonl:1: \"loss\" must be a number or null, got \"low\"" \
  "$work/text_value.jsonl"
: >"$work/empty.jsonl"
expect_error "plot_metrics: $work/empty.jsonl: empty: no metrics lines" "$work/empty.jsonl"

# The resumed run's records: one per step, the later line of a repeated step kept (it has val_loss).
python3 - "$script" "$work/cpu_run.jsonl" <<'EOF_PY' || fail "the resumed run was not read as one record per step"
import importlib.util, math, sys
spec = importlib.util.spec_from_file_location("plot_metrics", sys.argv[1])
plot_metrics = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_metrics)
records = plot_metrics.read_run(sys.argv[2])
assert list(records) == list(range(10, 201, 10)), list(records)
assert records[110]["time"] == 1765099110 and "val_loss" in records[110], records[110]
assert "val_loss" not in records[100] and math.isnan(records[30]["loss"]), (records[100], records[30])
EOF_PY

# ---- the plot ----
rc=0
"$script" "$work/gpu_run.jsonl" "$work/cpu_run.jsonl" -o "$work/runs.png" --title "two runs" \
  >"$work/out.txt" 2>"$work/err.txt" || rc=$?
if [[ $rc == 3 ]]; then
  echo "SKIP: $(cat "$work/err.txt")"
  exit 77
fi
[[ $rc == 0 ]] || fail "plot_metrics.py exited $rc: $(cat "$work/err.txt")"
[[ "$(cat "$work/out.txt")" == "$work/runs.png" ]] || fail "printed '$(cat "$work/out.txt")', not the PNG's path"
[[ -f "$work/runs.png" ]] || fail "no $work/runs.png"
signature=$(od -An -tx1 -N8 "$work/runs.png" | tr -d ' \n')
[[ $signature == 89504e470d0a1a0a ]] || fail "not a PNG: the file starts with $signature"
size=$(wc -c <"$work/runs.png")
((size > 10240)) || fail "the PNG has only $size bytes"
# IHDR follows the 8-byte signature, its length and its type: width and height, big-endian, at bytes 16 and 20.
read -r -a wh <<<"$(od -An -tu1 -j16 -N8 "$work/runs.png")"
width=$(((wh[0] << 24) | (wh[1] << 16) | (wh[2] << 8) | wh[3]))
height=$(((wh[4] << 24) | (wh[5] << 16) | (wh[6] << 8) | wh[7]))
((width >= 800)) || fail "the PNG is $width px wide"

# One file, named by --label; a run that names a label for each file only.
"$script" "$work/cpu_run.jsonl" -o "$work/one.png" --label "cpu, resumed" >/dev/null ||
  fail "one file with --label did not plot"
[[ -s "$work/one.png" ]] || fail "no $work/one.png"
rc=0
"$script" "$work/cpu_run.jsonl" "$work/gpu_run.jsonl" -o "$work/bad.png" --label one >/dev/null 2>"$work/err.txt" ||
  rc=$?
[[ $rc == 2 ]] && grep -qF -- "--label given 1 times for 2 files" "$work/err.txt" ||
  fail "one --label for two files: exit $rc, $(cat "$work/err.txt")"
echo "plot_metrics: PASS (${width}x${height} px, $size bytes)"
