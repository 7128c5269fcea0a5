/* test_bsr.c — block-sparse (BSR) blobs and matmul, every compiled ISA.
 *
 * Oracle: the dense product computed in double from the dense matrix with
 * the dropped blocks zeroed. Tolerance (all ISAs, the reference included):
 *     |y - y_exact| <= 1e-5 * sum_k |w_k * x_k|   (exactly 0 when that is 0)
 * f32 accumulation of at most a few thousand products adds far less.
 * Outputs outside [r0, r1) x n_tok (ldy > n_out, guard floats after the last
 * row) must be left untouched; activations end at a PROT_NONE page so any
 * SIMD over-read faults. ie_bsr_view is checked on hand-made corruptions
 * (each rejected with a message) and on random mutations (never crashes;
 * run under ASan with -DIE_SANITIZE=ON; when it accepts a mutated blob, the
 * matmuls must run on it without reading outside it).
 */
#define _GNU_SOURCE
#include "ie_kernels.h"
#include "../../kernels/src/ie_kernels_isa.h"
#include "ie_test_rng.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------- helpers */


static int n_isas(ie_isa_t *isas)
{
    int n = 0;
    for (int i = IE_ISA_REF; i <= IE_ISA_AVX512; i++)
        if (ie_kernels_get((ie_isa_t)i)) isas[n++] = (ie_isa_t)i;
    return n;
}

/* n floats whose last one ends right before a PROT_NONE page. Free with
 * guard_free(p, n). */
static float *guard_alloc(size_t n)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    const size_t data = (n * sizeof(float) + pg - 1) / pg * pg;
    char *base = mmap(NULL, data + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return NULL;
    mprotect(base + data, pg, PROT_NONE);
    return (float *)(base + data) - n;
}

static void guard_free(float *p, size_t n)
{
    if (!p) return;
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    const size_t data = (n * sizeof(float) + pg - 1) / pg * pg;
    munmap((char *)(p + n) - data, data + pg);
}

/* Exact product (double) and the magnitude sum of its terms, for n_tok
 * tokens x rows n_out: ex[t*n_out + r], mag[t*n_out + r]. */
static void dense_exact(const float *w, int64_t n_out, int64_t n_in, const float *x, size_t xs, int64_t n_tok,
                        double *ex, double *mag)
{
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < n_out; r++) {
            double s = 0, a = 0;
            for (int64_t k = 0; k < n_in; k++) {
                const double p = (double)w[r * n_in + k] * (double)x[(size_t)t * xs + (size_t)k];
                s += p;
                a += fabs(p);
            }
            ex[t * n_out + r] = s;
            mag[t * n_out + r] = a;
        }
}

/* A 64-byte aligned copy of `bytes` bytes (exact size, so ASan sees every
 * byte past it). */
static void *aligned_copy(const void *src, size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 1) != 0) return NULL;
    if (bytes) memcpy(p, src, bytes);
    return p;
}

/* ------------------------------------------------------ matmul vs dense */

enum { PAT_RANDOM, PAT_DENSE, PAT_EMPTY, PAT_EMPTY_ROWS, PAT_DIAG };

typedef struct {
    int br, bc, nbr, nbc, pat;
} cfg_t;

static const float SENT = -12345.5f;

/* Random dense matrix with whole blocks zeroed per `pat`; returns the number
 * of non-zero blocks. */
static int64_t make_matrix(float *w, const cfg_t *c)
{
    const int64_t n_out = (int64_t)c->br * c->nbr, n_in = (int64_t)c->bc * c->nbc;
    for (int64_t i = 0; i < n_out * n_in; i++) w[i] = rng_f();
    int64_t kept = 0;
    for (int bi = 0; bi < c->nbr; bi++)
        for (int bj = 0; bj < c->nbc; bj++) {
            int keep;
            switch (c->pat) {
            case PAT_DENSE: keep = 1; break;
            case PAT_EMPTY: keep = 0; break;
            case PAT_EMPTY_ROWS: keep = (bi % 3 != 1) && (rng_u32() % 4 != 0); break;
            case PAT_DIAG: keep = bj == bi % c->nbc; break;
            default: keep = rng_u32() % 2 == 0; break;
            }
            if (keep) {
                kept++;
                continue;
            }
            for (int i = 0; i < c->br; i++)
                for (int j = 0; j < c->bc; j++) w[(int64_t)(bi * c->br + i) * n_in + bj * c->bc + j] = 0.0f;
        }
    return kept;
}

