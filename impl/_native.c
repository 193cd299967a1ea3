/* CPU loops for impl (impl/_native.py builds and loads this file): the certificate's full-length
 * passes (impl/_certify.py), the exact zeros among the rows its tier 0 leaves, Eq. 4's layout
 * copy and the canonical tree sums of Eq. 4 and Eq. 6 (impl/_segments.py). Where the library is
 * not loaded, impl runs the same tests and sums in torch and NumPy: tests/test_native.py holds
 * the two to the same verdicts and bits.
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
int gdpo_native_abi(void) { return 2; }

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

/* The exact zeros' test (impl._exact_zeros.zero_rows_eq4's verdicts, where its route holds) from
 * the rewards alone: for a row of groups of g contiguous rows of the float32 rewards r (N, K),
 * its group's sums per column k
 *     S1_k = sum x,   Q_k = g sum x**2 - S1_k**2  (g (g - 1) times the exact variance),
 * the row's P_k = g x_k - S1_k (g times its exact deviation) and, with the integer weights W,
 *     tot_k = sum_l [Q_l == Q_k] W_l P_l;
 * the row passes where every tot_k == 0. Under the route (every reward a multiple of 2**e,
 * e >= -200, none above top, 4 g**3 (top / 2**e)**2 <= 2**53 and K max|W| 2 g top / 2**e <= 2**53)
 * every value above is a multiple of 2**e or 4**e below 2**53 of it: each operation is exact,
 * in any order, so the verdicts are those of Eq. 4's statistics (equal Q: equal variances;
 * tot_k: g times that class's sum). It reads the group's g K rewards (one run of memory), not
 * 4 K values scattered over Eq. 4's four (K, G) tables. */
typedef struct {
    const float *r;   /* the rewards (N, K), row-major */
    int64_t N, K, g;  /* K <= 64, g >= 1, N a multiple of g */
    const double *W;  /* the integer weights (K) */
    int64_t last;     /* the group whose sums S1, Q hold (-1: none) */
    double S1[64], Q[64];
} gdpo_groups;

static int gdpo_groups_init(gdpo_groups *z, const float *r, int64_t N, int64_t K, int64_t g, const double *W)
{
    if (K > 64 || K < 1 || g < 1 || N < 0 || N % g)
        return -1;
    z->r = r, z->N = N, z->K = K, z->g = g, z->W = W, z->last = -1;
    return 0;
}

/* 0 where every one of the R rows lies in 0 .. N - 1, else -1. */
static int gdpo_groups_rows(const gdpo_groups *z, const int64_t *rows, int64_t R)
{
    for (int64_t j = 0; j < R; j++)
        if (rows[j] < 0 || rows[j] >= z->N)
            return -1;
    return 0;
}

/* The g K rewards of row's group asked for now (rows visited GDPO_AHEAD ahead of their test). */
#define GDPO_AHEAD 8

static inline void gdpo_groups_ahead(const gdpo_groups *z, int64_t row)
{
#if defined(__GNUC__)
    const char *next = (const char *)(z->r + (row / z->g) * z->g * z->K);
    for (int64_t b = 0; b < z->g * z->K * (int64_t)sizeof(float); b += 64)
        __builtin_prefetch(next + b);
#else
    (void)z, (void)row;
#endif
}

