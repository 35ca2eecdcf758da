#!/usr/bin/env bash
# test_tokenize_oracle.sh — `kvseal tokenize --ids` against llama.cpp's
# llama-tokenize (the anchor) on every ggml-vocab-*.gguf in $KS_SHARED/vocab
# and $KS_SHARED/vocab-wpm (WordPiece), on the shipped kjv-mini model and on
# the llama-spm vocabulary made into a Gemma 4 ("gemma4") one, id for id.
#
# Each vocabulary gets a fixed list of strings that stress tokenizers (the
# list below) plus strings built from its own special tokens (every control
# and unknown token, the user-defined ones, one "[PAD...]" filler per type; each
# alone, inside text and between spaces). Both engines are run on the same
# input in four modes: special-token parsing on/off x BOS on/off. To stay
# fast (llama-tokenize loads the vocabulary for each run, 0.1-0.5 s), the
# strings of a mode go in one text:
#  - parsing on: joined by the vocabulary's BOS text, a control token, so each
#    string is a fragment of its own (SPM gives each one the space prefix of a
#    text start; BPE pre-tokenizes each alone);
#  - parsing off: joined by "\n", every string then read in its neighbours'
#    context (a special token's text is plain text here).
# Strings whose meaning depends on being the whole text (empty, spaces only,
# a leading space, one special token) are also run one per process. On a
# difference the strings of that batch are rerun one at a time and each one
# that differs is printed with both id lists.
# KS_ORACLE_LLAMA overrides the oracle binary (used to show the test fails);
# KS_ORACLE_ONLY=TEXT keeps the vocabularies whose file name contains TEXT.
. "$(dirname "$0")/lib.sh"

A=${KS_ORACLE_LLAMA:-$KS_SHARED/anchors/llama.cpp/llama-tokenize}
SPECIALS=${KS_BUILD:-}/tok_specials
[ -d "$KS_SHARED/vocab" ] || skip "no $KS_SHARED/vocab (the shared llama.cpp vocab files)"
[ -x "$A" ] || skip "no llama.cpp anchor at $A"
[ -x "$SPECIALS" ] || fail "the helper tok_specials is not built ($SPECIALS)"

# The strings every vocabulary gets (no NUL or invalid UTF-8: argv and the
# oracle's file both carry them, but the brief keeps them to valid text).
GEN=(
    "" " " "   " "          " $'\t' $'\n' $'\n\n\n' $'\r\n' $' \r\n \t\n  x' $'\t\t  \n'
    "Hello world" " Hello world" "Hello world " "  Hello   world  " "   leading" "trailing   "
    $'hello\tworld\n' $'a\r\nb\rc\n\rd' $'line one\nline two\n\n  indented'
    "1234567" "3.14159" " 12 345 6789 00001" "in 2024, 1,000,000 people paid \$3.50"
    "I'm you're we'll they've she'd it's don't"
    "I'M YOU'RE WE'LL THEY'VE IT'S 'S 'T 'Re 'lL 'D" "'s't're'll've'm'd" "it''s ' s"
    "...!!!???---***" "Hello!!! ... what?! (yes) [no] {maybe} <tag> </tag>"
    $'int main(void) { return 0; }\n' $'    def f(x):\n        return x**2  # square\n'
    "if (a != b && c <= d) { x += 1; } // done" $'#include <stdio.h>\n\tprintf("%d\\n", i);'
    "https://example.com/path?q=1&r=two#frag" "user@example.org 192.168.0.1:8080"
    "café résumé naïve Zürich Øre façade" "Ångström señor über straße ÀÁÂÃÄÅ õöøùúûüýþÿ ÷"
    "Привет, мир! Ёлки-палки" "Γειά σου Κόσμε" "你好，世界！这是一个测试。" "こんにちは世界 カタカナ"
    "안녕하세요 세계" "नमस्ते दुनिया" "مرحبا بالعالم" "שלום עולם"
    "😀 🙏🏽 👍🏿" "👨‍👩‍👧‍👦 family 🏳️‍🌈 flag" "🤖🤖🤖" "ℝ ∑ ∞ ≠ ≤ ± ½ ²"
    "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３" "Kelvin K Å ǅ ﬁ" $'\u00a0nbsp\u2003em\u3000ideo\u0085nel'
    $'a\x01b\x1fc\x7fd' "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    "ThisIsCamelCaseAndHTTPServerID" "The quick brown fox jumps over the lazy dog."
    "Mixed 123abc abc123 a1b2c3 x²" "\$100 + 50% = ~€150 ^_^ |pipe| \`code\`"
    "<s> </s> <unk> <|endoftext|> <|im_start|>user" "< s > <<s>> </s/>"
)
# Strings also run alone, with BOS and parsing off (whole-text semantics: SPM
# space prefix, BPE start of text); the empty text also with parsing on and
# no BOS. The vocab's first special token of each type is added per
# vocabulary and run alone in both parsing modes.
EDGE=("" " " "   " " a" $'\n')