static int g_fail_prints;

/* Runs every ISA over several n_tok, ranges and ldy; checks results and that
 * nothing else in y changed. */
static void check_cfg(const cfg_t *c, int max_tok)
{
    ie_isa_t isas[3];
    const int ni = n_isas(isas);
    const int64_t n_out = (int64_t)c->br * c->nbr, n_in = (int64_t)c->bc * c->nbc;
    float *w = malloc(sizeof(float) * (size_t)(n_out * n_in));
    const int64_t kept = make_matrix(w, c);

    void *blob = NULL;
    size_t bytes = 0;
    CU_ASSERT_EQUAL_FATAL(ie_bsr_from_dense(w, n_in, n_out, c->br, c->bc, 0.0f, &blob, &bytes), 0);
    CU_ASSERT(((uintptr_t)blob & 63) == 0);
    CU_ASSERT_EQUAL(bytes, ie_bsr_bytes(n_out, c->br, c->bc, kept));
    ie_bsr_t m;
    char err[256] = "";
    CU_ASSERT_EQUAL_FATAL(ie_bsr_view(blob, bytes, n_in, n_out, &m, err, sizeof err), 0);
    CU_ASSERT_EQUAL(m.n_blocks, kept);
    CU_ASSERT(m.br == c->br && m.bc == c->bc && m.n_in == n_in && m.n_out == n_out);
    CU_ASSERT(((uintptr_t)m.values & 63) == 0);

    /* activations: xs > n_in (odd extra), last row ends at a guard page */
    const size_t xs = (size_t)n_in + 3;
    const size_t xn = (size_t)(max_tok - 1) * xs + (size_t)n_in;
    float *x = guard_alloc(xn);
    CU_ASSERT_PTR_NOT_NULL_FATAL(x);
    for (size_t i = 0; i < xn; i++) x[i] = rng_f();
    double *ex = malloc(sizeof(double) * (size_t)(n_out * max_tok));
    double *mag = malloc(sizeof(double) * (size_t)(n_out * max_tok));
    dense_exact(w, n_out, n_in, x, xs, max_tok, ex, mag);

    const int64_t ldy = n_out + 5, guard = 17;
    const size_t yn = (size_t)(ldy * max_tok + guard);
    float *y = malloc(sizeof(float) * yn);

    /* ranges in block rows: full, first, last, middle */
    int64_t ranges[4][2] = {{0, n_out}, {0, c->br}, {n_out - c->br, n_out}, {c->br, n_out - c->br}};
    const int n_ranges = c->nbr >= 3 ? 4 : c->nbr == 2 ? 3 : 1;
    for (int ii = 0; ii < ni; ii++) {
        const ie_kernels_t *ops = ie_kernels_get(isas[ii]);
        for (int nt = 1; nt <= max_tok; nt++) {
            for (int ri = 0; ri < n_ranges; ri++) {
                const int64_t r0 = ranges[ri][0], r1 = ranges[ri][1];
                for (size_t i = 0; i < yn; i++) y[i] = SENT;
                ops->matmul_bsr(&m, r0, r1, x, xs, nt, y, ldy);
                int bad = 0;
                for (int64_t t = 0; t < max_tok; t++)
                    for (int64_t r = 0; r < ldy; r++) {
                        const float v = y[t * ldy + r];
                        if (t < nt && r >= r0 && r < r1) {
                            const double e = ex[t * n_out + r], tol = 1e-5 * mag[t * n_out + r];
                            if (!(fabs((double)v - e) <= tol)) {
                                if (!bad && g_fail_prints++ < 10)
                                    printf("\n  %s %dx%d blocks, %lldx%lld pat %d nt %d [%lld,%lld) t %lld r %lld: "
                                           "%.9g vs %.9g\n",
                                           ie_isa_name(isas[ii]), c->br, c->bc, (long long)n_out, (long long)n_in,
                                           c->pat, nt, (long long)r0, (long long)r1, (long long)t, (long long)r, v,
                                           e);
                                bad = 1;
                            }
                        } else if (v != SENT) {
                            if (!bad && g_fail_prints++ < 10)
                                printf("\n  %s %dx%d: wrote outside the range at t %lld r %lld\n",
                                       ie_isa_name(isas[ii]), c->br, c->bc, (long long)t, (long long)r);
                            bad = 1;
                        }
                    }
                for (int64_t i = ldy * max_tok; i < (int64_t)yn; i++) bad |= y[i] != SENT;
                CU_ASSERT(!bad);
            }
        }
    }

    /* values at a guard page too, where the blob size allows it */
    if (bytes % 64 == 0 && bytes > 0) {
        float *g = guard_alloc(bytes / sizeof(float));
        memcpy(g, blob, bytes);
        ie_bsr_t mg;
        CU_ASSERT_EQUAL(ie_bsr_view(g, bytes, n_in, n_out, &mg, err, sizeof err), 0);
        for (int ii = 0; ii < ni; ii++) {
            const int nt = max_tok < 7 ? max_tok : 7;
            ie_kernels_get(isas[ii])->matmul_bsr(&mg, 0, n_out, x, xs, nt, y, ldy);
            ie_kernels_get(isas[ii])->matmul_bsr(&mg, 0, n_out, x, xs, 1, y, ldy);
        }
        guard_free(g, bytes / sizeof(float));
    }

    free(y);
    free(ex);
    free(mag);
    guard_free(x, xn);
    free(blob);
    free(w);
}

