/* bench_attend.c — one attention unit, the fused online-softmax kernel
 * (kv_attend + ie_attn_state_finish) against the two-pass loops it
 * replaced in att_run (f32: attn_scores, softmax, attn_values; other
 * types: kv_scores, softmax, kv_values), interleaved call by call on one
 * thread so both arms see the same machine. The rows of one KV head of a
 * TinyLlama-shaped cache (hd 64, 8 query heads, K and V rows kv_dim = 256
 * floats apart in blocks of 16 positions, as the pool lays them out).
 * --layers L: L such caches, each call on the next one the other arm did
 * not just read (L large enough: the rows come from DRAM, as in a decode
 * step). Prints per type the median ns of each arm and fused / two-pass.
 *
 * usage: bench_attend [--rows N] [--iters N] [--types f32,q8,...] [--heads N] [--hd N] [--layers L]
 */
#include "ie_kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static const char *const type_names[IE_KV_TYPE_COUNT] = {"f32", "f16", "bf16", "q8", "q4", "fp8_e4m3", "fp8_e5m2"};

int main(int argc, char **argv)
{
    int rows = 4096, iters = 200, nh = 8, hd = 64, layers = 1;
    const char *types = "f32,q8";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--heads") && i + 1 < argc) nh = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--hd") && i + 1 < argc) hd = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--types") && i + 1 < argc) types = argv[++i];
        else {
            fprintf(stderr,
                    "usage: %s [--rows N] [--iters N] [--types f32,q8,...] [--heads N] [--hd N] [--layers L]\n",
                    argv[0]);
            return 2;
        }
    }
    if (rows < 1 || iters < 1 || nh < 1 || nh > 64 || hd < 1 || hd > IE_KV_MAX_HD || layers < 1) {
        fprintf(stderr, "bench_attend: bad sizes\n");
        return 2;
    }
    const ie_kernels_t *ops = ie_kernels_get(ie_isa_best());
    const int kvh = 4, block = 16, nb = (rows + block - 1) / block;
    float *q = malloc(sizeof(float) * (size_t)nh * hd), *p = malloc(sizeof(float) * (size_t)nh * rows);
    float *o = malloc(sizeof(float) * (size_t)nh * hd), *y = malloc(sizeof(float) * (size_t)nh * hd);
    float m[64], l[64], x[IE_KV_MAX_HD];
    int32_t *tab = malloc(sizeof(int32_t) * (size_t)nb);
    for (int b = 0; b < nb; b++) tab[b] = b; /* in order, as a fresh pool */
    srand(1);
    for (int i = 0; i < nh * hd; i++) q[i] = (float)((double)rand() / RAND_MAX) - 0.5f;
    printf("bench_attend: %s, %d rows, %d heads of %d, %d layer(s), %d iterations a type (ns a call, medians)\n",
           ie_isa_name(ie_isa_best()), rows, nh, hd, layers, iters);
    for (int t = 0; t < IE_KV_TYPE_COUNT; t++) {
        if (!strstr(types, type_names[t]) || !ie_kv_head_bytes((ie_kv_type_t)t, hd)) continue;
        const size_t hb = ie_kv_head_bytes((ie_kv_type_t)t, hd), rb = hb * kvh;
        const size_t lb = rb * (size_t)nb * block; /* bytes of one layer's K (or V) */
        unsigned char *kc = malloc(lb * layers), *vc = malloc(lb * layers);
        for (int j = 0; j < nb * block * layers; j++)
            for (int h = 0; h < kvh; h++) {
                for (int i = 0; i < hd; i++) x[i] = (float)((double)rand() / RAND_MAX) - 0.5f;
                ie_kv_encode((ie_kv_type_t)t, x, hd, kc + (size_t)j * rb + (size_t)h * hb);
                ie_kv_encode((ie_kv_type_t)t, x, hd, vc + (size_t)j * rb + (size_t)h * hb);
            }
        const ie_attn_state_t st = {m, l, o, (size_t)hd};
        double *tf = malloc(sizeof(double) * iters), *tt = malloc(sizeof(double) * iters);
        for (int it = 0; it < iters; it++)
            for (int arm = 0; arm < 2; arm++) {
                const int fused = (arm ^ it) & 1; /* each arm first in every other pair */
                const size_t off = lb * (size_t)((2 * it + arm) % layers);
                const ie_kv_rows_t kr = {kc + off, rb, tab, block, rb * block},
                                   vr = {vc + off, rb, tab, block, rb * block};
                const ie_attn_rows_t kf = {(const float *)(void *)(kc + off), rb / 4, tab, block, rb * block / 4};
                const ie_attn_rows_t vf = {(const float *)(void *)(vc + off), rb / 4, tab, block, rb * block / 4};
                const ie_kv_attend_t a = {(ie_kv_type_t)t, (ie_kv_type_t)t, &kr,  &vr, 0, 0, rows, hd, nh, q,
                                          (size_t)hd,      0.125f,          0.0f, NULL};
                const double t0 = now_ns();
                if (fused) {
                    ops->kv_attend(&a, &st);
                    ie_attn_state_finish(&st, nh, hd, NULL, y, (size_t)hd);
                } else {
                    if (t == IE_KV_F32) ops->attn_scores(q, (size_t)hd, nh, &kf, 0, rows, hd, 0.125f, p, rows);
                    else ops->kv_scores((ie_kv_type_t)t, q, (size_t)hd, nh, &kr, 0, rows, hd, 0.125f, p, rows);
                    for (int h = 0; h < nh; h++) ops->softmax(p + (size_t)h * rows, rows, NULL);
                    if (t == IE_KV_F32) ops->attn_values(p, rows, nh, &vf, 0, rows, hd, y, (size_t)hd);
                    else ops->kv_values((ie_kv_type_t)t, p, rows, nh, &vr, 0, rows, hd, y, (size_t)hd);
                }
                (fused ? tf : tt)[it] = now_ns() - t0;
            }
        qsort(tf, iters, sizeof(double), cmp_d);
        qsort(tt, iters, sizeof(double), cmp_d);
        printf("%-9s two-pass %10.0f  fused %10.0f  fused/two-pass %.3f\n", type_names[t], tt[iters / 2],
               tf[iters / 2], tf[iters / 2] / tt[iters / 2]);
        free(tf), free(tt), free(kc), free(vc);
    }
    free(q), free(p), free(o), free(y), free(tab);
    return 0;
}
