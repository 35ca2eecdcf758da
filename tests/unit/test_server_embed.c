/* test_server_embed.c — the bodies of /v1/embeddings, /tokenize and
 * /detokenize (src/server/api_embed.c): every input shape OpenAI allows,
 * each malformed one refused with a 400 naming the parameter, base64 as
 * little-endian f32, and llama.cpp's tokenize/detokenize shapes. */
#include "../check.h"
#include "server/server_int.h"

#include <math.h>
#include <sodium.h>

static srv_embed_req parse_ok(const char *body) {
    srv_embed_req r;
    srv_error err;
    bool ok = srv_embed_parse(body, strlen(body), &r, &err);
    if (!ok) fprintf(stderr, "%s: %s\n", body, err.msg);
    CHECK(ok);
    return r;
}

static srv_error parse_bad(const char *body, int status, const char *param) {
    srv_embed_req r;
    srv_error err;
    CHECK(!srv_embed_parse(body, strlen(body), &r, &err));
    CHECK(r.root == NULL && r.in == NULL);
    CHECK_EQ(err.status, status);
    if (param) CHECK_STR_EQ(err.param, param);
    return err;
}

static void test_embed_parse(void) {
    srv_embed_req r = parse_ok("{\"input\":\"hello\",\"model\":\"m\"}");
    CHECK_EQ(r.n, 1);
    CHECK(!r.in[0].is_ids);
    CHECK_STR_EQ(r.in[0].text, "hello");
    CHECK_STR_EQ(r.model, "m");
    CHECK(!r.base64);
    CHECK_EQ(r.dimensions, -1);
    srv_embed_req_free(&r);
    r = parse_ok("{\"input\":[\"a\",\"bc\"],\"encoding_format\":\"base64\",\"dimensions\":8,"
                 "\"user\":\"u\"}");
    CHECK_EQ(r.n, 2);
    CHECK_EQ(r.in[1].len, 2u);
    CHECK(r.base64);
    CHECK_EQ(r.dimensions, 8);
    srv_embed_req_free(&r);
    r = parse_ok("{\"input\":[1,2,3]}"); // one input of ids
    CHECK_EQ(r.n, 1);
    CHECK(r.in[0].is_ids);
    CHECK_EQ(r.in[0].n_ids, 3u);
    CHECK_EQ(r.in[0].ids[2], 3);
    srv_embed_req_free(&r);
    r = parse_ok("{\"input\":[[1,2],[5]],\"encoding_format\":\"float\"}");
    CHECK_EQ(r.n, 2);
    CHECK_EQ(r.in[1].n_ids, 1u);
    CHECK_EQ(r.in[1].ids[0], 5);
    srv_embed_req_free(&r);

    parse_bad("{\"model\":\"m\"}", 400, "input");
    parse_bad("{\"input\":null}", 400, "input");
    parse_bad("{\"input\":\"\"}", 400, "input");
    parse_bad("{\"input\":[]}", 400, "input");
    parse_bad("{\"input\":[[]]}", 400, "input");
    parse_bad("{\"input\":[\"a\",\"\"]}", 400, "input");
    srv_error e = parse_bad("{\"input\":[\"a\",[1]]}", 400, "input");
    CHECK_STR_HAS(e.msg, "all be strings or all be arrays");
    parse_bad("{\"input\":[[1],\"a\"]}", 400, "input");
    e = parse_bad("{\"input\":[1,-2]}", 400, "input");
    CHECK_STR_HAS(e.msg, "input[1]: token id -2 is out of range");
    parse_bad("{\"input\":[1,2.5]}", 400, "input");
    parse_bad("{\"input\":[1,3000000000]}", 400, "input");
    parse_bad("{\"input\":7}", 400, "input");
    parse_bad("{\"input\":{\"a\":1}}", 400, "input");
    parse_bad("{\"input\":\"a\",\"encoding_format\":\"int8\"}", 400, "encoding_format");
    parse_bad("{\"input\":\"a\",\"dimensions\":0}", 400, "dimensions");
    parse_bad("{\"input\":\"a\",\"dimensions\":\"8\"}", 400, "dimensions");
    parse_bad("{\"input\":\"a\",\"model\":3}", 400, "model");
    parse_bad("{\"input\":\"a\",\"user\":3}", 400, "user");
    e = parse_bad("{\"input\":\"a\",\"pooling\":\"cls\"}", 400, "pooling");
    CHECK_STR_EQ(e.code, "unsupported_parameter");
    e = parse_bad("{\"input\":\"a\"", 400, NULL);
    CHECK_STR_EQ(e.code, "invalid_json");
    parse_bad("[\"a\"]", 400, NULL);
    parse_bad("{\"input\":\"a\",\"input\":\"b\"}", 400, NULL); // ambiguous
    // more inputs than OpenAI allows
    size_t cap = 16 + 4 * (SRV_EMBED_MAX_INPUTS + 1);
    char *big = malloc(cap), *p = big;
    p += sprintf(p, "{\"input\":[");
    for (int i = 0; i <= SRV_EMBED_MAX_INPUTS; i++)
        p += sprintf(p, "%s\"a\"", i ? "," : "");
    sprintf(p, "]}");
    e = parse_bad(big, 400, "input");
    CHECK_STR_HAS(e.msg, "at most 2048");
    free(big);
}

