#!/usr/bin/env bash
# test_pull.sh — `kvseal pull` against a local stand-in for the Hugging Face
# hub (tests/e2e/hub_fixture.py: the tree API, resolve answering 302 to a
# CDN on another port, Range requests, faults from a control file). The
# hosted file is kjv-mini (../shared/models, else the repo's models/) under
# several quant names. Checks: ORG/REPO:q8_0 picks the Q8_0 file, its
# sha256 is verified and the pulled file runs (inspect: "runs: yes"); the
# listing is read over several pages; a second pull downloads nothing; a
# download cut off, or interrupted by SIGINT (exit 130), is resumed by the
# next run with Range bytes=N- (and within one run, retried); a 206 for
# another range than asked, or a 200, restarts from byte 0; corrupted bytes
# fail with exit 1, expected vs got and no file left; a CDN refusal is said
# as the download host's; an unknown repository and revision; a gated
# repository without a token (the message names HF_TOKEN), with a wrong
# one, and with the right one (HF_TOKEN, --token-file or the token
# huggingface-cli login saved: the hub saw it, the CDN never, nor a listing
# page whose link names another port: refused); options from KVSEAL_*
# variables and the default directory under HOME (mode 0700); an ambiguous
# tag and no tag list the choices; a tag that matches nothing lists what is
# there; --file and ORG/REPO/FILE; a split model is refused; a hub file name
# with '..' is refused and nothing is written outside the directory; a
# directory that cannot be made; a file of the same name with other
# contents (kept, or replaced with --force); a full disk (a small tmpfs in
# a mount namespace); an HTTPS hub whose certificate is not trusted.
. "$(dirname "$0")/lib.sh"

command -v python3 >/dev/null || skip "python3 absent (the hub fixture)"
MODEL=$KS_SHARED/models/kjv-mini.gguf
[ -f "$MODEL" ] || MODEL=$KS_SRC/models/kjv-mini.gguf
[ -f "$MODEL" ] || skip "kjv-mini.gguf absent"
SHA=$(sha256sum "$MODEL" | cut -d' ' -f1)
SIZE=$(stat -c %s "$MODEL")

# --- the hub's repositories ----------------------------------------------------
ROOT=$TMPD/hub
mkdir -p "$ROOT/kjv/mini-GGUF" "$ROOT/kjv/ambig-GGUF" "$ROOT/kjv/gated-GGUF" \
    "$ROOT/kjv/evil-GGUF" "$ROOT/kjv/split-GGUF" "$ROOT/kjv/empty"
cp "$MODEL" "$ROOT/kjv/mini-GGUF/kjv-mini-Q8_0.gguf"
ln "$ROOT/kjv/mini-GGUF/kjv-mini-Q8_0.gguf" "$ROOT/kjv/mini-GGUF/kjv-mini-Q4_0.gguf"
echo "# kjv-mini" >"$ROOT/kjv/mini-GGUF/README.md"
for n in kjv/ambig-GGUF/kjv-mini-Q4_K_M kjv/ambig-GGUF/kjv-mini-Q4_K_S kjv/gated-GGUF/kjv-mini-Q8_0 \
         kjv/split-GGUF/kjv-mini-Q8_0-00001-of-00002 kjv/split-GGUF/kjv-mini-Q8_0-00002-of-00002; do
    ln "$ROOT/kjv/mini-GGUF/kjv-mini-Q8_0.gguf" "$ROOT/$n.gguf"
done
echo "# nothing here" >"$ROOT/kjv/empty/README.md"
CTL=$TMPD/control.json
LOG=$TMPD/hub.log
# control BODY — the fixture's settings from now on (JSON object members);
# the gated repository, the hostile listing and 2 entries a page always
control() {
    printf '{"gated": {"kjv/gated-GGUF": "hf_good"}, "page_size": 2,
  "extra": {"kjv/evil-GGUF": [{"type": "file", "oid": "%s", "size": %s, "path": "../../evil-Q8_0.gguf",
            "lfs": {"oid": "%s", "size": %s, "pointerSize": 134}}]}%s}\n' \
        "$(printf '0%.0s' {1..40})" "$SIZE" "$SHA" "$SIZE" "${1:+, $1}" >"$CTL.tmp"
    mv "$CTL.tmp" "$CTL"
}
control ""
python3 "$KS_SRC/tests/e2e/hub_fixture.py" --root "$ROOT" --control "$CTL" --log "$LOG" \
    --port-file "$TMPD/ports" 2>"$TMPD/fixture.err" &