static void test_matmul_vs_dense(void)
{
    rng_seed(1);
    static const int blocks[][2] = {{16, 16}, {32, 32}, {8, 32}, {4, 4},  {8, 8},   {1, 1},  {3, 5},
                                    {64, 64}, {2, 48},  {16, 4}, {5, 17}, {64, 1},  {1, 64}, {7, 64},
                                    {16, 32}, {32, 16}, {4, 8},  {16, 8}, {12, 20}, {33, 31}};
    static const int grids[][2] = {{1, 1}, {1, 7}, {3, 5}, {5, 3}, {4, 9}};
    for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++)
        for (size_t gi = 0; gi < sizeof grids / sizeof grids[0]; gi++)
            for (int pat = PAT_RANDOM; pat <= PAT_DIAG; pat++) {
                const cfg_t c = {blocks[bi][0], blocks[bi][1], grids[gi][0], grids[gi][1], pat};
                /* all n_tok 1..17 on the random pattern, a few otherwise */
                check_cfg(&c, pat == PAT_RANDOM ? 17 : 7);
            }
}

/* Model-sized shapes, decode and a short prefill, at a few densities. */
static void test_matmul_large(void)
{
    rng_seed(2);
    static const cfg_t cs[] = {{16, 16, 32, 128, PAT_RANDOM},
                               {32, 32, 8, 24, PAT_RANDOM},
                               {8, 32, 40, 40, PAT_EMPTY_ROWS},
                               {4, 4, 64, 100, PAT_RANDOM},
                               {16, 16, 20, 70, PAT_DENSE}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) check_cfg(&cs[i], 9);
}

/* ------------------------------------------------------------ threshold */