static void test_embed_answer(void) {
    float v[6] = {0.5f, -0.25f, 0.125f, 1.0f, -1.0f, 3e-8f};
    json_t *j = srv_embed_answer(v, 2, 3, false, "m", 7);
    CHECK(j);
    CHECK_STR_EQ(json_string_value(json_object_get(j, "object")), "list");
    json_t *d = json_object_get(j, "data");
    CHECK_EQ(json_array_size(d), 2u);
    json_t *e1 = json_array_get(d, 1);
    CHECK_EQ(json_integer_value(json_object_get(e1, "index")), 1);
    CHECK_STR_EQ(json_string_value(json_object_get(e1, "object")), "embedding");
    json_t *emb = json_object_get(e1, "embedding");
    CHECK_EQ(json_array_size(emb), 3u);
    CHECK_EQ((float)json_real_value(json_array_get(emb, 2)), v[5]);
    json_t *u = json_object_get(j, "usage");
    CHECK_EQ(json_integer_value(json_object_get(u, "prompt_tokens")), 7);
    CHECK_EQ(json_integer_value(json_object_get(u, "total_tokens")), 7);
    // the float text (9 digits, as the server dumps it) parses back to the very same float
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_t *back = json_loads(s, 0, NULL);
    float r = (float)json_real_value(json_array_get(
        json_object_get(json_array_get(json_object_get(back, "data"), 1), "embedding"), 2));
    CHECK_MEM_EQ(&r, &v[5], sizeof r);
    json_decref(back);
    free(s);
    json_decref(j);
    // base64: little-endian f32
    j = srv_embed_answer(v, 2, 3, true, "m", 7);
    const char *b64 = json_string_value(
        json_object_get(json_array_get(json_object_get(j, "data"), 0), "embedding"));
    CHECK(b64);
    unsigned char raw[12];
    size_t n = 0;
    CHECK_EQ(sodium_base642bin(raw, sizeof raw, b64, strlen(b64), NULL, &n, NULL,
                               sodium_base64_VARIANT_ORIGINAL),
             0);
    CHECK_EQ(n, 12u);
    for (int i = 0; i < 3; i++) {
        uint32_t le = (uint32_t)raw[4 * i] | (uint32_t)raw[4 * i + 1] << 8 |
                      (uint32_t)raw[4 * i + 2] << 16 | (uint32_t)raw[4 * i + 3] << 24,
                 want;
        memcpy(&want, &v[i], 4);
        CHECK_EQ(le, want);
    }
    json_decref(j);
}

/* Every f32 survives the server's 9-digit JSON text exactly: 20000 random
 * finite bit patterns through srv_embed_answer, dumped and parsed back. */
