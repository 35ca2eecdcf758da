/* ssm_ref.c — the reference kernel of the Gated DeltaNet recurrence (the
 * linear-attention layers of hybrid models, model.h), beside the SIMD ones
 * in ssm_avx2.c and ssm_avx512.c; and of the Mamba2 scan step (kern_ssm.h). */
#include "kern/kern_int.h"
#include "kern/ssm_int.h"

#include <math.h>
#include <string.h>

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

/* Layout: P rows of N floats per head (row i: head element i), each
 * updated and read along its contiguous N state elements. */
void kern__ssm_scan_ref(int N, int P, float *const *rows, const float *x, const float *B,
                        const float *C, float dA, float dt, float *y) {
    for (int i = 0; i < P; i++) {
        float *r = rows[i];
        const float xd = x[i] * dt;
        double o = 0.0;
        for (int j = 0; j < N; j++) {
            r[j] = fmaf(B[j], xd, r[j] * dA);
            o += (double)r[j] * C[j];
        }
        y[i] = (float)o;
    }
}

kern_ssm_scan_fn kern_ssm_scan_for(const kern_vtab *v) {
    if (!strcmp(v->name, "avx512")) return kern__a512_ssm_scan;
    if (!strcmp(v->name, "avx2")) return kern__avx2_ssm_scan;
    return kern__ssm_scan_ref;
}
