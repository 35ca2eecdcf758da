/* kern_ssm.h — the Mamba2 selective-scan step of hybrid models (nemotron_h's
 * recurrent layers, model.h), beside kern.h's vtab.
 *
 * It sits outside kern_vtab so that adding it left the big per-ISA kernel
 * files (and their long compiles) alone: kern_ssm_scan_for picks the
 * implementation for a vtab by its ISA. */
#ifndef KS_KERN_SSM_H
#define KS_KERN_SSM_H

#include "kvseal/kern.h"

/* One token of the Mamba2 scan on one head: the state is P rows of N floats
 * (rows[i]: head element i against the N state elements; N a multiple of
 * 16, rows anywhere). Each row decays by dA and takes in the token, r[j] =
 * r[j] * dA + B[j] * (x[i] * dt), then is read by C: y[i] = r . C after the
 * update. Rows are updated in place (the update is the same bits in every
 * implementation); the SIMD versions match the reference within f32
 * rounding of the dot product, each in a fixed order (so a token's values
 * never depend on the batch). */
typedef void (*kern_ssm_scan_fn)(int N, int P, float *const *rows, const float *x, const float *B,
                                 const float *C, float dA, float dt, float *y);

/* The scan step for vtab v's ISA (AVX-512, AVX2, or the reference). Can't
 * fail. */
kern_ssm_scan_fn kern_ssm_scan_for(const kern_vtab *v);

#endif