llama_ids() { # llama_ids FILE VOCAB ARGS... — the oracle's ids, space-separated
    local f=$1 v=$2 out try
    shift 2
    # the anchor's asynchronous logger can lose output at exit under load
    for try in 1 2 3 4 5 6 7 8 9 10; do
        out=$("$A" -m "$v" -f "$f" --ids --no-escape --log-disable "$@" 2>/dev/null) &&
            [[ "$out" == \[*\] ]] && { out=${out#[}; out=${out%]}; echo "${out//,/}"; return 0; }
    done
    echo "llama-tokenize failed on $f ($v)" >&2
    return 1
}
ks_ids() { # ks_ids FILE VOCAB ARGS... — kvseal's ids, space-separated
    local txt
    txt=$(cat "$1"; printf x)
    "$KS_BIN" tokenize -m "$2" --ids "${@:3}" -- "${txt%x}"
}
# compare FILE VOCAB LLAMA_ARGS KS_ARGS — 0 when equal; sets L and K
compare() {
    llama_ids "$1" "$2" $3 >"$TMPD/l.out" &
    local lpid=$!
    K=$(ks_ids "$1" "$2" $4) || fail "kvseal tokenize failed on $(basename "$1") ($2)"
    wait $lpid || fail "oracle failed"
    L=$(<"$TMPD/l.out")
    NIDS=$((NIDS + $(wc -w <<<"$L")))
    [ "$L" == "$K" ]
}
show() { # show LABEL FILE
    local s
    s=$(cat "$2"; printf x)
    echo "MISMATCH $1: $(printf '%q' "${s%x}")" >&2
    echo "  llama.cpp: [$L]" >&2
    echo "  kvseal:    [$K]" >&2
}

MODES=("on bos" "on nobos" "off bos" "off nobos")
mode_args() { # mode_args MODE -> sets LA (llama-tokenize) and KA (kvseal)
    LA= KA=
    case $1 in on*) KA="--special" ;; off*) LA="--no-parse-special" ;; esac
    case $1 in *nobos) LA="$LA --no-bos" KA="$KA --no-bos" ;; esac
}