static void test_threshold(void)
{
    /* 8 x 12 matrix, 4 x 4 blocks: 2 x 3 grid; block (bi,bj) has largest
     * |value| set per case, everything else smaller. */
    const int64_t n_out = 8, n_in = 12;
    float w[8 * 12];
    const float maxes[2][3] = {{0.5f, -0.25f, 0.0f}, {1e-40f, -0.5f, 2.0f}};
    for (int bi = 0; bi < 2; bi++)
        for (int bj = 0; bj < 3; bj++)
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) {
                    const float mx = maxes[bi][bj];
                    float v = (i == 1 && j == 2) ? mx : mx * 0.125f * (float)((i + j) % 3);
                    if ((i + j) % 2) v = -v;
                    w[(bi * 4 + i) * n_in + bj * 4 + j] = (i == 1 && j == 2) ? mx : v;
                }
    w[(0 * 4 + 0) * n_in + 2 * 4 + 0] = -0.0f; /* a -0 in the zero block */

    struct {
        float th;
        int nb;
        uint32_t cols[6];
        uint32_t rowptr[3];
    } cases[] = {
        {0.0f, 5, {0, 1, 0, 1, 2}, {0, 2, 5}},     /* 0: drops only the all-zero block  */
        {-1.0f, 6, {0, 1, 2, 0, 1, 2}, {0, 3, 6}}, /* negative: keeps every block       */
        {1e-40f, 4, {0, 1, 1, 2}, {0, 2, 4}},      /* |v| <= th drops (equal included)  */
        {0.25f, 3, {0, 1, 2}, {0, 1, 3}},
        {0.5f, 1, {2}, {0, 0, 1}}, /* a whole empty block row          */
        {2.0f, 0, {0}, {0, 0, 0}}, /* everything dropped                */
    };
    float x[12];
    for (int k = 0; k < 12; k++) x[k] = (float)(k + 1) * 0.5f;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        void *blob;
        size_t bytes;
        CU_ASSERT_EQUAL_FATAL(ie_bsr_from_dense(w, n_in, n_out, 4, 4, cases[ci].th, &blob, &bytes), 0);
        ie_bsr_t m;
        CU_ASSERT_EQUAL_FATAL(ie_bsr_view(blob, bytes, n_in, n_out, &m, NULL, 0), 0);
        CU_ASSERT_EQUAL(m.n_blocks, cases[ci].nb);
        for (int i = 0; i < 3; i++) CU_ASSERT_EQUAL(m.rowptr[i], cases[ci].rowptr[i]);
        for (int b = 0; b < cases[ci].nb; b++) CU_ASSERT_EQUAL(m.colidx[b], cases[ci].cols[b]);
        /* kept blocks are verbatim copies; the product equals the dense one
         * with dropped blocks zeroed */
        float wz[8 * 12];
        memcpy(wz, w, sizeof w);
        for (int bi = 0; bi < 2; bi++)
            for (int bj = 0; bj < 3; bj++) {
                int kept = -1;
                for (uint32_t b = m.rowptr[bi]; b < m.rowptr[bi + 1]; b++)
                    if (m.colidx[b] == (uint32_t)bj) kept = (int)b;
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < 4; j++) {
                        float *d = &wz[(bi * 4 + i) * n_in + bj * 4 + j];
                        if (kept >= 0) {
                            CU_ASSERT(memcmp(&m.values[(kept * 4 + i) * 4 + j], d, 4) == 0);
                        } else {
                            *d = 0.0f;
                        }
                    }
            }
        double ex[8], mag[8];
        dense_exact(wz, n_out, n_in, x, 12, 1, ex, mag);
        ie_isa_t isas[3];
        for (int ii = 0, ni = n_isas(isas); ii < ni; ii++) {
            float y[8];
            ie_kernels_get(isas[ii])->matmul_bsr(&m, 0, n_out, x, 12, 1, y, 8);
            for (int r = 0; r < 8; r++) CU_ASSERT(fabs(y[r] - ex[r]) <= 1e-5 * mag[r]);
        }
        free(blob);
    }

    /* a NaN keeps its block whatever the threshold */
    float wn[16] = {0};
    wn[5] = NAN;
    void *blob;
    size_t bytes;
    CU_ASSERT_EQUAL_FATAL(ie_bsr_from_dense(wn, 4, 4, 4, 4, 1e30f, &blob, &bytes), 0);
    ie_bsr_t m;
    CU_ASSERT_EQUAL(ie_bsr_view(blob, bytes, 4, 4, &m, NULL, 0), 0);
    CU_ASSERT_EQUAL(m.n_blocks, 1);
    free(blob);

    /* bad shapes */
    float one[64] = {0};
    blob = (void *)1;
    CU_ASSERT_EQUAL(ie_bsr_from_dense(one, 8, 8, 3, 4, 0.0f, &blob, &bytes), -1); /* 3 does not divide 8 */
    CU_ASSERT_PTR_NULL(blob);
    CU_ASSERT_EQUAL(ie_bsr_from_dense(one, 8, 8, 4, 0, 0.0f, &blob, &bytes), -1);
    CU_ASSERT_EQUAL(ie_bsr_from_dense(one, 128, 1, 1, 128, 0.0f, &blob, &bytes), -1); /* bc > 64 */
    CU_ASSERT_EQUAL(ie_bsr_from_dense(one, 0, 8, 4, 4, 0.0f, &blob, &bytes), -1);
    CU_ASSERT_EQUAL(ie_bsr_from_dense(NULL, 8, 8, 4, 4, 0.0f, &blob, &bytes), -1);

    /* sizes */
    CU_ASSERT_EQUAL(ie_bsr_bytes(8, 4, 4, 0), 64u);           /* 24 + 12, padded */
    CU_ASSERT_EQUAL(ie_bsr_bytes(8, 4, 4, 3), 64u + 3 * 64u); /* 24+12+12 = 48   */
    CU_ASSERT_EQUAL(ie_bsr_bytes(40, 4, 4, 0), 128u);         /* 24+44 = 68      */
    CU_ASSERT_EQUAL(ie_bsr_bytes(8, 0, 4, 0), 0u);
    CU_ASSERT_EQUAL(ie_bsr_bytes(8, 4, 4, INT64_MAX), 0u);
}

