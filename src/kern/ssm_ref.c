/* ssm_ref.c — the reference kernel of the Gated DeltaNet recurrence (the
 * linear-attention layers of hybrid models, model.h), beside the SIMD ones
 * in ssm_avx2.c and ssm_avx512.c. */
#include "kern/kern_int.h"

#include <math.h>

/* Layout: the state of one value head is S rows of S floats; row j holds
 * value element j against every key element i, so each step reads and
 * writes whole contiguous rows. Per row: decay, the row's prediction of v[j]
 * from k, the delta rule's correction, then the row read by q. */
void kern__gdn_step_ref(int S, float *const *rows, const float *q, const float *k, const float *v,
                        float decay, float beta, float *out) {
    for (int j = 0; j < S; j++) {
        float *r = rows[j];
        double sk = 0.0;
        for (int i = 0; i < S; i++) {
            r[i] *= decay;
            sk += (double)r[i] * k[i];
        }
        const float d = (v[j] - (float)sk) * beta;
        double o = 0.0;
        for (int i = 0; i < S; i++) {
            r[i] = fmaf(k[i], d, r[i]);
            o += (double)r[i] * q[i];
        }
        out[j] = (float)o;
    }
}
