/* sampling_json.c — the sampler parameters of an OpenAI / Workers AI / Anthropic
 * request body, read from the one list of them (SAMPLE_PARAM_MAP in
 * kvseal/sample.h): which keys exist, their API ranges, and the message of a
 * value the sampler refuses, named by the key the client sent. */
#include "server_int.h"

#include <string.h>

#include "kvseal/sample.h"

/* Reads key (absent or null: *out unchanged) as a number in [lo, hi]. */
static bool sj__f32(json_t *root, const char *key, double lo, double hi, float *out,
                    srv_error *err) {
    json_t *v = key ? json_object_get(root, key) : NULL;
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v))
        return srv_refuse(err, ADMIT_INVALID, key, "'%s' must be a number, got %s", key,
                          srv_json_type(v));
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return srv_refuse(err, ADMIT_INVALID, key, "'%s' must be in [%g, %g], got %g", key, lo, hi,
                          d);
    *out = (float)d;
    return true;
}

/* Reads key (absent or null: *out unchanged) as an integer in [lo, hi]. */
static bool sj__i32(json_t *root, const char *key, double lo, double hi, int32_t *out,
                    srv_error *err) {
    json_t *v = key ? json_object_get(root, key) : NULL;
    if (!v || json_is_null(v)) return true;
    if (!json_is_integer(v))
        return srv_refuse(err, ADMIT_INVALID, key, "'%s' must be an integer, got %s", key,
                          srv_json_type(v));
    long long x = json_integer_value(v);
    if ((double)x < lo || (double)x > hi)
        return srv_refuse(err, ADMIT_INVALID, key, "'%s' must be in [%lld, %lld], got %lld", key,
                          (long long)lo, (long long)hi, x);
    *out = (int32_t)x;
    return true;
}

/* key is given (a NULL key: never). */
static bool sj__has(json_t *root, const char *key) { return key && json_object_get(root, key); }
/* k equals key (a NULL key: never). */
static bool sj__eq(const char *k, const char *key) { return key && !strcmp(k, key); }

#define SJ__READ_SAMPLE_F32 sj__f32
#define SJ__READ_SAMPLE_I32 sj__i32

bool srv_sampling_read(json_t *root, sample_params *sp, srv_error *err) {
    // every row with a key, alias first (the key wins when both are given)
#define SJ__READ(f, T, key, alias, def, off, lo, lo_open, hi, what, jhi, ...)                      \
    if (!SJ__READ_##T(root, alias, lo, jhi, &sp->f, err) ||                                        \
        !SJ__READ_##T(root, key, lo, jhi, &sp->f, err))                                            \
        return false;
    SAMPLE_PARAM_MAP(SJ__READ)
#undef SJ__READ
    ks_errbuf eb = {0};
    if (sample_params_validate(sp, &eb) == KS_OK) return true;
    // its message starts with the field's name: name the key the client sent
    size_t n = strcspn(eb.msg, " ");
    const char *param = NULL;
#define SJ__KEY(f, T, key, alias, ...)                                                             \
    if (!param && n == strlen(#f) && !strncmp(eb.msg, #f, n))                                      \
        param = sj__has(root, key) ? key : sj__has(root, alias) ? alias : #f;
    SAMPLE_PARAM_MAP(SJ__KEY)
#undef SJ__KEY
    if (!param) return srv_refuse(err, ADMIT_INVALID, NULL, "%s", eb.msg);
    return srv_refuse(err, ADMIT_INVALID, param, "'%s'%s", param, eb.msg + n);
}

bool srv_sampling_known(const char *k, bool anthropic) {
#define SJ__KNOWN(f, T, key, alias, def, off, lo, lo_open, hi, what, jhi, wire, cli, anth)         \
    if ((!anthropic || anth) && (sj__eq(k, key) || sj__eq(k, alias))) return true;
    SAMPLE_PARAM_MAP(SJ__KNOWN)
#undef SJ__KNOWN
    return false;
}
