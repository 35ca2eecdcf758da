/* pretok.c — BPE pre-tokenizers: the regex lists selected by
 * tokenizer.ggml.pre, compiled with PCRE2 (UTF + UCP), the multi-regex split
 * and GPT-2's bytes-to-unicode map.
 *
 * Split semantics follow llama.cpp's unicode_regex_split: regexes run in
 * order, each over every piece left by the previous one on its own (so
 * lookarounds and `$` see only that piece); both matches and the gaps between
 * them become pieces. Each final piece is then byte-encoded (every UTF-8 byte
 * -> one printable code point). The regex lists are the facts recorded in
 * llama.cpp (llama-vocab.cpp), with two adaptations for PCRE2:
 *  - `\s` is widened to Unicode White_Space (PCRE2's UCP \s lacks U+0085,
 *    which llama.cpp's tables count as whitespace);
 *  - non-ASCII literals are written as \x{...}, so that no editor or
 *    normalizer can fold e.g. U+212A KELVIN SIGN into 'K' and break a range;
 *  - llama.cpp's \p{S} lacks ASCII '~', so regexes with \p{S} spell that
 *    out (DeepSeek-V3's).
 * Names and splits are checked against llama-tokenize by
 * tests/e2e/test_tokenize_oracle.sh. */
#include "tok_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Regex lists

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CONTRACT "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3                                                                                  \
    RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"       \
                "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                   \
    RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"            \
                "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Qwen3.5: Qwen2's with combining marks (\p{M}) kept in words */
#define RE_QWEN35                                                                                  \
    RE_CONTRACT                                                                                    \
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"          \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_CJK "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
#define RE_PORO " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{0964}\\x{06D4}\\x{060C})]+"
#define RE_UPPER_LOWER(tail)                                                                       \
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" tail                    \
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" tail

/* deepseek-llm's letter class: the cased-letter ranges of its tokenizer.json. */
#define RE_DS_LETTERS                                                                              \
    "A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"                 \
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"         \
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}"                  \
    "\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}"                       \
    "\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"                 \
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}"                 \
    "\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}"                 \
    "\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}"         \
    "\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}"        \
    "\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"                  \
    "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}"                   \
    "\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}"        \
    "\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}"         \
    "\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}"                  \
    "\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}"                 \
    "\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"               \
    "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}"         \
    "\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}"

typedef struct pretok__def {
    const char *name;   /* canonical name */
    bool ignore_merges; /* a word that is a whole token skips the merges */
    bool add_bos;       /* pre-tokenizer implies add_bos (metadata may override) */
    const char *re[TOK__MAX_RE];
} pretok__def;

