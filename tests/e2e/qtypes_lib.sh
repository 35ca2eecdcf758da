# qtypes_lib.sh — shared by test_qtypes_*.sh (sourced after lib.sh): the
# llama.cpp anchor, the presets every quantization type is checked through,
# and the comparisons (perplexity ratio, greedy text). Skips where ../shared
# or the anchor is absent.
A=$KS_SHARED/anchors/llama.cpp
TEXT=$KS_SHARED/models/kjv-heldout.txt
for f in "$A/llama-quantize" "$A/llama-perplexity" "$A/llama-completion" "$TEXT"; do
    [ -e "$f" ] || skip "$f is absent (../shared or the llama.cpp anchor not present)"
done
[ -n "${KS_SANITIZE:-}" ] && skip "llama.cpp comparisons are not run under a sanitizer (time)"
PRESETS=${KS_QTYPES_PRESETS:-"Q4_1 Q5_0 Q5_1 Q2_K Q3_K_S Q3_K_M Q4_K_S Q5_K_S Q5_K_M IQ4_NL IQ4_XS"}
PROMPTS=("In the beginning God created" "And the LORD said unto Moses,")
head -c "${QT_TEXT_BYTES:-4000}" "$TEXT" >"$TMPD/text.txt"

mkmodel_to() {  # OUT mkmodel-args... — kvseal mkmodel with $VOCAB, failing with its message
    local out=$1
    shift
    "$KS_BIN" mkmodel -o "$out" --vocab "$VOCAB" "$@" >/dev/null 2>"$TMPD/mk.err" ||
        fail "mkmodel $*: $(cat "$TMPD/mk.err")"
}
quantize() {  # IN OUT PRESET
    "$A/llama-quantize" "$1" "$2" "$3" 2 >"$TMPD/q.log" 2>&1 ||
        fail "llama-quantize $3: $(tail -n 3 "$TMPD/q.log")"
}
kv_ppl() {  # MODEL — prints kvseal's perplexity
    "$KS_BIN" perplexity -m "$1" -f "$TMPD/text.txt" -c 128 -t 2 2>"$TMPD/kv.err" |
        sed -n 's/^perplexity: //p'
}
# The anchor's tools print through an asynchronous logger whose last lines
# are now and then lost at exit on a loaded machine (seen: the "Final
# estimate" line, or the last greedy token, missing), so a result that is
# absent, or differs from kvseal's, is asked for again (10 tries: under a busy machine 3 were seen to
# lose the line every time).
ll_ppl() {  # MODEL — prints llama.cpp's (its log lines carry a time prefix)
    local try v
    for try in 1 2 3 4 5 6 7 8 9 10; do
        "$A/llama-perplexity" -m "$1" -f "$TMPD/text.txt" -c 128 -t 2 >"$TMPD/ll.log" 2>&1
        v=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$TMPD/ll.log")
        [ -n "$v" ] && break
    done
    echo "$v"
}
# Greedy text, prompt included: `kvseal run` prints only the new text,
# llama-completion the prompt too, after the leading space of the
# SentencePiece rendering, which is dropped here.
kv_gen() {  # MODEL PROMPT — the prompt + kvseal's 32 greedy tokens (their count in $TMPD/kv.n)
    printf '%s' "$2"
    "$KS_BIN" run -m "$1" -p "$2" -n 32 --temp 0 -t 2 2>"$TMPD/kv.gen.err"
    sed -n 's/.*generated \([0-9]*\) tokens.*/\1/p' "$TMPD/kv.gen.err" >"$TMPD/kv.n"
}
# llama-completion is asked for 8 tokens more than kvseal's 32, so the
# tokens its logger may drop at exit are ones not compared.
ll_gen1() {
    "$A/llama-completion" -m "$1" -p "$2" -n 40 --temp 0 -t 2 --no-warmup -no-cnv 2>/dev/null </dev/null |
        sed '1s/^ //'
}

