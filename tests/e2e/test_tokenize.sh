#!/usr/bin/env bash
# test_tokenize.sh — runs the real `kvseal tokenize` on the shipped kjv-mini
# model and compares with llama.cpp's reference ids (models/README).
set -u
BIN="${KS_BIN:?KS_BIN must point to the kvseal binary}"
MODEL="${KS_SRC:?KS_SRC must point to the source tree}/models/kjv-mini.gguf"
fail=0
expect() { # expect NAME WANT GOT
    if [ "$2" != "$3" ]; then
        echo "FAIL $1: want [$2] got [$3]" >&2
        fail=1
    else
        echo "ok   $1"
    fi
}

expect "ids" "1 1043 261 1786 1244" "$("$BIN" tokenize -m "$MODEL" --ids "In the beginning")"
expect "default model" "1 1043 261 1786 1244" \
    "$(KS_MODEL="$MODEL" "$BIN" tokenize --ids "In the beginning")"
expect "no-bos" "1043 261 1786 1244" "$("$BIN" tokenize -m "$MODEL" --ids --no-bos "In the beginning")"
expect "newline byte" "1 305 434 493 13 1997 434 698" \
    "$("$BIN" tokenize -m "$MODEL" --ids "$(printf 'line one\nline two')")"
special_on="$("$BIN" tokenize -m "$MODEL" --ids --no-bos --special "<s>")"
expect "special on" "1" "$special_on"
special_off="$("$BIN" tokenize -m "$MODEL" --ids --no-bos "<s>")"
case " $special_off " in
    *" 1 "*) echo "FAIL special off: <s> parsed as BOS without --special ($special_off)" >&2; fail=1 ;;
    *) echo "ok   special off" ;;
esac
lines="$("$BIN" tokenize -m "$MODEL" "In the beginning")"
expect "pieces" "1 '<s>'|1043 ' In'|261 ' the'|1786 ' begin'|1244 'ning'" "$(printf '%s' "$lines" | paste -sd '|')"
if "$BIN" tokenize -m /nonexistent.gguf --ids "x" 2>/dev/null; then
    echo "FAIL missing model: exit status 0" >&2
    fail=1
else
    echo "ok   missing model fails"
fi
exit $fail