# write_batches DIR SEP STRING... — DIR/s<i> per string, DIR/batch_on (joined
# by SEP) and DIR/batch_off (joined by "\n"); sets n.
write_batches() {
    local dir=$1 sep=$2 s
    shift 2
    n=0
    : >"$dir/batch_on"
    : >"$dir/batch_off"
    for s in "$@"; do
        printf '%s' "$s" >"$dir/s$n"
        [ $n -gt 0 ] && { printf '%s' "$sep" >>"$dir/batch_on"; printf '\n' >>"$dir/batch_off"; }
        printf '%s' "$s" >>"$dir/batch_on"
        printf '%s' "$s" >>"$dir/batch_off"
        n=$((n + 1))
    done
}
# run_batches DIR VOCAB LABEL MODE... — compares the batch of each mode; on
# a difference reruns its strings one at a time. Adds to runs and bad.
run_batches() {
    local dir=$1 v=$2 label=$3 m i found
    shift 3
    for m in "$@"; do
        mode_args "$m"
        runs=$((runs + 1))
        compare "$dir/batch_${m% *}" "$v" "$LA" "$KA" && continue
        echo "MISMATCH $label [$m]: the batch of $n strings differs; one at a time:" >&2
        found=0
        for ((i = 0; i < n; i++)); do
            compare "$dir/s$i" "$v" "$LA" "$KA" || { show "$label [$m] string $i" "$dir/s$i"; found=1; bad=$((bad + 1)); }
        done
        [ $found -eq 1 ] || { show "$label [$m] batch (no string differs alone)" "$dir/batch_${m% *}"; bad=$((bad + 1)); }
    done
}
hex_text() { printf '%b' "$(sed 's/../\\x&/g' <<<"$1")"; }

total_bad=0 n_vocab=0
vocabs=("$KS_SHARED"/vocab/ggml-vocab-*.gguf "$KS_SRC/models/kjv-mini.gguf")
# Gemma 4's tokenizer ("gemma4": SentencePiece-style BPE) on the llama-spm
# vocabulary made into one, merges and newline tokens added (tok_specials --gemma4)
SPM=$KS_SHARED/vocab/ggml-vocab-llama-spm.gguf
if [ -f "$SPM" ]; then
    mkdir -p "$TMPD/made"
    "$SPECIALS" --gemma4 "$SPM" "$TMPD/made/ggml-vocab-gemma4-from-llama-spm.gguf" ||
        fail "tok_specials --gemma4 $SPM"
    vocabs+=("$TMPD/made/ggml-vocab-gemma4-from-llama-spm.gguf")
fi
# WordPiece (BERT) vocabularies, when the shared folder has them
if [ -d "$KS_SHARED/vocab-wpm" ]; then
    vocabs+=("$KS_SHARED"/vocab-wpm/ggml-vocab-*.gguf)
else
    echo "note: no $KS_SHARED/vocab-wpm: the WordPiece vocabulary is not checked"