wait_for "the hub fixture's ports" test -s "$TMPD/ports"
read -r HUB CDN <"$TMPD/ports"

export HF_ENDPOINT=http://127.0.0.1:$HUB
export HF_HOME=$TMPD/hf-home # no saved token
export KVSEAL_MODELS_DIR=$TMPD/models
unset HF_TOKEN HF_TOKEN_PATH KVSEAL_DIR KVSEAL_ENDPOINT KVSEAL_TOKEN_FILE KVSEAL_FILE \
    KVSEAL_REVISION KVSEAL_RETRIES KVSEAL_FORCE
DIR=$KVSEAL_MODELS_DIR

# pull WANT_RC ARGS... — runs kvseal pull (without the variable $PULL_UNSET
# names, if set); OUT its stdout, ERR its stderr
N_PULL=0
pull() {
    local want=$1 rc
    shift
    N_PULL=$((N_PULL + 1))
    echo "--- pull $N_PULL: $*" >>"$LOG"
    env ${PULL_UNSET:+-u "$PULL_UNSET"} "$KS_BIN" pull "$@" >"$TMPD/out" 2>"$TMPD/err"
    rc=$?
    OUT=$(cat "$TMPD/out")
    ERR=$(cat "$TMPD/err")
    [ "$rc" = "$want" ] || fail "pull $*: exit $rc, want $want; stderr: $ERR"
}
# since_last_pull — the log lines of the latest pull
since_last_pull() { awk -v m="--- pull $N_PULL:" 'index($0, m) == 1 { f = 1; next } f' "$LOG"; }
n_resolves() { since_last_pull | grep -c "\"path\": \"/$1/resolve/" ; }

# --- a quant tag picks its file; verified; the file runs -------------------------
pull 0 kjv/mini-GGUF:q8_0
expect_eq "printed path" "$OUT" "$DIR/kjv-mini-Q8_0.gguf"
cmp -s "$OUT" "$MODEL" || fail "the pulled file differs from the hosted one"
expect_eq "models dir mode" "$(stat -c %a "$DIR")" 700
expect_has "sha256 verified" "$ERR" "sha256 $SHA verified"
since_last_pull | grep -q '"path": "/kjv/mini-GGUF/resolve/main/kjv-mini-Q8_0.gguf"' ||
    fail "no resolve of the Q8_0 file: $(since_last_pull)"
since_last_pull | grep -q 'cursor=2' || fail "the listing's second page was not read"
[ ! -e "$DIR/kjv-mini-Q8_0.gguf.part" ] || fail "the part file is left"
"$KS_BIN" inspect "$OUT" >"$TMPD/inspect" 2>&1 || fail "inspect of the pulled file: $(cat "$TMPD/inspect")"
grep -q '^runs: yes$' "$TMPD/inspect" || fail "the pulled file does not run: $(tail -1 "$TMPD/inspect")"

# --- already there: no download ---------------------------------------------------
pull 0 kjv/mini-GGUF:Q8_0
expect_eq "printed path (present)" "$OUT" "$DIR/kjv-mini-Q8_0.gguf"
expect_has "present" "$ERR" "already present"
expect_eq "resolves when present" "$(n_resolves kjv/mini-GGUF)" 0

# --- cut off, then resumed by the next run ----------------------------------------
control '"drop_after": 3000000, "drop_limit": 100'
pull 1 kjv/mini-GGUF:Q4_0 --retries 0
expect_has "gave up" "$ERR" "run again to resume"
PART=$DIR/kjv-mini-Q4_0.gguf.part
[ -f "$PART" ] || fail "no part file after the cut"
N=$(stat -c %s "$PART")
[ "$N" -gt 0 ] && [ "$N" -lt "$SIZE" ] || fail "part of $N bytes (file $SIZE)"
[ ! -e "$DIR/kjv-mini-Q4_0.gguf" ] || fail "a final file after a cut"
control ""
pull 0 kjv/mini-GGUF:Q4_0
since_last_pull | grep -q "\"server\": \"cdn\".*\"range\": \"bytes=$N-\"" ||
    fail "the second run did not ask for bytes=$N-: $(since_last_pull)"