/* ------------------------------------------------------- view rejection */

static void put_u32(void *p, size_t off, uint32_t v) { memcpy((char *)p + off, &v, 4); }
static void put_u64(void *p, size_t off, uint64_t v) { memcpy((char *)p + off, &v, 8); }

/* Expects rejection of `bytes` bytes of b (copied to an exact-size aligned
 * buffer) viewed as n_out x n_in, with a message. */
static void expect_reject(const void *b, size_t bytes, int64_t n_in, int64_t n_out, const char *what)
{
    void *c = aligned_copy(b, bytes);
    ie_bsr_t m;
    char err[200];
    strcpy(err, "");
    const int rc = ie_bsr_view(c, bytes, n_in, n_out, &m, err, sizeof err);
    if (rc != -1 || err[0] == 0) printf("\n  not rejected: %s (rc %d)\n", what, rc);
    CU_ASSERT_EQUAL(rc, -1);
    CU_ASSERT(err[0] != 0);
    free(c);
}

static void test_view_rejects(void)
{
    rng_seed(3);
    /* 24 x 40 matrix, 8 x 8 blocks: 3 block rows x 5 block columns. */
    const int64_t n_out = 24, n_in = 40;
    float w[24 * 40];
    const cfg_t c = {8, 8, 3, 5, PAT_RANDOM};
    const int64_t kept = make_matrix(w, &c);
    CU_ASSERT_FATAL(kept >= 3);
    void *blob;
    size_t bytes;
    CU_ASSERT_EQUAL_FATAL(ie_bsr_from_dense(w, n_in, n_out, 8, 8, 0.0f, &blob, &bytes), 0);
    const size_t rp = 24, ci = rp + 4 * 4; /* rowptr, colidx offsets */
    ie_bsr_t m;
    char err[200];
    CU_ASSERT_EQUAL_FATAL(ie_bsr_view(blob, bytes, n_in, n_out, &m, err, sizeof err), 0);
    /* first block row with >= 2 blocks */
    int row2 = -1;
    for (int i = 0; i < 3; i++)
        if (m.rowptr[i + 1] - m.rowptr[i] >= 2) {
            row2 = i;
            break;
        }

    unsigned char *v = malloc(bytes + 128);
    memset(v, 0, bytes + 128);
#define FRESH() memcpy(v, blob, bytes)

    FRESH();
    v[0] = 'b';
    expect_reject(v, bytes, n_in, n_out, "magic");
    FRESH();
    v[3] = '2';
    expect_reject(v, bytes, n_in, n_out, "magic version");
    FRESH();
    expect_reject(v, bytes - 1, n_in, n_out, "truncated by 1");
    FRESH();
    expect_reject(v, bytes - 64, n_in, n_out, "truncated by 64");
    FRESH();
    expect_reject(v, 23, n_in, n_out, "header cut");
    FRESH();
    expect_reject(v, 0, n_in, n_out, "empty");
    FRESH();
    expect_reject(v, bytes + 64, n_in, n_out, "trailing bytes");
    FRESH();
    expect_reject(v, bytes, n_in + 4, n_out, "n_in not a multiple of bc");
    FRESH();
    expect_reject(v, bytes, n_in, n_out + 8, "wrong n_out");
    FRESH();
    expect_reject(v, bytes, n_in, 0, "n_out 0");
    FRESH();
    expect_reject(v, bytes, -40, n_out, "n_in negative");
    FRESH();
    put_u32(v, 4, 0);
    expect_reject(v, bytes, n_in, n_out, "br 0");
    FRESH();
    put_u32(v, 8, 65);
    expect_reject(v, bytes, n_in, n_out, "bc 65");
    FRESH();
    put_u32(v, 4, 0x80000008u);
    expect_reject(v, bytes, n_in, n_out, "br huge");
    FRESH();
    put_u32(v, 4, 16);
    expect_reject(v, bytes, n_in, n_out, "br 16 does not divide 24");
    FRESH();
    put_u32(v, 8, 16);
    expect_reject(v, bytes, n_in, n_out, "bc 16 does not divide 40");
    FRESH();
    put_u32(v, 8, 5);
    expect_reject(v, bytes, n_in, n_out, "bc 5 divides, size differs");
    FRESH();
    put_u32(v, 12, 1);
    expect_reject(v, bytes, n_in, n_out, "reserved");
    FRESH();
    put_u64(v, 16, (uint64_t)kept + 1);
    expect_reject(v, bytes, n_in, n_out, "n_blocks + 1");
    FRESH();
    put_u64(v, 16, (uint64_t)kept - 1);
    expect_reject(v, bytes, n_in, n_out, "n_blocks - 1");
    FRESH();
    put_u64(v, 16, UINT64_MAX);
    expect_reject(v, bytes, n_in, n_out, "n_blocks 2^64-1");
    FRESH();
    put_u64(v, 16, UINT64_C(1) << 62);
    expect_reject(v, bytes, n_in, n_out, "n_blocks 2^62");
    FRESH();
    put_u64(v, 16, (UINT64_MAX - 100) / 256);
    expect_reject(v, bytes, n_in, n_out, "n_blocks overflowing size");
    FRESH();
    put_u64(v, 16, 16);
    expect_reject(v, bytes, n_in, n_out, "n_blocks > grid");
    FRESH();
    put_u32(v, rp, 1);
    expect_reject(v, bytes, n_in, n_out, "rowptr[0] != 0");
    FRESH();
    put_u32(v, rp + 12, (uint32_t)kept - 1);
    expect_reject(v, bytes, n_in, n_out, "rowptr last < n_blocks");
    FRESH();
    put_u32(v, rp + 12, (uint32_t)kept + 1);
    expect_reject(v, bytes, n_in, n_out, "rowptr last > n_blocks");
    FRESH();
    put_u32(v, rp + 4, 0xffffffffu);
    expect_reject(v, bytes, n_in, n_out, "rowptr huge");
    {
        /* decreasing: rowptr[1] > rowptr[2] */
        FRESH();
        put_u32(v, rp + 4, m.rowptr[2] + 1 <= (uint32_t)kept ? m.rowptr[2] + 1 : (uint32_t)kept);
        put_u32(v, rp + 8, m.rowptr[2] > 0 ? m.rowptr[2] - 1 : 0);
        expect_reject(v, bytes, n_in, n_out, "rowptr decreasing");
    }
    FRESH();
    put_u32(v, ci, 5);
    expect_reject(v, bytes, n_in, n_out, "colidx == n_cols");
    FRESH();
    put_u32(v, ci + 4 * ((size_t)kept - 1), 0xffffffffu);
    expect_reject(v, bytes, n_in, n_out, "colidx huge");
    if (row2 >= 0) {
        const size_t b0 = m.rowptr[row2];
        FRESH();
        put_u32(v, ci + 4 * (b0 + 1), m.colidx[b0]);
        expect_reject(v, bytes, n_in, n_out, "colidx repeated");
        FRESH();
        put_u32(v, ci + 4 * b0, m.colidx[b0 + 1]);
        put_u32(v, ci + 4 * (b0 + 1), m.colidx[b0]);
        expect_reject(v, bytes, n_in, n_out, "colidx descending");
    }
    {
        /* misaligned blob */
        void *a = NULL;
        CU_ASSERT_EQUAL_FATAL(posix_memalign(&a, 64, bytes + 64), 0);
        memcpy((char *)a + 4, blob, bytes);
        CU_ASSERT_EQUAL(ie_bsr_view((char *)a + 4, bytes, n_in, n_out, &m, err, sizeof err), -1);
        free(a);
    }
    CU_ASSERT_EQUAL(ie_bsr_view(NULL, bytes, n_in, n_out, &m, err, sizeof err), -1);
    CU_ASSERT_EQUAL(ie_bsr_view(blob, bytes, n_in, n_out, &m, NULL, 0), 0); /* err may be NULL */
    FRESH();
    put_u32(v, rp, 1);
    {
        void *cpy = aligned_copy(v, bytes);
        CU_ASSERT_EQUAL(ie_bsr_view(cpy, bytes, n_in, n_out, &m, NULL, 0), -1);
        char tiny[4];
        CU_ASSERT_EQUAL(ie_bsr_view(cpy, bytes, n_in, n_out, &m, tiny, sizeof tiny), -1);
        CU_ASSERT(strlen(tiny) < sizeof tiny);
        free(cpy);
    }
#undef FRESH
    free(v);
    free(blob);
}