fi
for V in "${vocabs[@]}"; do
    name=$(basename "$V")
    [[ "$name" == *"${KS_ORACLE_ONLY:-}"* ]] || continue
    W="$TMPD/$name"
    mkdir -p "$W"
    "$SPECIALS" "$V" >"$W/specials" || fail "tok_specials $V"
    bos_id=$(awk '$1 == "bos" { print $2 }' "$W/specials")
    # separator for parsing on: the BOS text if it is a control token
    sep_hex=$(awk -v b="$bos_id" '$1 == "control" && $2 == b { print $3 }' "$W/specials")
    [ -n "$sep_hex" ] || sep_hex=$(awk '$1 == "control" { print $3; exit }' "$W/specials")
    [ -n "$sep_hex" ] || fail "$name: no control token to separate strings with"

    strs=("${GEN[@]}")
    edge=("${EDGE[@]}")
    n_sp=0 all_sp= edge_types=
    # (of the "[PAD...]" fillers, thousands in some vocabs, one per type)
    while read -r type id hex; do
        t=$(hex_text "$hex")
        strs+=("$t" "Hi,${t}there" " $t  " $'x '"$t"$'\n'"y")
        all_sp+=$t
        n_sp=$((n_sp + 1))
        case " $edge_types " in *" $type "*) ;; *) edge+=("$t") edge_types+=" $type" ;; esac
    done < <(awk '$1 != "bos" && ($3 !~ /^5b504144/ || !pad[$1]++)' "$W/specials")
    strs+=("$all_sp" "a${all_sp}b")
    write_batches "$W" "$(hex_text "$sep_hex")" "${strs[@]}"

    NIDS=0 bad=0 runs=0
    run_batches "$W" "$V" "$name" "${MODES[@]}"
    # whole-text semantics, one process per string
    i=0
    for s in "${edge[@]}"; do
        printf '%s' "$s" >"$W/e$i"
        ms=("off bos")
        [ $i -eq 0 ] && ms+=("on nobos")
        [ $i -ge ${#EDGE[@]} ] && ms+=("on bos")
        for m in "${ms[@]}"; do
            mode_args "$m"
            runs=$((runs + 1))
            compare "$W/e$i" "$V" "$LA" "$KA" || { show "$name [$m] alone" "$W/e$i"; bad=$((bad + 1)); }
        done
        i=$((i + 1))
    done
    echo "$name: $n strings ($n_sp special-token texts) x 4 modes batched + ${#edge[@]} alone, $runs runs per engine, $NIDS ids compared, $bad mismatches"
    total_bad=$((total_bad + bad))
    n_vocab=$((n_vocab + 1))
done

# Every pre-tokenizer family kvseal knows, on one vocabulary: the GPT-2 file
# copied (metadata only, into the scratch folder) with tokenizer.ggml.pre
# rewritten, so that the regexes of families with no vocab file here
# (Llama 3, Qwen2, Qwen3.5, DeepSeek-V3, GPT-4o, Tekken, ...) meet llama.cpp's.
G2=$KS_SHARED/vocab/ggml-vocab-gpt-2.gguf
PRES=(default llama-bpe dbrx chatglm-bpe deepseek-llm deepseek-coder falcon starcoder gpt-2 qwen2
    qwen35 deepseek-v3 hunyuan-dense poro-chat viking tekken gpt-4o minimax-m2 seed-coder grok-2
    bailingmoe chameleon)
PRE_EXTRA=("cafe"$'\u0301'" e"$'\u0301'"t" "x ~y ~ \$z" "HTTPServer camelCase ALLCAPS lowerUPPER"
    "123456 世界abc ひらがな カタカナ" "a/b/c //d" $'tab\t\t/\n/x')
if [ -f "$G2" ] && [[ "pre-tokenizers" == *"${KS_ORACLE_ONLY:-}"* ]]; then
    W="$TMPD/pre"
    mkdir -p "$W"
    write_batches "$W" "<|endoftext|>" "${GEN[@]}" "${PRE_EXTRA[@]}"
    NIDS=0 bad=0 runs=0
    for pre in "${PRES[@]}"; do
        "$SPECIALS" --pre "$pre" "$G2" "$W/$pre.gguf" || fail "tok_specials --pre $pre"
        run_batches "$W" "$W/$pre.gguf" "gpt-2 vocab, pre $pre" "on bos" "off nobos"
    done
    # a name neither knows: both refuse the file
    "$SPECIALS" --pre no-such-pre "$G2" "$W/none.gguf" || fail "tok_specials --pre no-such-pre"
    printf x >"$W/x"
    if "$A" -m "$W/none.gguf" -f "$W/x" --ids --log-disable >/dev/null 2>&1; then
        echo "MISMATCH: llama-tokenize accepted pre-tokenizer no-such-pre" >&2; bad=$((bad + 1))
    fi
    if "$KS_BIN" tokenize -m "$W/none.gguf" --ids x >/dev/null 2>&1; then
        echo "MISMATCH: kvseal tokenize accepted pre-tokenizer no-such-pre" >&2; bad=$((bad + 1))
    fi
    echo "pre-tokenizers (ggml-vocab-gpt-2.gguf as ${#PRES[@]} pre types): $n strings x 2 modes batched, $runs runs per engine, $NIDS ids compared, $bad mismatches"
    total_bad=$((total_bad + bad))
    n_vocab=$((n_vocab + 1))
fi
[ $total_bad -eq 0 ] || fail "$total_bad mismatches between kvseal tokenize and llama-tokenize"
[ $n_vocab -gt 0 ] || fail "no vocabulary matched KS_ORACLE_ONLY=${KS_ORACLE_ONLY:-}"
echo "ok: kvseal tokenize matches llama-tokenize on $n_vocab vocabularies"
