/* tok.h — tokenizers read from GGUF: SentencePiece-style (`llama`) and
 * byte-level BPE (`gpt2`) vocabularies, special-token splitting, pieces and a
 * streaming UTF-8 detokenizer.
 *
 * Behaviour follows llama.cpp's tokenizer token for token (the test vectors in
 * ../shared/vocab come from it): SPM is a score-driven bigram merge over UTF-8
 * characters with <0xXX> byte fallback; BPE splits text with the
 * pre-tokenizer regexes chosen by `tokenizer.ggml.pre` (PCRE2, UTF + UCP),
 * maps bytes to GPT-2's printable code points and merges by rank.
 * A tok_vocab is immutable after load: every function taking a const tok_vocab *
 * may be called from several threads at once. Nothing here blocks. */
#ifndef KS_TOK_H
#define KS_TOK_H

#include "kvseal/base.h"
#include "kvseal/gguf.h"

/* Vocabulary kinds (tokenizer.ggml.model). */
typedef enum tok_kind {
    TOK_KIND_SPM = 1, /* "llama" */
    TOK_KIND_BPE = 2, /* "gpt2"; also "gemma4", SentencePiece-style BPE (tok_vocab_load) */
    TOK_KIND_WPM = 3, /* "bert": WordPiece */
} tok_kind;

/* Token types as stored in tokenizer.ggml.token_type (append-only). */
typedef enum tok_type {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
} tok_type;

#define TOK_NULL (-1) /* "no such token" */

typedef struct tok_vocab tok_vocab;

/* Builds a vocabulary from f's tokenizer.ggml.* metadata. Copies everything
 * it needs: f may be closed afterwards. *out is owned by the caller (free with
 * tok_vocab_free). Errors: KS_ERR_FORMAT (missing/malformed tokens, scores,
 * token types or merges; bad UTF-8 in a regex), KS_ERR_UNSUPPORTED (a model
 * other than "llama"/"gpt2", or a tokenizer.ggml.pre kvseal does not know:
 * llama.cpp refuses those too), KS_ERR_NOMEM. A BPE vocabulary without
 * tokenizer.ggml.pre uses "default", with a warning. */