static void test_float_text_exact(void) {
    enum { N = 20000 };
    float *v = malloc(sizeof(float) * N);
    uint32_t x = 12345;
    for (int i = 0; i < N; i++) {
        do {
            x = x * 1664525u + 1013904223u;
            memcpy(&v[i], &x, 4);
        } while (!isfinite(v[i]));
    }
    json_t *j = srv_embed_answer(v, 1, N, false, "m", 1);
    char *txt = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_t *back = json_loads(txt, 0, NULL);
    json_t *arr = json_object_get(json_array_get(json_object_get(back, "data"), 0), "embedding");
    CHECK_EQ(json_array_size(arr), (size_t)N);
    for (int i = 0; i < N; i++) {
        json_t *e = json_array_get(arr, (size_t)i);
        float r = (float)(json_is_integer(e) ? (double)json_integer_value(e) : json_real_value(e));
        CHECK_MEM_EQ(&r, &v[i], sizeof r);
    }
    json_decref(back);
    free(txt);
    json_decref(j);
    free(v);
}

static void test_tokenize_parse(void) {
    srv_tokenize_req r;
    srv_error err;
    const char *b = "{\"content\":\"hi there\"}";
    CHECK(srv_tokenize_parse(b, strlen(b), &r, &err));
    CHECK_STR_EQ(r.content, "hi there");
    CHECK(!r.add_special && !r.parse_special && !r.with_pieces); // llama.cpp's defaults
    json_decref(r.root);
    b = "{\"content\":\"x\",\"add_special\":true,\"with_pieces\":true,\"model\":\"m\"}";
    CHECK(srv_tokenize_parse(b, strlen(b), &r, &err));
    CHECK(r.add_special && r.with_pieces);
    CHECK_STR_EQ(r.model, "m");
    json_decref(r.root);
    b = "{\"content\":3}";
    CHECK(!srv_tokenize_parse(b, strlen(b), &r, &err));
    CHECK_STR_EQ(err.param, "content");
    b = "{}";
    CHECK(!srv_tokenize_parse(b, strlen(b), &r, &err));
    CHECK_STR_EQ(err.code, "missing_required_parameter");
    b = "{\"content\":\"x\",\"add_special\":1}";
    CHECK(!srv_tokenize_parse(b, strlen(b), &r, &err));
    CHECK_STR_EQ(err.param, "add_special");

    int32_t *ids;
    size_t n;
    const char *mname;
    json_t *root;
    b = "{\"tokens\":[1,2,9]}";
    CHECK(srv_detokenize_parse(b, strlen(b), 10, &ids, &n, &mname, &root, &err));
    CHECK_EQ(n, 3u);
    CHECK_EQ(ids[2], 9);
    CHECK(mname == NULL);
    free(ids);
    json_decref(root);
    b = "{\"tokens\":[]}";
    CHECK(srv_detokenize_parse(b, strlen(b), 10, &ids, &n, &mname, &root, &err));
    CHECK_EQ(n, 0u);
    json_decref(root);
    b = "{\"tokens\":[1,10]}";
    CHECK(!srv_detokenize_parse(b, strlen(b), 10, &ids, &n, &mname, &root, &err));
    CHECK_EQ(err.status, 400);
    CHECK_STR_HAS(err.msg, "tokens[1]: token id 10 is out of range");
    CHECK(ids == NULL && root == NULL);
    b = "{\"tokens\":[\"a\"]}";
    CHECK(!srv_detokenize_parse(b, strlen(b), 10, &ids, &n, &mname, &root, &err));
    CHECK_STR_EQ(err.param, "tokens");
    b = "{\"tokens\":5}";
    CHECK(!srv_detokenize_parse(b, strlen(b), 10, &ids, &n, &mname, &root, &err));
    b = "{\"tokens\":[1],\"content\":\"x\"}";
    CHECK(!srv_detokenize_parse(b, strlen(b), 10, &ids, &n, &mname, &root, &err));
    CHECK_STR_EQ(err.param, "content");
}

int main(void) {
    CHECK(sodium_init() >= 0);
    test_embed_parse();
    test_embed_answer();
    test_float_text_exact();
    test_tokenize_parse();
    printf("server embed ok\n");
    return 0;
}
