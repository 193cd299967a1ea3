/* The certificate's two full-length CPU passes in one loop each (impl/_native.py builds and loads
 * this file; impl/_certify.py calls it where it loaded, and runs the same tests in torch and NumPy
 * where it did not: tests/test_native.py holds the two to the same verdicts).
 *
 * Plain C99, no library calls, built without -ffast-math and with -ffp-contract=off: every
 * floating-point operation below is one IEEE 754 double operation, rounded to nearest, in the
 * order written (vectorized or not, the same results). */

#include <stdint.h>
#include <string.h>

/* On x86-64 each loop is built for three instruction sets, the CPU's own picked when the library
 * loads (GCC's and Clang's function multiversioning, which needs the loader's ifuncs: where the
 * build fails, impl/_native.py builds again with -DGDPO_NO_CLONES, the baseline alone): SSE2
 * alone compares neither unsigned integers nor, without branches, doubles to a count; AVX2
 * does both, about 3 times as fast. */
#if defined(__x86_64__) && defined(__ELF__) && defined(__has_attribute) && !defined(GDPO_NO_CLONES)
#if __has_attribute(target_clones)
#define GDPO_CLONES __attribute__((target_clones("arch=x86-64-v3", "arch=x86-64-v2", "default")))
#endif
#endif
#ifndef GDPO_CLONES
#define GDPO_CLONES
#endif

/* The interface's version: impl/_native.py refuses a library that answers anything else. */
int gdpo_native_abi(void) { return 1; }

/* The rewards' magnitudes on their bits (impl._certify._magnitude_bits_np, in one pass): for n
 * unsigned values u (a narrow float format's bits of width W), with v = 2u and w = v - 2 in W bits
 * (the sign shifted out; a zero's w wraps to the top, 2**W - 2),
 *     out[0] = min w,  out[1] = max v,  out[2] = OR of every u.
 * Computed as m = u without its sign bit (a signed integer >= 0, which SSE2 compares):
 * v = 2m, and w = 2 ((m - 1) mod 2**(W-1)), min and max of those halves. */
#define GDPO_SCAN(NAME, UT, ST, MASK)                                                               \
    GDPO_CLONES void NAME(const UT *u, int64_t n, uint64_t *out)                                                \
    {                                                                                               \
        ST lo = (ST)(MASK), hi = 0;                                                                 \
        UT ored = 0;                                                                                \
        for (int64_t i = 0; i < n; i++) {                                                           \
            ST m = (ST)(u[i] & (MASK));                                                             \
            ST w = (ST)((m - 1) & (MASK));                                                          \
            hi = m > hi ? m : hi;                                                                   \
            lo = w < lo ? w : lo;                                                                   \
            ored = (UT)(ored | u[i]);                                                               \
        }                                                                                           \
        out[0] = 2 * (uint64_t)lo;                                                                  \
        out[1] = 2 * (uint64_t)hi;                                                                  \
        out[2] = ored;                                                                              \
    }

GDPO_SCAN(gdpo_scan_u32, uint32_t, int32_t, 0x7FFFFFFF)
GDPO_SCAN(gdpo_scan_u16, uint16_t, int16_t, 0x7FFF)

/* Tier 0's test (impl._certify.bits_left) for a float32 output y = round(a): with r = |a - y|
 * (exact) and p2 = 2**e read from a's exponent bits (0 for a zero or subnormal), a row passes
 * where v = p2 - s r > top, or else where v > A and p2 > P. The indices of the rows that do
 * not pass (a NaN among them) go to left, ascending; returns how many. Block by block: each
 * block's count of rows with v <= top first (a loop without branches; none: the block passes),
 * else each row's verdict as a byte, then those bytes eight at a time, a row's index written
 * only where its word has a failing row. */
#define GDPO_BLOCK 1024

static inline double gdpo_tier0_v(double ai, float yi, double s, double *p2out)
{
    double d = ai - (double)yi, r, p2;
    uint64_t bits, dbits;
    memcpy(&dbits, &d, sizeof dbits);
    dbits &= UINT64_C(0x7FFFFFFFFFFFFFFF); /* |d|: the sign bit cleared */
    memcpy(&r, &dbits, sizeof r);
    memcpy(&bits, &ai, sizeof bits);
    bits &= UINT64_C(0x7FF0000000000000); /* 2**e: a's exponent field alone */
    memcpy(&p2, &bits, sizeof p2);
    *p2out = p2;
    double sr = s * r;
    return p2 - sr;
}

