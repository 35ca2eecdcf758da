#!/usr/bin/env bash
# kvseal run on the shipped kjv-mini: greedy continuations equal the
# reference text of models/kjv-mini.README.md exactly (stdout holds only the
# generated text), stop strings cut the text, bad invocations fail with a
# precise message, and run gives the same tokens as serve for the same
# sampling parameters, penalties included (both drive the engine).
. "$(dirname "$0")/lib.sh"
M=$KS_SRC/models/kjv-mini.gguf

out=$("$KS_BIN" run -m "$M" -p "In the beginning" -n 60 --temp 0 2>"$TMPD/err") || fail "run: $(cat "$TMPD/err")"
expect_eq "greedy 1" "$out" " of the Lord, and in the Lord Jesus Christ. And I will send my voice, and will not hear the word of God, but that the Lord Jesus Christ is in the Lord Jesus. And I say unto you, that ye may be the Lord Jesus Christ, and the Lord Jesus Christ,"

out=$("$KS_BIN" run -m "$M" -p "Blessed are the" -n 60 --temp 0 2>/dev/null)
expect_eq "greedy 3" "$out" " people, and the people that are in the land. And the LORD said unto Moses, Go, and say unto the people, Thus saith the LORD, the God of Israel, that I will not give you a covenant with the children of Israel, and will make you a covenant with you, and"

# the shipped model is the default; a stop string spanning tokens ends the text before it
out=$("$KS_BIN" run -p "Blessed are the" -n 60 --temp 0 --stop "the LORD said" 2>/dev/null)
expect_eq "stop string" "$out" " people, and the people that are in the land. And "

# seeded sampling is reproducible, and a different seed gives other text
a=$("$KS_BIN" run -p "And God said" -n 30 --temp 1.0 --seed 7 2>/dev/null)
b=$("$KS_BIN" run -p "And God said" -n 30 --temp 1.0 --seed 7 2>/dev/null)
c=$("$KS_BIN" run -p "And God said" -n 30 --temp 1.0 --seed 8 2>/dev/null)
expect_eq "seeded" "$a" "$b"
[ "$a" != "$c" ] || fail "seeds 7 and 8 gave the same text"

# errors: missing prompt, bad model path, corrupt model, bad parameter
"$KS_BIN" run -m "$M" 2>"$TMPD/err" && fail "run without -p succeeded"
expect_has "no prompt" "$(cat "$TMPD/err")" "-p PROMPT is required"
"$KS_BIN" run -m "$TMPD/nope.gguf" -p hi 2>"$TMPD/err" && fail "missing model succeeded"
expect_has "missing model" "$(cat "$TMPD/err")" "$TMPD/nope.gguf"
head -c 5000 "$M" >"$TMPD/trunc.gguf"
"$KS_BIN" run -m "$TMPD/trunc.gguf" -p hi 2>"$TMPD/err" && fail "truncated model succeeded"
expect_has "truncated model" "$(cat "$TMPD/err")" "trunc.gguf"
"$KS_BIN" run -m "$M" -p hi --top-p 0 2>"$TMPD/err" && fail "top-p 0 accepted"
expect_has "bad top-p" "$(cat "$TMPD/err")" "top_p"
# --min-tokens (SAMPLE_PARAM_MAP's cli column): the stop string "the" cannot
# end generation before the 3rd token
a=$("$KS_BIN" run -m "$M" -p "In the beginning" -n 3 --temp 0 --stop the 2>/dev/null)
expect_eq "run --stop" "$a" " of "
a=$("$KS_BIN" run -m "$M" -p "In the beginning" -n 3 --temp 0 --stop the --min-tokens 3 2>/dev/null)
expect_eq "run --min-tokens" "$a" " of the Lord"
"$KS_BIN" run -m "$M" -p hi --min-tokens -1 2>"$TMPD/err" && fail "min-tokens -1 accepted"
expect_has "bad min-tokens" "$(cat "$TMPD/err")" "min-tokens"
# run drives the engine exactly as serve does: the same tokens for the same
# sampling parameters, penalties included (the prompt is not in the
# penalty window in either)
command -v curl >/dev/null && command -v node >/dev/null || skip "curl or node is not installed (scripts/install-deps.sh)"
start_server "$TMPD/serve.log" -m "$M" --alias kjv
SP='"temperature":0.8,"seed":11,"top_k":40,"top_p":0.95,"min_p":0.05,"repetition_penalty":1.3,"frequency_penalty":0.5,"presence_penalty":0.3'
for prompt in "Blessed are the" "And the LORD said unto Moses"; do
    a=$("$KS_BIN" run -m "$M" -p "$prompt" -n 40 --temp 0.8 --seed 11 --top-k 40 --top-p 0.95 --min-p 0.05 \
        --repeat-penalty 1.3 --frequency-penalty 0.5 --presence-penalty 0.3 2>/dev/null)
    b=$(curl -sS "$KS_URL/v1/completions" -d "{\"model\":\"kjv\",\"prompt\":\"$prompt\",\"max_tokens\":40,$SP}" |
        node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>process.stdout.write(JSON.parse(s).choices[0].text))')
    expect_eq "run = serve with penalties ($prompt)" "$a" "$b"
done
stop_server

echo "run ok"