cmp -s "$OUT" "$MODEL" || fail "the resumed file differs"
[ ! -e "$PART" ] || fail "the part file is left after the resume"

# --- a 206 for another range than asked: started over, never spliced ---------------
control '"drop_after": 3000000, "drop_limit": 1'
pull 1 kjv/mini-GGUF:q8_0 --dir "$TMPD/m-range" --retries 0
control '"bad_range": true'
pull 0 kjv/mini-GGUF:q8_0 --dir "$TMPD/m-range"
expect_has "bad range noticed" "$ERR" "starting over"
cmp -s "$OUT" "$MODEL" || fail "the file after a wrong 206 differs"
control ""

# --- a server that ignores the Range (200, the whole file): started over -------------
control '"drop_after": 3000000, "drop_limit": 1'
pull 1 kjv/mini-GGUF:q8_0 --dir "$TMPD/m-200" --retries 0
control '"ignore_range": true'
pull 0 kjv/mini-GGUF:q8_0 --dir "$TMPD/m-200"
expect_has "200 to a Range noticed" "$ERR" "the server ignored the Range"
cmp -s "$OUT" "$MODEL" || fail "the file after a 200 to a Range differs"
control ""

# --- interrupted (SIGINT, as Ctrl-C): exit 130, the part kept, resumed ------------
control '"slow": true'
"$KS_BIN" pull kjv/mini-GGUF:q8_0 --dir "$TMPD/m-int" >"$TMPD/out" 2>"$TMPD/err" &
PULL=$!
part_grows() { [ "$(stat -c %s "$TMPD/m-int/kjv-mini-Q8_0.gguf.part" 2>/dev/null || echo 0)" -gt 0 ]; }
wait_for "a part file with bytes in it" part_grows
kill -INT $PULL
wait $PULL
expect_eq "exit status after SIGINT" "$?" 130
expect_has "interrupted" "$(cat "$TMPD/err")" "run again to resume"
N=$(stat -c %s "$TMPD/m-int/kjv-mini-Q8_0.gguf.part")
[ "$N" -gt 0 ] && [ "$N" -lt "$SIZE" ] || fail "part of $N bytes after SIGINT (file $SIZE)"
control ""
pull 0 kjv/mini-GGUF:q8_0 --dir "$TMPD/m-int"
since_last_pull | grep -q "\"server\": \"cdn\".*\"range\": \"bytes=$N-\"" ||
    fail "the run after SIGINT did not ask for bytes=$N-: $(since_last_pull)"
cmp -s "$OUT" "$MODEL" || fail "the file resumed after SIGINT differs"

# --- cut off twice within one run: retried from where it stopped ------------------
control '"drop_after": 4000000, "drop_limit": 2'
pull 0 kjv/mini-GGUF:Q4_0 --dir "$TMPD/m-retry"
[ "$(since_last_pull | grep -c '"server": "cdn".*"range": "bytes=[1-9][0-9]*-"')" = 2 ] ||
    fail "not two retries with a Range: $(since_last_pull)"
cmp -s "$OUT" "$MODEL" || fail "the retried file differs"

# --- corrupted bytes: exit 1, expected vs got, nothing left -----------------------
control '"corrupt": true'
pull 1 kjv/mini-GGUF:q8_0 --dir "$TMPD/m-bad"
expect_has "mismatch" "$ERR" "sha256 mismatch"
expect_has "expected" "$ERR" "expected $SHA, got "
[ -z "$(ls -A "$TMPD/m-bad")" ] || fail "files left after a mismatch: $(ls -A "$TMPD/m-bad")"
control ""

# --- the CDN refuses (403): said as the download host's answer, not the hub's ------
control '"cdn_status": 403'
pull 1 kjv/mini-GGUF:q8_0 --dir "$TMPD/m-cdn"
expect_has "CDN 403" "$ERR" "the download host answered HTTP 403"
case "$ERR" in *HF_TOKEN*) fail "a CDN refusal blamed on the token: $ERR";; esac
control ""

