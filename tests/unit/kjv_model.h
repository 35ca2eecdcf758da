/* kjv_model.h — the shipped model, models/kjv-mini.gguf (under $KS_SRC, or
 * the current folder), for the unit tests that run it or its tokenizer.
 * Header-only: static inline, so a test that does not call it is not
 * warned about it. */
#ifndef KS_TESTS_KJV_MODEL_H
#define KS_TESTS_KJV_MODEL_H

#include "../check.h"
#include "kvseal/kern.h"
#include "kvseal/model.h"

/* The model loaded (kern: kern_init picks the kernels first, as the binary
 * does before it loads), or NULL once the reason is printed; the caller
 * frees it with model_free. */
static inline model *kjv_model_load(bool kern) {
    const char *src = getenv("KS_SRC");
    char path[1024];
    snprintf(path, sizeof path, "%s/models/kjv-mini.gguf", src ? src : ".");
    ks_errbuf eb;
    if (kern) CHECK_EQ(kern_init(NULL, &eb), KS_OK);
    model *m = NULL;
    if (model_load(path, &m, &eb) != KS_OK) {
        fprintf(stderr, "%s\n", eb.msg);
        return NULL;
    }
    return m;
}

#endif