GDPO_CLONES int64_t gdpo_tier0_f32(const double *a, const float *y, int64_t n, double s, double A, double P,
                                   double top, int64_t *left)
{
    uint8_t fail[GDPO_BLOCK];
    int64_t m = 0;
    for (int64_t b = 0; b < n; b += GDPO_BLOCK) {
        int64_t len = n - b < GDPO_BLOCK ? n - b : GDPO_BLOCK;
        const double *ab = a + b;
        const float *yb = y + b;
        int64_t some = 0; /* rows with v <= top (or NaN): where none, the block passes */
        for (int64_t i = 0; i < len; i++) {
            double p2, v = gdpo_tier0_v(ab[i], yb[i], s, &p2);
            some += !(v > top);
        }
        if (!some)
            continue;
        for (int64_t i = 0; i < len; i++) {
            double p2, v = gdpo_tier0_v(ab[i], yb[i], s, &p2);
            fail[i] = (uint8_t)(!(v > top) & !((v > A) & (p2 > P)));
        }
        for (int64_t i = len; i < ((len + 7) & ~(int64_t)7); i++)
            fail[i] = 0;
        for (int64_t w = 0; w < len; w += 8) {
            uint64_t word;
            memcpy(&word, fail + w, sizeof word);
            if (!word)
                continue;
            int64_t end = w + 8 < len ? w + 8 : len; /* (left has n places: never one past the rows) */
            for (int64_t i = w; i < end; i++) {
                left[m] = b + i;
                m += fail[i];
            }
        }
    }
    return m;
}

/* The exact zeros' test from Eq. 4's statistics (impl._exact_zeros.zero_rows_eq4, where its
 * route holds: every step below is exact, so any order of the sums gives the same values): for
 * each of the R rows, in groups of g contiguous rows, its group q = row / g, and per column k
 * (stats f, shift, mean, m2, each (K, G) row-major; rewards r (N, K) float32; integer weights W)
 *     key_k = m2 / f / f,   T_k = (x f - shift - mean) / f W_k,
 *     tot_k = sum_l [key_l == key_k] T_l;
 * ok = every tot_k == 0. Returns 0, or -1 where K is beyond the loop's 64 columns (untouched). */
int gdpo_zero_rows_f32(const int64_t *rows, int64_t R, const float *r, int64_t K, int64_t g, int64_t G,
                       const double *f, const double *shift, const double *mean, const double *m2, const double *W,
                       uint8_t *ok)
{
    double key[64], T[64];
    if (K > 64)
        return -1;
    for (int64_t j = 0; j < R; j++) {
        int64_t row = rows[j], q = row / g;
        for (int64_t k = 0; k < K; k++) {
            int64_t at = k * G + q;
            double fk = f[at];
            key[k] = m2[at] / fk / fk;
            double xf = (double)r[row * K + k] * fk;
            T[k] = (xf - shift[at] - mean[at]) / fk * W[k];
        }
        uint8_t all = 1;
        for (int64_t k = 0; k < K; k++) {
            double tot = 0.0;
            for (int64_t l = 0; l < K; l++)
                tot += (double)(key[l] == key[k]) * T[l];
            all &= (uint8_t)(tot == 0.0);
        }
        ok[j] = all;
    }
    return 0;
}

/* Eq. 4's layout of contiguous groups with the rewards' magnitudes in the same read
 * (impl._groups.GroupLayout.gather_contiguous): float32 rewards r (n, K), groups of g rows,
 * G = n / g, to x (K, g, G) float64, x[k][p][q] = r[q g + p][k] (exact), and out as
 * gdpo_scan_u32 of r's bits. Eight groups at a time: each line of x written whole, the
 * eight groups' rewards (8 g K values) read from cache. */
GDPO_CLONES void gdpo_gather_f32(const float *r, int64_t n, int64_t K, int64_t g, double *x, uint64_t *out)
{
    int64_t G = n / g;
    int32_t lo = 0x7FFFFFFF, hi = 0;
    uint32_t ored = 0;
    for (int64_t q0 = 0; q0 < G; q0 += 8) {
        int64_t q1 = q0 + 8 < G ? q0 + 8 : G;
        for (int64_t p = 0; p < g; p++) {
            for (int64_t k = 0; k < K; k++) {
                double *dst = x + (k * g + p) * G;
                const float *src = r + p * K + k;
                for (int64_t q = q0; q < q1; q++) {
                    float v = src[q * g * K];
                    uint32_t u;
                    memcpy(&u, &v, sizeof u);
                    int32_t m = (int32_t)(u & 0x7FFFFFFF), w = (int32_t)((m - 1) & 0x7FFFFFFF);
                    hi = m > hi ? m : hi;
                    lo = w < lo ? w : lo;
                    ored |= u;
                    dst[q] = (double)v;
                }
            }
        }
    }
    out[0] = 2 * (uint64_t)lo;
    out[1] = 2 * (uint64_t)hi;
    out[2] = ored;
}