static int gdpo_zero_row(gdpo_groups *z, int64_t row)
{
    int64_t K = z->K, g = z->g, q = row / g;
    double T[64];
    if (q != z->last) {
        const float *grp = z->r + q * g * K;
        for (int64_t k0 = 0; k0 < K; k0 += 4) { /* four columns side by side: four chains of sums */
            int64_t n = K - k0 < 4 ? K - k0 : 4;
            double s[4] = {0.0, 0.0, 0.0, 0.0}, t[4] = {0.0, 0.0, 0.0, 0.0};
            const float *c = grp + k0;
            if (n == 4) {
                for (int64_t p = 0; p < g; p++, c += K)
                    for (int m = 0; m < 4; m++) {
                        double x = (double)c[m];
                        s[m] += x;
                        t[m] += x * x;
                    }
            } else {
                for (int64_t p = 0; p < g; p++, c += K)
                    for (int64_t m = 0; m < n; m++) {
                        double x = (double)c[m];
                        s[m] += x;
                        t[m] += x * x;
                    }
            }
            for (int64_t m = 0; m < n; m++) {
                z->S1[k0 + m] = s[m];
                z->Q[k0 + m] = (double)g * t[m] - s[m] * s[m];
            }
        }
        z->last = q;
    }
    for (int64_t k = 0; k < K; k++)
        T[k] = z->W[k] * ((double)g * (double)z->r[row * K + k] - z->S1[k]);
    int all = 1;
    for (int64_t k = 0; k < K; k++) {
        double tot = 0.0;
        for (int64_t l = 0; l < K; l++)
            tot += (double)(z->Q[l] == z->Q[k]) * T[l];
        all &= tot == 0.0;
    }
    return all;
}

/* The test above for R rows (ascending: a group's sums serve its next row), each verdict a byte
 * of ok. Returns 0, or -1 (ok untouched) where K is beyond 64 columns, g < 1, N is not a
 * multiple of g or a row lies outside 0 .. N - 1. */
GDPO_CLONES int gdpo_zero_rows_f32(const int64_t *rows, int64_t R, const float *r, int64_t N, int64_t K, int64_t g,
                                   const double *W, uint8_t *ok)
{
    gdpo_groups z;
    if (gdpo_groups_init(&z, r, N, K, g, W) || gdpo_groups_rows(&z, rows, R))
        return -1;
    for (int64_t j = 0; j < R; j++) {
        if (j + GDPO_AHEAD < R)
            gdpo_groups_ahead(&z, rows[j + GDPO_AHEAD]);
        ok[j] = (uint8_t)gdpo_zero_row(&z, rows[j]);
    }
    return 0;
}

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