ks_err tok_vocab_load(const gguf_file *f, tok_vocab **out /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* Frees a vocabulary; accepts NULL. */
void tok_vocab_free(tok_vocab *v);

/* Facts about the vocabulary; these can't fail. Ids are TOK_NULL when absent. */
tok_kind tok_vocab_kind(const tok_vocab *v);
int32_t tok_n_vocab(const tok_vocab *v);
int32_t tok_bos(const tok_vocab *v);
int32_t tok_eos(const tok_vocab *v);
int32_t tok_eot(const tok_vocab *v);
bool tok_add_bos(const tok_vocab *v); /* tok_encode(add_special) prepends BOS */
bool tok_add_eos(const tok_vocab *v); /* tok_encode(add_special) appends EOS */
/* True for end-of-generation tokens: EOS, EOT, EOM and the chat-end tokens
 * found by text ("<|eot_id|>", "<|im_end|>", "<|end|>", ...). */
bool tok_is_eog(const tok_vocab *v, int32_t id);
/* Name of the pre-tokenizer in use ("spm" for SPM vocabularies); static or
 * vocab-owned storage. */
const char *tok_pre_name(const tok_vocab *v);

/* Raw vocabulary string of id (NUL-terminated, owned by v; "" for an id out
 * of range). It is the stored form: U+2581 for spaces (SPM), GPT-2 code points
 * (BPE). */
const char *tok_token_text(const tok_vocab *v, int32_t id);
/* Type of id (TOK_TYPE_UNDEFINED for an id out of range). */
tok_type tok_token_type(const tok_vocab *v, int32_t id);
/* Id whose raw vocabulary string is exactly text[0..len), or TOK_NULL. */
int32_t tok_find(const tok_vocab *v, const char *text, size_t len);

/* Tokenizes len bytes of text (need not be NUL-terminated or valid UTF-8:
 * SPM falls back to byte tokens, BPE reads an invalid byte as U+FFFD, as
 * llama.cpp does). add_special: prepend BOS / append EOS as tok_add_bos /
 * tok_add_eos say. parse_special: text equal to a control or unknown token's
 * string becomes that token; user-defined tokens are always split out first
 * (llama.cpp behaviour). On success *ids is malloc'd (caller frees; NULL when
 * *n_ids is 0). Errors: KS_ERR_NOMEM, KS_ERR_INVAL (text NULL with len > 0). */
ks_err tok_encode(const tok_vocab *v, const char *text, size_t len, bool add_special,
                  bool parse_special, int32_t **ids /* OUT */, size_t *n_ids /* OUT */,
                  ks_errbuf *eb) KS_MUST_USE;
/* tok_encode that stops early once it has produced more than max_ids ids
 * (a server's context length), so an over-long text costs about max_ids
 * tokens of work, not its whole length. It stops between two BPE words or
 * two fragments around special tokens, which are tokenized independently:
 * when *n_ids > max_ids, the ids are an exact prefix of tok_encode's (no
 * EOS appended) and the whole text has at least *n_ids tokens; otherwise
 * they are exactly tok_encode's. Same ownership and errors as tok_encode. */
ks_err tok_encode_max(const tok_vocab *v, const char *text, size_t len, bool add_special,
                      bool parse_special, size_t max_ids, int32_t **ids /* OUT */,
                      size_t *n_ids /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* A byte range [off, off + len) of a text. */
typedef struct tok_span {
    size_t off; /* public */
    size_t len; /* public */
} tok_span;

/* tok_encode_max for a text part of which came from someone other than the
 * caller (a chat request's content rendered into a template): a special
 * token's text (control or unknown with parse_special, user-defined always,
 * as tok_encode) becomes that token only where it lies wholly outside every
 * one of the text spans text_spans[0..n_spans) (sorted, disjoint; borrowed);
 * inside them, and across their edges, it is text, so request text can
 * spell none of the template's markers (user-defined ones such as Qwen's
 * <tool_response> included). The spans do not cut the text otherwise: its
 * tokenization is tok_encode's wherever no span spells a token. Errors as
 * tok_encode_max's, plus KS_ERR_INVAL for spans out of order or past len.
 * Same ownership. */
ks_err tok_encode_marked(const tok_vocab *v, const char *text, size_t len, bool add_special,
                         bool parse_special, const tok_span *text_spans, size_t n_spans,
                         size_t max_ids, int32_t **ids /* OUT */, size_t *n_ids /* OUT */,
                         ks_errbuf *eb) KS_MUST_USE;
/* The most bytes of input text one token can stand for, so a text of n
 * bytes has at least ceil(n / tok_max_token_bytes) tokens; 0 when there is
 * no such bound (special tokens that eat the whitespace next to them, as in
 * Phi-3, make any run of whitespace tokenless). Linear in the vocabulary
 * size (cache it); can't fail. */
size_t tok_max_token_bytes(const tok_vocab *v);

/* Writes the raw bytes of token id into buf (at most cap bytes, no NUL) and
 * returns the number of bytes the piece has (which may exceed cap: then only
 * cap bytes were written). Byte tokens give their byte, U+2581 becomes a space
 * (SPM), GPT-2 code points become bytes (BPE). Control and unknown tokens give
 * their text only if render_special, else nothing; unused tokens and ids out
 * of range give nothing. Can't fail. */
size_t tok_piece(const tok_vocab *v, int32_t id, bool render_special, char *buf, size_t cap);
/* Longest piece of any token, in bytes; can't fail. */
size_t tok_max_piece(const tok_vocab *v);

/* Concatenates the pieces of ids[0..n) into buf (cap bytes, NUL-terminated
 * when cap > 0, truncated if short) and returns the length the whole text
 * has, without the NUL. strip_space: drop one leading space that the SPM
 * space-prefix rule added (only if the vocabulary adds one). Can't fail. */
size_t tok_detokenize(const tok_vocab *v, const int32_t *ids, size_t n, bool render_special,
                      bool strip_space, char *buf, size_t cap);

/* Streaming detokenizer: turns tokens into text that is always complete,
 * valid UTF-8. A multi-byte character split over several byte tokens is held
 * back until it is complete; bytes that can never form a valid character are
 * emitted as U+FFFD (one per byte). The caller owns the struct; one stream
 * per sequence, not shared between threads. */
typedef struct tok_stream {
    bool render_special; /* public: render control tokens' text (default false) */
    uint8_t n_pend;      /* private: bytes held in pend */
    uint8_t pend[4];     /* private: an incomplete UTF-8 sequence */
} tok_stream;

/* Resets s to an empty stream (render_special false); can't fail. */
void tok_stream_init(tok_stream *s);
/* Output capacity that always suffices for one tok_stream_push or flush. */
size_t tok_stream_bound(const tok_vocab *v);
/* Adds token id and writes the text that became complete into out. Returns
 * the number of bytes of that text; if it exceeds cap nothing was written and
 * the stream is unchanged (retry with a bigger buffer, e.g. tok_stream_bound
 * bytes). Output is not NUL-terminated. */
size_t tok_stream_push(tok_stream *s, const tok_vocab *v, int32_t id, char *out, size_t cap);
/* Ends the stream: an incomplete tail becomes one U+FFFD (3 bytes). Returns
 * the bytes written (0 or 3; nothing written and 3 returned if cap < 3) and
 * resets the stream. */
size_t tok_stream_flush(tok_stream *s, char *out, size_t cap);

#endif /* KS_TOK_H */