/* Random mutations of valid blobs: never crashes; whatever is accepted can
 * be multiplied by every ISA without reading outside the blob. */
static void test_view_fuzz(void)
{
    rng_seed(4);
    ie_isa_t isas[3];
    const int ni = n_isas(isas);
    static const cfg_t cs[] = {{8, 8, 3, 5, PAT_RANDOM},
                               {4, 4, 6, 2, PAT_EMPTY_ROWS},
                               {1, 1, 5, 7, PAT_RANDOM},
                               {16, 16, 2, 3, PAT_DENSE}};
    int accepted = 0, rejected = 0;
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
        const cfg_t *c = &cs[k];
        const int64_t n_out = (int64_t)c->br * c->nbr, n_in = (int64_t)c->bc * c->nbc;
        float *w = malloc(sizeof(float) * (size_t)(n_out * n_in));
        make_matrix(w, c);
        void *blob;
        size_t bytes;
        CU_ASSERT_EQUAL_FATAL(ie_bsr_from_dense(w, n_in, n_out, c->br, c->bc, 0.0f, &blob, &bytes), 0);
        float x[64 * 16], y[64 * 4];
        for (int i = 0; i < 64 * 16; i++) x[i] = rng_f();
        for (int it = 0; it < 4000; it++) {
            unsigned char *v = malloc(bytes + 64);
            memcpy(v, blob, bytes);
            memset(v + bytes, 0, 64);
            /* mostly hit the header and index arrays (the first 128 bytes) */
            const int n_mut = 1 + (int)(rng_u32() % 4);
            for (int j = 0; j < n_mut; j++) {
                const size_t lim = rng_u32() % 4 ? (bytes < 128 ? bytes : 128) : bytes;
                const size_t at = rng_u32() % lim;
                switch (rng_u32() % 4) {
                case 0: v[at] ^= (unsigned char)(1u << (rng_u32() % 8)); break;
                case 1: v[at] = (unsigned char)rng_u32(); break;
                case 2: v[at] = 0xff; break;
                default: v[at] = (unsigned char)(v[at] + 1); break;
                }
            }
            size_t len = bytes;
            const uint32_t r = rng_u32() % 8;
            if (r == 0) len = rng_u32() % (bytes + 1);
            else if (r == 1) len = bytes + 64;
            void *e = aligned_copy(v, len); /* exact size: ASan sees past-end reads */
            ie_bsr_t m;
            char err[160];
            const int64_t sh_in = rng_u32() % 8 ? n_in : n_in * 2, sh_out = rng_u32() % 8 ? n_out : n_out / 2 + 1;
            if (ie_bsr_view(e, len, sh_in, sh_out, &m, err, sizeof err) == 0) {
                accepted++;
                if (sh_in <= 64 && sh_out <= 64)
                    for (int ii = 0; ii < ni; ii++)
                        ie_kernels_get(isas[ii])->matmul_bsr(&m, 0, sh_out, x, 64, 3, y, 64);
            } else {
                rejected++;
                CU_ASSERT(err[0] != 0);
            }
            free(e);
            free(v);
        }
        free(blob);
        free(w);
    }
    CU_ASSERT(accepted > 0 && rejected > 0);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("bsr", NULL, NULL);
    CU_add_test(s, "matmul == dense product (all ISAs, shapes, blocks, n_tok, ranges)", test_matmul_vs_dense);
    CU_add_test(s, "matmul at model sizes", test_matmul_large);
    CU_add_test(s, "from_dense threshold rule, sizes", test_threshold);
    CU_add_test(s, "view rejects corrupted blobs", test_view_rejects);
    CU_add_test(s, "view survives random mutations", test_view_fuzz);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}
