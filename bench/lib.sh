# bench/lib.sh — sourced by the scripts that run kvseal beside llama.cpp
# (vs-llamacpp.sh, arch-matrix.sh): their settings, each overridable from
# the environment, and the helpers they share. NAME names the script in
# its skip messages.
cd "$(dirname "$0")/.."
A=${A:-../shared/anchors/llama.cpp} # the llama.cpp anchor's tools
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
MODELS=${MODELS:-build/bench-models} # made models are cached here
VOCAB=${VOCAB:-../shared/vocab/ggml-vocab-llama-spm.gguf}
KS=build/kvseal
if [ ! -x "$A/llama-bench" ]; then
    echo "$NAME: SKIPPED: the llama.cpp anchor is not at $A (set A=...)" >&2
    exit 0
fi
[ -x "$KS" ] || { cmake -S . -B build >/dev/null && cmake --build build -j2 >/dev/null; }

# median of the numbers on stdin
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2); else print "nan" }'; }
# column NAME of a llama-bench CSV row where n_prompt/n_gen match
lb_col() {  # file n_prompt n_gen column
    awk -F, -v np="$2" -v ng="$3" -v col="$4" '
        NR == 1 { for (i = 1; i <= NF; i++) { gsub(/"/, "", $i); h[$i] = i }; next }
        { gsub(/"/, "") } $h["n_prompt"] == np && $h["n_gen"] == ng { print $h[col] }' "$1"
}