# --- unknown repository, revision -----------------------------------------------
pull 1 nobody/nothing-GGUF
expect_has "unknown repo" "$ERR" "repository nobody/nothing-GGUF not found"
pull 1 kjv/mini-GGUF:q8_0 --revision v9 --dir "$TMPD/m-rev"
expect_has "unknown revision" "$ERR" "revision not found"
KVSEAL_REVISION=v9 pull 1 kjv/mini-GGUF:q8_0 --dir "$TMPD/m-rev" # options from the environment
expect_has "unknown revision (KVSEAL_REVISION)" "$ERR" "revision not found"

# --- the default directory: ~/.cache/kvseal/models without KVSEAL_MODELS_DIR -------
PULL_UNSET=KVSEAL_MODELS_DIR HOME=$TMPD/home pull 0 kjv/mini-GGUF:q8_0
expect_eq "default dir" "$OUT" "$TMPD/home/.cache/kvseal/models/kjv-mini-Q8_0.gguf"
expect_eq "default dir mode" "$(stat -c %a "$TMPD/home/.cache/kvseal/models")" 700

# --- gated: no token, a wrong one, the right one (never sent to the CDN) ----------
control '"next_elsewhere": true'
HF_TOKEN=hf_good pull 1 kjv/mini-GGUF:q8_0 --dir "$TMPD/m-next"
expect_has "next page elsewhere" "$ERR" "the next page of the list is elsewhere"
since_last_pull | grep -q '"server": "cdn"' && fail "a listing page was fetched from another port"
control ""
pull 1 kjv/gated-GGUF:q8_0 --dir "$TMPD/m-gated"
expect_has "gated without token" "$ERR" "set HF_TOKEN"
HF_TOKEN=hf_wrong pull 1 kjv/gated-GGUF:q8_0 --dir "$TMPD/m-gated"
expect_has "gated, wrong token" "$ERR" "refused the token"
HF_TOKEN=hf_good pull 0 kjv/gated-GGUF:q8_0 --dir "$TMPD/m-gated"
cmp -s "$OUT" "$MODEL" || fail "the gated file differs"
since_last_pull | grep -q '"server": "hub".*"auth": "Bearer hf_good"' || fail "the hub did not get the token"
since_last_pull | grep -q '"server": "cdn"' || fail "no CDN request"
since_last_pull | grep '"server": "cdn"' | grep -qv '"auth": null' &&
    fail "the CDN saw an Authorization header: $(since_last_pull | grep '"server": "cdn"')"
