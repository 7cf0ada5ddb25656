#!/usr/bin/env bash
# mt_generate's flags, on the CPU, with a small GPT-2 over bytes: without the KV cache the greedy
# text is the same; a tiny --top-p keeps the most likely token alone (greedy again) and a sampled
# run repeats with its seed; --stop (a token's text or its id) ends the text after that token;
# --dtype f32 is the f32 checkpoint's own dtype and --dtype bf16 runs; the last line on stderr
# counts the tokens. With the GPT-2-style BPE fixture (skipped without PCRE2), a model that learned
# to end its documents stops at the tokenizer's end-of-text token, and with --stop none it does not.
#   generate.sh <bin dir> <tokenizer fixture dir> <work dir>
set -uo pipefail
bin=$1 tokenizer=$2 work=$3
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work"

for i in $(seq 1 200); do echo "the licence grants permission number $i to copy and distribute the work."; done \
  >"$work/a.txt"
"$bin/mt_tokenize" --output "$work/a.tok" "$work/a.txt" >/dev/null || fail "mt_tokenize"
"$bin/mt_train" --device cpu --data "$work/a.tok" --layers 2 --heads 2 --embd 32 --seq-len 32 --batch-size 8 \
  --steps 60 --lr 3e-3 --log-every 20 --sample-tokens 0 --out "$work/model" >"$work/train.log" 2>&1 ||
  { cat "$work/train.log"; fail "mt_train"; }

# generate <name> <flags...>: the text in $work/<name>.out, stderr in $work/<name>.err; fails on an error.
generate() {
  local name=$1
  shift
  "$bin/mt_generate" --device cpu --model "$work/model" --prompt "the " --tokens 30 "$@" >"$work/$name.out" \
    2>"$work/$name.err" || { cat "$work/$name.err"; fail "mt_generate $*"; }
}
same() {  # same <name> <name>: the two texts are equal
  cmp -s "$work/$1.out" "$work/$2.out" || fail "$1 and $2 differ: '$(cat "$work/$1.out")' vs '$(cat "$work/$2.out")'"
  echo "ok   $1 = $2"
}

generate greedy --temperature 0
echo "greedy: '$(cat "$work/greedy.out")'"
speed='^mt_generate: 30 tokens in [0-9]+\.[0-9]{2} s \([0-9]+\.[0-9] tokens/s\), prompt 4 tokens$'
tail -n 1 "$work/greedy.err" | grep -q -E "$speed" || fail "the last line on stderr: '$(tail -n 1 "$work/greedy.err")'"
echo "ok   $(tail -n 1 "$work/greedy.err")"
[[ $(head -c 4 "$work/greedy.out") == "the " ]] || fail "the text does not open with the prompt"

generate no_cache --temperature 0 --no-cache
same greedy no_cache
generate nucleus_of_one --temperature 1 --top-p 1e-9
same greedy nucleus_of_one
generate nucleus --temperature 1 --top-p 0.9 --top-k 0 --seed 5
generate nucleus_again --temperature 1 --top-p 0.9 --top-k 0 --seed 5
same nucleus nucleus_again
generate f32 --temperature 0 --dtype f32
same greedy f32
generate bf16 --temperature 0 --dtype bf16
[[ $(head -c 4 "$work/bf16.out") == "the " ]] || fail "--dtype bf16: '$(cat "$work/bf16.out")'"
echo "ok   --dtype bf16: '$(cat "$work/bf16.out")'"

# --stop: the greedy text up to the first copy of its third new character, that character included.
continuation=$(head -n 1 "$work/greedy.out" | cut -c 5-)
c=${continuation:2:1}
[[ -n "$c" ]] || fail "the greedy continuation '$continuation' is too short"
before=${continuation%%"$c"*}
expected="the $before$c"
code=$(printf '%d' "'$c")
stops=("$code")
[[ $c == [0-9] ]] || stops+=("$c")  # all digits would be read as an id
for stop in "${stops[@]}"; do
  generate stop --temperature 0 --stop "$stop"
  [[ $(cat "$work/stop.out") == "$expected" ]] ||
    fail "--stop '$stop': '$(cat "$work/stop.out")', expected '$expected'"
  tail -n 1 "$work/stop.err" | grep -q "^mt_generate: $((${#before} + 1)) tokens in " ||
    fail "--stop '$stop': $(tail -n 1 "$work/stop.err"), expected $((${#before} + 1)) tokens"
  echo "ok   --stop '$stop': '$expected', $(tail -n 1 "$work/stop.err")"
done

# The tokenizer's end-of-text token: a default stop, none with --stop none.
if ! out=$("$bin/mt_tokenize" --tokenizer "$tokenizer" --output "$work/probe.tok" "$tokenizer/merges.txt" 2>&1); then
  grep -q "has no PCRE2" <<<"$out" && { echo "generate: the BPE part skipped: $out"; echo "generate: PASS"; exit 0; }
  fail "mt_tokenize: $out"
fi
for i in $(seq 1 300); do echo "{\"text\": \"Sentence $i of the text.\"}"; done >"$work/s.jsonl"  # eos after each
"$bin/mt_tokenize" --tokenizer "$tokenizer" --output "$work/s.tok" "$work/s.jsonl" >/dev/null || fail "mt_tokenize"
"$bin/mt_train" --device cpu --tokenizer "$tokenizer" --data "$work/s.tok" --layers 2 --heads 2 --embd 32 \
  --seq-len 32 --batch-size 8 --steps 60 --lr 5e-3 --log-every 20 --sample-tokens 0 --out "$work/bpe" \
  >"$work/bpe_train.log" 2>&1 || { cat "$work/bpe_train.log"; fail "mt_train with the BPE tokenizer"; }
eos=(--device cpu --model "$work/bpe" --prompt "Sentence 7" --tokens 40 --temperature 0)
"$bin/mt_generate" "${eos[@]}" >"$work/eos.out" 2>"$work/eos.err" || { cat "$work/eos.err"; fail "mt_generate"; }
[[ $(cat "$work/eos.out") == "Sentence 7 of the text." ]] || fail "default stop: '$(cat "$work/eos.out")'"
grep -q -E "^mt_generate: [0-9] tokens in " "$work/eos.err" || fail "default stop: $(tail -n 1 "$work/eos.err")"
echo "ok   stopped at <|endoftext|>: '$(cat "$work/eos.out")', $(tail -n 1 "$work/eos.err")"
"$bin/mt_generate" "${eos[@]}" --stop none >"$work/none.out" 2>"$work/none.err" || fail "mt_generate --stop none"
grep -q "^mt_generate: 40 tokens in " "$work/none.err" || fail "--stop none: $(tail -n 1 "$work/none.err")"
echo "ok   --stop none: $(tail -n 1 "$work/none.err")"
echo "generate: PASS"