static inline double gdpo_abs(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    u &= UINT64_C(0x7FFFFFFFFFFFFFFF);
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The zeros among the m rows tier 0's test left (left, ascending), for one unit of whole groups
 * (impl._certify._tier0_loc, then impl._certify._exact_zeros, in that order): with
 * prm = {alpha, beta, th, near},
 *   - a row whose y is 0 and a is not passes where its zero's sign is certain,
 *         |a| > B (1 + 2**-40)  and  |a| + B (1 + 2**-40) < th,   B = alpha + beta |a|;
 *   - else a row with |a| <= near (the reach of a* = 0) whose c* is exactly 0 (the test above,
 *     rewards r (N, K) in groups of g contiguous rows, integer weights W) gets y = +0 and is
 *     counted in *zeros;
 * every other row stays in left, in order (left is compacted in place). Returns how many stay,
 * or -1 (nothing written) where K is beyond 64 columns, g < 1, N is not a multiple of g or a
 * row lies outside 0 .. N - 1. */
GDPO_CLONES int64_t gdpo_zeros_left_f32(int64_t *left, int64_t m, const double *a, float *y, const double *prm,
                                        const float *r, int64_t N, int64_t K, int64_t g, const double *W,
                                        int64_t *zeros)
{
    gdpo_groups z;
    double alpha = prm[0], beta = prm[1], th = prm[2], near = prm[3];
    int64_t kept = 0, found = 0;
    if (gdpo_groups_init(&z, r, N, K, g, W) || gdpo_groups_rows(&z, left, m))
        return -1;
    for (int64_t j = 0; j < m; j++) {
        int64_t i = left[j];
        double ai = a[i], mag = gdpo_abs(ai);
        if (j + GDPO_AHEAD < m)
            gdpo_groups_ahead(&z, left[j + GDPO_AHEAD]);
        if (y[i] == 0.0f && ai != 0.0) {
            double B = alpha + beta * mag, Bg = B * (1.0 + 0x1p-40);
            if (mag > Bg && mag + Bg < th)
                continue;
        }
        if (mag <= near && gdpo_zero_row(&z, i)) {
            y[i] = 0.0f;
            found++;
            continue;
        }
        left[kept++] = i;
    }
    *zeros = found;
    return kept;
}

/* The canonical pairwise tree sum (impl._segments.tree_sum) along the middle axis of x (A, m, B),
 * float64, element strides sa, sm, sb, of the squares of x where squares is set (each square
 * rounded, then summed the same way): level by level, position i of a level is the sum of
 * positions 2i and 2i + 1 of the one below, an odd one out carried up unchanged, until one is
 * left; the squares are taken on the first level. Each level's additions are those of the torch
 * passes, so the sums are theirs to the bit, in one call instead of three dispatched operations
 * a level. out (A, B) contiguous; work holds at least ((m + 1) / 2) * min(B, GDPO_TREE_CHUNK)
 * doubles: GDPO_TREE_CHUNK columns at a time, each level of them side by side (the B axis is the
 * contiguous one where B > 1: the additions vectorize along it). Returns 0, or -1 where m < 1. */
#define GDPO_TREE_CHUNK 256

GDPO_CLONES int gdpo_tree_sum_f64(const double *x, int64_t A, int64_t m, int64_t B, int64_t sa, int64_t sm,
                                  int64_t sb, int squares, double *out, double *work)
{
    if (m < 1)
        return -1;
    if (B == 1) { /* one column: the same levels, without the loops over columns */
        for (int64_t a = 0; a < A; a++) {
            const double *xa = x + a * sa;
            int64_t h = m / 2, n = h + m % 2;
            if (squares)
                for (int64_t i = 0; i < h; i++) {
                    double e = xa[2 * i * sm], o = xa[(2 * i + 1) * sm];
                    double ee = e * e, oo = o * o;
                    work[i] = ee + oo;
                }
            else
                for (int64_t i = 0; i < h; i++)
                    work[i] = xa[2 * i * sm] + xa[(2 * i + 1) * sm];
            if (m % 2) {
                double e = xa[(m - 1) * sm];
                work[h] = squares ? e * e : e;
            }
            while (n > 1) {
                int64_t hh = n / 2;
                for (int64_t i = 0; i < hh; i++)
                    work[i] = work[2 * i] + work[2 * i + 1];
                if (n % 2)
                    work[hh] = work[n - 1];
                n = hh + n % 2;
            }
            out[a] = work[0];
        }
        return 0;
    }
    for (int64_t a = 0; a < A; a++) {
        for (int64_t b0 = 0; b0 < B; b0 += GDPO_TREE_CHUNK) {
            int64_t c = B - b0 < GDPO_TREE_CHUNK ? B - b0 : GDPO_TREE_CHUNK;
            const double *xa = x + a * sa + b0 * sb;
            int64_t h = m / 2, n = h + m % 2;
            for (int64_t i = 0; i < h; i++) { /* the first level, from x */
                const double *e = xa + 2 * i * sm, *o = e + sm;
                double *w = work + i * c;
                if (squares)
                    for (int64_t j = 0; j < c; j++) {
                        double ee = e[j * sb] * e[j * sb], oo = o[j * sb] * o[j * sb];
                        w[j] = ee + oo;
                    }
                else
                    for (int64_t j = 0; j < c; j++)
                        w[j] = e[j * sb] + o[j * sb];
            }
            if (m % 2) { /* the odd one out, carried up (squared on the first level) */
                const double *e = xa + (m - 1) * sm;
                double *w = work + h * c;
                for (int64_t j = 0; j < c; j++)
                    w[j] = squares ? e[j * sb] * e[j * sb] : e[j * sb];
            }
            while (n > 1) { /* the levels above, in place: position i reads 2i and 2i + 1 >= i */
                int64_t hh = n / 2;
                for (int64_t i = 0; i < hh; i++) {
                    double *w = work + i * c;
                    const double *e = work + 2 * i * c, *o = e + c;
                    for (int64_t j = 0; j < c; j++)
                        w[j] = e[j] + o[j];
                }
                if (n % 2) {
                    double *w = work + hh * c;
                    const double *e = work + (n - 1) * c;
                    for (int64_t j = 0; j < c; j++)
                        w[j] = e[j];
                }
                n = hh + n % 2;
            }
            double *dst = out + a * B + b0;
            for (int64_t j = 0; j < c; j++)
                dst[j] = work[j];
        }
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