mkdir -p "$TMPD/hf-login"
printf 'hf_good\n' >"$TMPD/hf-login/token" # as huggingface-cli login saves it
rm -f "$TMPD/m-gated"/*
HF_HOME=$TMPD/hf-login pull 0 kjv/gated-GGUF:q8_0 --dir "$TMPD/m-gated"
since_last_pull | grep -q '"server": "hub".*"auth": "Bearer hf_good"' || fail "the saved token was not used"
printf 'hf_good\n' >"$TMPD/token"
rm -f "$TMPD/m-gated"/*
pull 0 kjv/gated-GGUF:q8_0 --dir "$TMPD/m-gated" --token-file "$TMPD/token"
since_last_pull | grep '"server": "cdn"' | grep -qv '"auth": null' && fail "the CDN saw the token (--token-file)"

# --- choosing: ambiguous, no tag, no match, --file, split, nothing -----------------
pull 1 kjv/ambig-GGUF:q4_k --dir "$TMPD/m-x"
expect_has "ambiguous: M" "$ERR" "kjv-mini-Q4_K_M.gguf"
expect_has "ambiguous: S" "$ERR" "kjv-mini-Q4_K_S.gguf"
expect_has "ambiguous: how" "$ERR" "--file"
pull 1 kjv/mini-GGUF --dir "$TMPD/m-x"
expect_has "no tag: Q4_0" "$ERR" "kjv-mini-Q4_0.gguf"
expect_has "no tag: Q8_0" "$ERR" "kjv-mini-Q8_0.gguf"
pull 1 kjv/mini-GGUF:Q5_K_M --dir "$TMPD/m-x"
expect_has "no match" "$ERR" "no .gguf file matches 'Q5_K_M'"
expect_has "no match lists" "$ERR" "kjv-mini-Q4_0.gguf"
pull 0 kjv/mini-GGUF --file kjv-mini-Q4_0.gguf --dir "$TMPD/m-file"
expect_eq "--file" "$OUT" "$TMPD/m-file/kjv-mini-Q4_0.gguf"
pull 0 kjv/mini-GGUF/kjv-mini-Q8_0.gguf --dir "$TMPD/m-file"
expect_eq "ORG/REPO/FILE" "$OUT" "$TMPD/m-file/kjv-mini-Q8_0.gguf"
pull 1 kjv/split-GGUF:q8_0 --dir "$TMPD/m-x"
expect_has "split" "$ERR" "split"
pull 1 kjv/empty --dir "$TMPD/m-x"
expect_has "no gguf" "$ERR" "holds no .gguf file"

# --- hostile names -----------------------------------------------------------------
pull 1 kjv/evil-GGUF --dir "$TMPD/m-evil/a/b"
expect_has "'..' from the hub" "$ERR" "refused the hub's file name"
[ -z "$(find "$TMPD" -name 'evil-Q8_0.gguf*')" ] || fail "evil file written: $(find "$TMPD" -name 'evil*')"
expect_eq "resolves for a refused name" "$(n_resolves kjv/evil-GGUF)" 0
pull 2 kjv/mini-GGUF/../evil.gguf
expect_has "'..' given" "$ERR" "'..'"
pull 2 'kjv/mini-GGUF' --file '../x.gguf'

# --- a directory that cannot be made; a file with other contents there -------------
touch "$TMPD/afile"
pull 1 kjv/mini-GGUF:q8_0 --dir "$TMPD/afile/models"
expect_has "bad dir" "$ERR" "cannot create the models directory $TMPD/afile/models"
mkdir -p "$TMPD/m-other"
echo "something else" >"$TMPD/m-other/kjv-mini-Q8_0.gguf"
pull 1 kjv/mini-GGUF:q8_0 --dir "$TMPD/m-other"
expect_has "other contents" "$ERR" "exists with other contents"
pull 0 kjv/mini-GGUF:q8_0 --dir "$TMPD/m-other" --force
cmp -s "$OUT" "$MODEL" || fail "--force did not replace the file"

# --- a full disk: refused before downloading (a 4 MB tmpfs, mounted in a mount
# namespace of its own, so nothing outlives the test; skipped without one) ----------
if unshare -rm true 2>/dev/null; then
    mkdir -p "$TMPD/m-full"
    unshare -rm sh -c 'mount -t tmpfs -o size=4m tmpfs "$1" && shift && exec "$@"' sh \
        "$TMPD/m-full" "$KS_BIN" pull kjv/mini-GGUF:q8_0 --dir "$TMPD/m-full" >"$TMPD/out" 2>"$TMPD/err"
    rc=$?
    expect_eq "exit status on a full disk ($(cat "$TMPD/err"))" "$rc" 1
    expect_has "disk full" "$(cat "$TMPD/err")" "disk full: kjv-mini-Q8_0.gguf needs 11.0 MB more"
else
    echo "test_pull: no mount namespace here: the full-disk check is skipped" >&2
fi

# --- TLS: an HTTPS hub whose certificate nobody trusts -------------------------------
if command -v openssl >/dev/null; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -subj /CN=127.0.0.1 -keyout "$TMPD/tls.key" -out "$TMPD/tls.pem" 2>/dev/null ||
        fail "openssl: the test certificate"
    python3 "$KS_SRC/tests/e2e/hub_fixture.py" --root "$ROOT" --control "$CTL" --log "$LOG" \
        --port-file "$TMPD/tls-ports" --tls-cert "$TMPD/tls.pem" --tls-key "$TMPD/tls.key" \
        2>>"$TMPD/fixture.err" &
    wait_for "the TLS fixture's ports" test -s "$TMPD/tls-ports"
    read -r TLS_HUB _ <"$TMPD/tls-ports"
    pull 1 kjv/mini-GGUF:q8_0 --endpoint "https://127.0.0.1:$TLS_HUB" --dir "$TMPD/m-tls" --retries 0
    expect_has "TLS failure" "$ERR" "TLS failure"
fi

echo "PASS: test_pull ($N_PULL pulls)"