static const pretok__def pretok__defs[] = {
    {"default", false, false, {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {"llama3", true, true, {RE_LLAMA3}},
    {"dbrx", false, false, {RE_LLAMA3}},
    {"chatglm4", false, false, {RE_LLAMA3}},
    {"deepseek-llm",
     false,
     false,
     {"[\r\n]", "\\s?[" RE_DS_LETTERS "]+",
      "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
      "\\s+$", RE_CJK, "\\p{N}+"}},
    {"deepseek-coder", false, false, {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK, "\\p{N}"}},
    {"falcon", false, false, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}},
    {"starcoder", false, false, {"\\p{N}", RE_GPT2}},
    {"gpt2", false, false, {RE_GPT2}},
    {"qwen2", false, false, {RE_QWEN2}},
    {"qwen35", false, false, {RE_QWEN35}},
    /* DeepSeek-V3: digits in threes, then Han and kana runs, then words
     * (one ASCII punctuation may lead an ASCII word; marks stay in words).
     * llama.cpp's \p{S} leaves out ASCII '~' (its table of the ASCII
     * members of each category lacks it), so here \p{S} is written
     * without '~' and [^...\p{S}] with it. */
    {"deepseek-v3",
     false,
     false,
     {"\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
      "(?:~|[^\\r\\n\\p{L}\\p{P}\\p{S}])?[\\p{L}\\p{M}]+|"
      " ?(?:(?!~)[\\p{P}\\p{S}])+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    /* Ling (bailingmoe): Qwen2's, one newline per \s*[\r\n] */
    {"bailingmoe",
     false,
     false,
     {"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
      " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"}},
    /* Chameleon: sentinel and image tokens, tabs/newlines and 2 or 4 spaces,
     * digits, each punctuation mark, then GPT-2's */
    {"chameleon",
     false,
     true,
     {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
      "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2}},
    {"poro", false, false, {RE_PORO}},
    {"viking", false, false, {RE_PORO, "\\p{N}"}},
    {"tekken",
     true,
     true,
     {RE_UPPER_LOWER("") "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"gpt4o",
     false,
     false,
     {RE_UPPER_LOWER(RE_CONTRACT "?") "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|"
                                      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"seed-coder",
     false,
     false,
     {RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|"
                  "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
};

/* tokenizer.ggml.pre values -> canonical definition (llama.cpp's groups). */
static const struct {
    const char *pre, *def;
} pretok__alias[] = {
    {"default", "default"},
    {"llama3", "llama3"},
    {"llama-v3", "llama3"},
    {"llama-bpe", "llama3"},
    {"falcon3", "llama3"},
    {"falcon-h1", "llama3"},
    {"pixtral", "llama3"},
    {"midm-2.0", "llama3"},
    {"lfm2", "llama3"},
    {"dbrx", "dbrx"},
    {"smaug-bpe", "dbrx"},
    {"chatglm-bpe", "chatglm4"},
    {"glm4", "chatglm4"},
    {"deepseek-llm", "deepseek-llm"},
    {"deepseek-coder", "deepseek-coder"},
    {"falcon", "falcon"},
    {"starcoder", "starcoder"},
    {"refact", "starcoder"},
    {"command-r", "starcoder"},
    {"smollm", "starcoder"},
    {"codeshell", "starcoder"},
    {"exaone", "starcoder"},
    {"minerva-7b", "starcoder"},
    {"gpt-2", "gpt2"},
    {"mpt", "gpt2"},
    {"olmo", "gpt2"},
    {"jais", "gpt2"},
    {"trillion", "gpt2"},
    {"phi-2", "gpt2"},
    {"jina-es", "gpt2"},
    {"jina-de", "gpt2"},
    {"gigachat", "gpt2"},
    {"jina-v1-en", "gpt2"},
    {"jina-v2-es", "gpt2"},
    {"jina-v2-de", "gpt2"},
    {"jina-v2-code", "gpt2"},
    {"roberta-bpe", "gpt2"},
    {"a.x-4.0", "gpt2"},
    {"mellum", "gpt2"},
    {"exaone4", "gpt2"},
    {"qwen2", "qwen2"},
    {"deepseek-r1-qwen", "qwen2"},
    {"stablelm2", "qwen2"},
    {"megrez", "qwen2"},
    {"hunyuan", "qwen2"},
    {"kormo", "qwen2"},
    {"bailingmoe", "bailingmoe"},
    {"bailingmoe2", "bailingmoe"},
    {"llada-moe", "bailingmoe"},
    {"chameleon", "chameleon"},
    {"solar-open", "qwen2"},
    {"grok-2", "qwen2"},
    {"qwen35", "qwen35"},
    {"deepseek-v3", "deepseek-v3"},
    {"hunyuan-dense", "deepseek-v3"},
    {"joyai-llm", "deepseek-v3"},
    {"minimax-m2", "gpt4o"},
    {"granite-docling", "gpt2"},
    {"poro-chat", "poro"},
    {"bloom", "poro"},
    {"gpt3-finnish", "poro"},
    {"viking", "viking"},
    {"tekken", "tekken"},
    {"gpt-4o", "gpt4o"},
    {"llama4", "gpt4o"},
    {"seed-coder", "seed-coder"},
};

// ----------------------------------------------------------------------------
// Compile

/* Rewrites `\s` to Unicode White_Space: outside a class `\s` -> `[\s\x{85}]`
 * and `\S` -> `[^\s\x{85}]`; inside a class `\s` -> `\s\x{85}`. */
static char *pretok__widen_space(const char *re) {
    size_t n = strlen(re);
    char *out = malloc(n * 4 + 1);
    if (!out) return NULL;
    size_t o = 0;
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = re[i];
        if (c == '\\' && i + 1 < n) {
            char d = re[i + 1];
            i++;
            if (d == 's') {
                const char *r = in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
                memcpy(out + o, r, strlen(r));
                o += strlen(r);
            } else if (d == 'S' && !in_class) {
                memcpy(out + o, "[^\\s\\x{85}]", 11);
                o += 11;
            } else {
                out[o++] = c;
                out[o++] = d;
            }
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = true;
            out[o++] = c;
            if (i + 1 < n && re[i + 1] == '^') out[o++] = re[++i];
            if (i + 1 < n && re[i + 1] == ']') out[o++] = re[++i]; /* literal ] first */
            continue;
        }
        if (c == ']' && in_class) in_class = false;
        out[o++] = c;
    }
    out[o] = '\0';
    return out;
}

ks_err tok__pretok_init(tok__pretok *p, const char *name, size_t name_len, bool *ignore_merges,
                        bool *add_bos, ks_errbuf *eb) {
    memset(p, 0, sizeof *p);
    const char *def_name = "default";
    if (name && name_len > 0) {
        bool found = false;
        for (size_t i = 0; i < sizeof pretok__alias / sizeof pretok__alias[0]; i++) {
            if (strlen(pretok__alias[i].pre) == name_len &&
                memcmp(pretok__alias[i].pre, name, name_len) == 0) {
                def_name = pretok__alias[i].def;
                found = true;
                break;
            }
        }
        if (!found) /* as llama.cpp: a name it does not know is an error */
            return ks_seterr(
                eb, KS_ERR_UNSUPPORTED,
                "tokenizer: pre-tokenizer '%.*s' (tokenizer.ggml.pre) is not supported",
                (int)(name_len > 64 ? 64 : name_len), name);
    }
    const pretok__def *d = NULL;
    for (size_t i = 0; i < sizeof pretok__defs / sizeof pretok__defs[0]; i++)
        if (!strcmp(pretok__defs[i].name, def_name)) d = &pretok__defs[i];
    KS_ASSERT(d != NULL);
    snprintf(p->name, sizeof p->name, "%s", d->name);
    *ignore_merges = d->ignore_merges;
    if (d->add_bos) *add_bos = true;

    for (int k = 0; k < TOK__MAX_RE && d->re[k]; k++) {
        char *re = pretok__widen_space(d->re[k]);
        if (!re) {
            tok__pretok_free(p);
            return ks_seterr(eb, KS_ERR_NOMEM, "tokenizer: no memory for regex");
        }
        int errcode;
        PCRE2_SIZE erroff;
        pcre2_code *c =
            pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &errcode, &erroff, NULL);
        if (!c) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(errcode, msg, sizeof msg);
            ks_err e = ks_seterr(eb, KS_ERR_FORMAT,
                                 "tokenizer: pre-tokenizer '%s' regex %d: %s at offset %zu",
                                 d->name, k, (const char *)msg, (size_t)erroff);
            free(re);
            tok__pretok_free(p);
            return e;
        }
        free(re);
        /* JIT is an optimisation only: without it pcre2_match interprets. */
        (void)pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);
        p->re[p->n_re++] = c;
    }
    for (unsigned c = 0; c < 256; c++)
        p->enc_n[c] = (uint8_t)tok__utf8_put(tok__byte_to_cpt((uint8_t)c), p->enc[c]);
    return KS_OK;
}

void tok__pretok_free(tok__pretok *p) {
    for (int k = 0; k < p->n_re; k++)
        pcre2_code_free(p->re[k]);
    p->n_re = 0;
}

// ----------------------------------------------------------------------------
// GPT-2 bytes <-> unicode

/* Printable bytes map to themselves; the other 68 map to 256, 257, ... in
 * byte order (GPT-2's bytes_to_unicode). */
static bool pretok__printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t tok__byte_to_cpt(uint8_t b) {
    if (pretok__printable(b)) return b;
    if (b <= 0x20) return 256u + b;                        /* 0x00..0x20 -> 256..288 */
    if (b >= 0x7F && b <= 0xA0) return 289u + (b - 0x7Fu); /* -> 289..322 */
    return 323u;                                           /* 0xAD */
}

int tok__cpt_to_byte(uint32_t cpt) {
    if (cpt < 256) return pretok__printable(cpt) ? (int)cpt : -1;
    if (cpt <= 288) return (int)(cpt - 256);
    if (cpt <= 322) return (int)(0x7F + (cpt - 289));
    if (cpt == 323) return 0xAD;
    return -1;
}

size_t tok__utf8_put(uint32_t cpt, char *out) {
    if (cpt < 0x80) {
        out[0] = (char)cpt;
        return 1;
    }
    if (cpt < 0x800) {
        out[0] = (char)(0xC0 | (cpt >> 6));
        out[1] = (char)(0x80 | (cpt & 0x3F));
        return 2;
    }
    if (cpt < 0x10000) {
        out[0] = (char)(0xE0 | (cpt >> 12));
        out[1] = (char)(0x80 | ((cpt >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cpt & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cpt >> 18));
    out[1] = (char)(0x80 | ((cpt >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cpt >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cpt & 0x3F));
    return 4;
}

// ----------------------------------------------------------------------------
// Split

/* A list of piece lengths over the text, in order. */
typedef struct pretok__offs {
    size_t *p;
    size_t n, cap;
} pretok__offs;

static bool pretok__offs_push(pretok__offs *o, size_t len) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        size_t *p = realloc(o->p, cap * sizeof *p);
        if (!p) return false;
        o->p = p;
        o->cap = cap;
    }
    o->p[o->n++] = len;
    return true;
}

/* Splits every piece of `in` with re, appending the new lengths to out. */
static bool pretok__split_one(const pcre2_code *re, const char *text, const pretok__offs *in,
                              pretok__offs *out, pcre2_match_data *md) {
    size_t start = 0;
    for (size_t k = 0; k < in->n; k++) {
        size_t len = in->p[k];
        const PCRE2_SPTR subj = (PCRE2_SPTR)(text + start);
        size_t pos = 0, last = 0;
        while (pos < len) {
            int rc = pcre2_match(re, subj, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
            if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) /* e.g. JIT stack: interpret */
                rc = pcre2_match(re, subj, len, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
            if (rc < 0) break; /* no (more) matches: the rest is a gap */
            const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t ms = ov[0], me = ov[1];
            if (me == ms) { /* empty match: step one character, emit nothing */
                pos = ms + 1;
                while (pos < len && (text[start + pos] & 0xC0) == 0x80)
                    pos++;
                continue;
            }
            if (ms > last && !pretok__offs_push(out, ms - last)) return false;
            if (!pretok__offs_push(out, me - ms)) return false;
            last = pos = me;
        }
        if (last < len && !pretok__offs_push(out, len - last)) return false;
        start += len;
    }
    return true;
}

bool tok__pretok_split(const tok__pretok *p, const char *text, size_t len, tok__buf *words,
                       tok__ids *lens) {
    if (len == 0) return true;
    pretok__offs a = {0}, b = {0};
    pcre2_match_data *md = NULL;
    bool ok = pretok__offs_push(&a, len);
    for (int k = 0; ok && k < p->n_re; k++) {
        if (md) pcre2_match_data_free(md);
        md = pcre2_match_data_create_from_pattern(p->re[k], NULL);
        if (!md) {
            ok = false;
            break;
        }
        b.n = 0;
        ok = pretok__split_one(p->re[k], text, &a, &b, md);
        pretok__offs t = a;
        a = b;
        b = t;
    }
    if (md) pcre2_match_data_free(md);

    /* byte-encode each piece */
    size_t off = 0;
    for (size_t k = 0; ok && k < a.n; k++) {
        size_t before = words->len;
        if (!tok__buf_reserve(words, a.p[k] * 2)) {
            ok = false;
            break;
        }
        for (size_t i = 0; i < a.p[k]; i++) {
            uint8_t c = (uint8_t)text[off + i];
            memcpy(words->p + words->len, p->enc[c], p->enc_n[c]);
            words->len += p->enc_n[c];
        }
        off += a.p[k];
        if (words->len - before > INT32_MAX || !tok__ids_push(lens, (int32_t)(words->len - before)))
            ok = false;
    }
    free(a.p);
    free(b.p);
    return ok;
}