# check_ppl NAME MODEL — kvseal's perplexity within PPL_TOL (0.005: 0.5%)
# of llama.cpp's; prints one line (no newline: check_greedy may add to it).
check_ppl() {
    local kp lp ratio
    kp=$(kv_ppl "$2"); lp=$(ll_ppl "$2")
    [ -n "$kp" ] || fail "$1: kvseal perplexity failed: $(tail -n 3 "$TMPD/kv.err")"
    [ -n "$lp" ] || fail "$1: llama-perplexity gave no estimate: $(tail -n 3 "$TMPD/ll.log")"
    ratio=$(awk -v a="$kp" -v b="$lp" 'BEGIN { printf "%.5f", a / b }')
    printf '%-16s ppl kvseal %-14s llama.cpp %-14s ratio %s' "$1" "$kp" "$lp" "$ratio"
    awk -v r="$ratio" -v t="${PPL_TOL:-0.005}" 'BEGIN { d = r - 1; if (d < 0) d = -d; exit !(d < t) }' ||
        { echo; fail "$1: perplexity ratio $ratio is not within ${PPL_TOL:-0.005}"; }
}
# gen_same MODEL PROMPT — true when kvseal's greedy text equals
# llama-completion's; leaves both in G_KV, G_LL (llama.cpp's cut to the
# length of kvseal's).
# A token that is a lone piece of a UTF-8 character is printed by kvseal as
# U+FFFD and by llama.cpp as the raw byte: both are dropped before comparing.
# The anchor's asynchronous logger loses the last lines of its output now and
# then on a loaded machine (seen: the last one or two greedy tokens, in every
# try), so llama.cpp generates 8 tokens more (ll_gen1) and its text must
# begin with kvseal's 32 tokens; where kvseal stopped early (end of text),
# the two must be equal. Asked up to 10 times, keeping the longest output;
# a parting where both texts are whole (a near tie) ends the asking.
gen_same() {
    local try out n_kv
    G_KV=$(kv_gen "$1" "$2" | sed 's/\xef\xbf\xbd//g')
    n_kv=$(cat "$TMPD/kv.n")
    G_LL=""
    for try in 1 2 3 4 5 6 7 8 9 10; do
        out=$(ll_gen1 "$1" "$2" | iconv -c -f UTF-8 -t UTF-8)
        [ ${#out} -gt ${#G_LL} ] && G_LL=$out
        if [ "${n_kv:-0}" -lt 32 ]; then
            [ "$G_KV" == "$out" ] && return 0
        elif [ ${#out} -gt ${#G_KV} ]; then
            G_LL=${out:0:${#G_KV}}
            [ "$G_KV" == "$G_LL" ] && return 0
            return 1
        fi
    done
    G_LL=${G_LL:0:${#G_KV}}
    return 1
}
# gen_same_or_tie MODEL PROMPT — gen_same, or the texts part where kvseal's
# two most likely tokens are within TIE_LP (0.1) in log-probability: a near
# tie that either engine's rounding may break either way (random weights
# make them common; the two engines' logits differ by up to ~0.05 at Q8_0).
# Sets G_NOTE to say which.
TIE_LP=${TIE_LP:-0.1}
gen_same_or_tie() {
    G_NOTE=""
    gen_same "$1" "$2" && return 0
    local n_p d
    n_p=$(printf '%s' "$2" | wc -c)
    printf '%s' "$G_KV" >"$TMPD/g_kv"
    printf '%s' "$G_LL" >"$TMPD/g_ll"
    d=$(cmp "$TMPD/g_kv" "$TMPD/g_ll" 2>/dev/null | sed -n 's/.* byte \([0-9]*\).*/\1/p')
    [ -n "$d" ] || d=$(( $(wc -c <"$TMPD/g_kv") < $(wc -c <"$TMPD/g_ll") ? $(wc -c <"$TMPD/g_kv") + 1 : $(wc -c <"$TMPD/g_ll") + 1 ))
    d=$((d - 1 - n_p)) # first differing byte of the generated text
    [ "$d" -ge 0 ] || return 1
    "$KS_BIN" run -m "$1" -p "$2" -n 32 --temp 0 -t 2 --logprobs 2>&1 >/dev/null |
        sed -n 's/^logprobs: //p' >"$TMPD/lp"
    G_NOTE=$(awk -v d="$d" -v tie="$TIE_LP" '$3 <= d { s = $1; m = $4 - $5 }
        END { if (s == "") exit 1; printf "near tie at token %d (log-prob margin %.4f)", s, m; exit !(m < tie) }' "$TMPD/lp") ||
        return 1
    return 0
}

# check_greedy NAME MODEL — gen_same_or_tie on every ARCH_PROMPTS prompt
# (defined below), failing with both texts; then "  greedy ok".
check_greedy() {
    local p
    for p in "${ARCH_PROMPTS[@]}"; do
        gen_same_or_tie "$2" "$p" || { echo; fail "$1: greedy text differs ($G_NOTE):
  kvseal:    $G_KV
  llama.cpp: $G_LL"; }
    done
    echo "  greedy ok"
}

# check_arch NAME F16_MODEL — the architecture tests' matrix: perplexity
# within 0.5% of llama.cpp's at F16, Q8_0 and Q4_K_M (quantized by
# llama-quantize), and 32 greedy tokens identical (or parting only at a
# near tie) on ARCH_PROMPTS at F16 and Q8_0; one line per type.
ARCH_PROMPTS=("In the beginning God created" "And the LORD said unto Moses," "For God so loved the world,")
check_arch() {
    local q m p
    "$KS_BIN" inspect "$2" | grep -q "^runs: yes" || fail "$1: inspect does not say it runs"
    for q in F16 Q8_0 Q4_K_M; do
        m=$2
        if [ "$q" != F16 ]; then
            quantize "$2" "$TMPD/q.gguf" "$q"
            m=$TMPD/q.gguf
        fi
        check_ppl "$1 $q" "$m"
        if [ "$q" != Q4_K_M ]; then
            for p in "${ARCH_PROMPTS[@]}"; do
                gen_same_or_tie "$m" "$p" || { echo; fail "$1 $q: greedy text differs ($G_NOTE):
  kvseal:    $G_KV
  llama.cpp: $G_LL"; }
                [ -z "$G_NOTE" ] || printf '  [%s]' "$G_NOTE"
            done
            printf '  greedy ok'
        fi
        echo
    done
}
