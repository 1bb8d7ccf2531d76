/* pacer's native kernels, built and checked on first use by pacer/native/__init__.py (numpy's path otherwise).
 *
 * pacer_row_stats - what the features read of softmax(x) for a float32 logits row x[0..n), in one pass over the
 * row (each block of 2048 values is read from memory once and then from L1), no memory written:
 *   i, j  the largest and the second-largest value's index (the first of equals; j = -1 when not asked for or n = 1)
 *   m     x_i, the top logit
 *   z     sum_k exp(x_k - m)            (the softmax's normaliser: top probability 1 / z)
 *   s     sum_k exp(x_k - m) (x_k - m)  (the entropy is log z - s / z)
 * Per block b: its maximum m_b, z_b = sum exp(x - m_b), s_b = sum exp(x - m_b)(x - m_b); then
 * z = sum_b e^(m_b - m) z_b and s = sum_b e^(m_b - m) (s_b + (m_b - m) z_b), in double.
 * x - m_b is clamped at -87 (exp of that is ~1.6e-38): a masked id (-inf) adds nothing measurable and no NaN.
 * Returns 1 (nothing computed) for a NaN anywhere or a top logit that is not finite: the caller takes numpy's path.
 * exp is a degree-6 polynomial on [-ln2/2, ln2/2] scaled by 2^k (Cephes' expf coefficients), written so that the
 * loop vectorises without -ffast-math; sums are float32 within a block and double across blocks.
 * Accuracy, on every instruction set (the vector width and FMA change the order of the sums, not the bound):
 * z and s within (ROW_BLOCK + 96) * 2^-24 ~ 1.3e-4 relative of their exact values (pacer/native/__init__.py
 * derives it: RELATIVE_BOUND). */
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float exp_poly(float d) {
    /* exp(d) for d <= 0 (clamped at -87): 2^k * p(r), |r| <= ln2/2; ~2 ulp */
    d = d < -87.0f ? -87.0f : d;
    float k = (d * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = d - k * 0.693359375f + k * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits;
    memcpy(&bits, &p, 4);
    bits += (int32_t)k << 23;
    memcpy(&p, &bits, 4);
    return p;
}

#define ROW_BLOCK 2048

static int64_t first_at(const float *x, int64_t a, int64_t b, float v, int64_t skip) {
    for (int64_t k = a; k < b; k++)
        if (x[k] == v && k != skip) return k;
    return -1;
}

int pacer_row_stats(const float *x, int64_t n, int second, int64_t *top, double *out) {
    int64_t nb = (n + ROW_BLOCK - 1) / ROW_BLOCK;
    if (n <= 0 || nb > 4096) return 1;
    float bmax[nb];
    double bz[nb], bs[nb];
    int nan = 0;
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + b * ROW_BLOCK;
        int64_t len = (b + 1) * ROW_BLOCK < n ? ROW_BLOCK : n - b * ROW_BLOCK;
        float mb = -INFINITY;
        int bad = 0;
#pragma omp simd reduction(max:mb) reduction(|:bad)
        for (int64_t k = 0; k < len; k++) {
            mb = xb[k] > mb ? xb[k] : mb;
            bad |= xb[k] != xb[k];
        }
        nan |= bad;
        float zb = 0.0f, sb = 0.0f, mm = isfinite(mb) ? mb : 0.0f;
#pragma omp simd reduction(+:zb, sb)
        for (int64_t k = 0; k < len; k++) {
            float d = xb[k] - mm;
            d = d < -87.0f ? -87.0f : d;
            float e = exp_poly(d);
            zb += e;
            sb += e * d;
        }
        bmax[b] = mb;
        bz[b] = zb;
        bs[b] = sb;
    }
    if (nan) return 1;
    int64_t ib = 0;
    for (int64_t b = 1; b < nb; b++)
        if (bmax[b] > bmax[ib]) ib = b;
    float m = bmax[ib];
    if (!isfinite(m)) return 1;
    double z = 0.0, s = 0.0;
    for (int64_t b = 0; b < nb; b++) {
        if (!isfinite(bmax[b])) continue;  /* an all-masked block adds nothing */
        double g = (double)bmax[b] - m, w = exp(g);
        z += w * bz[b];
        s += w * (bs[b] + g * bz[b]);
    }
    int64_t i = first_at(x, ib * ROW_BLOCK, ib * ROW_BLOCK + ROW_BLOCK < n ? ib * ROW_BLOCK + ROW_BLOCK : n, m, -1);
    int64_t j = -1;
    if (second && n > 1) {
        /* the second value: the largest of the other blocks' maxima and of i's block without x_i */
        const float *xi = x + ib * ROW_BLOCK;
        int64_t len = (ib + 1) * ROW_BLOCK < n ? ROW_BLOCK : n - ib * ROW_BLOCK;
        float v = -INFINITY;
        for (int64_t k = 0; k < len; k++)
            if (ib * ROW_BLOCK + k != i && xi[k] > v) v = xi[k];
        for (int64_t b = 0; b < nb; b++)
            if (b != ib && bmax[b] > v) v = bmax[b];
        for (int64_t b = 0; b < nb && j < 0; b++)
            if (bmax[b] >= v)
                j = first_at(x, b * ROW_BLOCK, (b + 1) * ROW_BLOCK < n ? (b + 1) * ROW_BLOCK : n, v, i);
    }
    top[0] = i;
    top[1] = j;
    out[0] = m;
    out[1] = z;
    out[2] = s;
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------
 * One drafted token through the pre-verification layer (pacer.preverify.layer.CpuExtend, r = 1): the same folded
 * weights, every vector in float32 and every reduction in double. Writes token n's key, value and state into rows
 * n of K, V, Z ([max, d] each; the keys and values are laid out [heads, d / heads] within a row). */

typedef struct {
    int D, S, d, heads, context, tanh_gelu, max;
    float eps_h, eps_a, eps_m;
    const float *w_h, *b_h, *w_s, *b_s, *pos, *w_qkv, *b_qkv, *w_o, *b_o, *w_1, *b_1, *w_2, *b_2;
    const float *w_t, *w_b; /* the token head [d] and the block head [2 d] */
    float b_t, b_b;
} pacer_layer;

static void standardise(const float *x, int n, float eps, float *out) {
    double mean = 0.0, var = 0.0;
    for (int i = 0; i < n; i++) mean += x[i];
    mean /= n;
    for (int i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    float inv = (float)(1.0 / sqrt(var / n + eps));
    for (int i = 0; i < n; i++) out[i] = (float)(x[i] - mean) * inv;
}

/* out[i] (+)= W[i] . x + b[i], W [rows, cols] row-major */
static void affine(const float *W, const float *b, const float *x, int rows, int cols, float *out, int add) {
    for (int i = 0; i < rows; i++) {
        const float *w = W + (int64_t)i * cols;
        float acc = 0.0f;
#pragma omp simd reduction(+:acc)
        for (int j = 0; j < cols; j++) acc += w[j] * x[j];
        out[i] = (add ? out[i] : 0.0f) + acc + b[i];
    }
}

static int pacer_layer_step(const pacer_layer *L, const float *h, const float *s, int n, float *K, float *V, float *Z) {
    int d = L->d, D = L->D;
    if (n < 0 || n >= L->max || d > 1024 || D > 65536) return 1;
    float hs[D], z[d], a[d], qkv[3 * d], o[d], u[2 * d], att[L->max];
    standardise(h, D, L->eps_h, hs);
    affine(L->w_h, L->b_h, hs, d, D, z, 0);
    affine(L->w_s, L->b_s, s, d, L->S, z, 1);
    for (int i = 0; i < d; i++) z[i] += L->pos[(int64_t)n * d + i];
    if (L->context) {
        int dh = d / L->heads;
        standardise(z, d, L->eps_a, a);
        affine(L->w_qkv, L->b_qkv, a, 3 * d, d, qkv, 0);
        memcpy(K + (int64_t)n * d, qkv + d, d * sizeof(float));
        memcpy(V + (int64_t)n * d, qkv + 2 * d, d * sizeof(float));
        double scale = 1.0 / sqrt((double)dh);
        for (int hd = 0; hd < L->heads; hd++) {
            const float *q = qkv + hd * dh;
            double top = -INFINITY, sum = 0.0;
            for (int j = 0; j <= n; j++) {
                const float *k = K + (int64_t)j * d + hd * dh;
                float acc = 0.0f;
                for (int c = 0; c < dh; c++) acc += q[c] * k[c];
                att[j] = (float)(acc * scale);
                if (att[j] > top) top = att[j];
            }
            for (int j = 0; j <= n; j++) { att[j] = (float)exp(att[j] - top); sum += att[j]; }
            for (int c = 0; c < dh; c++) {
                double acc = 0.0;
                for (int j = 0; j <= n; j++) acc += att[j] * V[(int64_t)j * d + hd * dh + c];
                o[hd * dh + c] = (float)(acc / sum);
            }
        }
        affine(L->w_o, L->b_o, o, d, d, z, 1);
    }
    standardise(z, d, L->eps_m, a);
    affine(L->w_1, L->b_1, a, 2 * d, d, u, 0);
    for (int i = 0; i < 2 * d; i++) {
        double x = u[i];
        u[i] = L->tanh_gelu ? (float)(0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))))
                            : (float)(0.5 * x * (1.0 + erf(x / 1.4142135623730951)));
    }
    affine(L->w_2, L->b_2, u, d, 2 * d, z, 1);
    memcpy(Z + (int64_t)n * d, z, d * sizeof(float));
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------
 * A policy's check of drafted token n, in one call: its raw scalars normalised as the policy does in float32
 * ((s - mu) / sd; mu = NULL: already normalised), the layer step, the token logit c = z . w_t + b_t, the running
 * log-survival LS[n] = LS[n - 1] + log sigma(c), and where n + 1 closes a block of `block` tokens the block logit:
 * the logit of the survival min(LS[n], -1e-6) plus the block head on the block's last and mean states.
 * out[0] = c, out[1] = the block logit (NaN where n + 1 closes no block). */
int pacer_layer_check(const pacer_layer *L, const float *h, const float *s_raw, const float *mu, const float *sd,
                      int n, int block, float *K, float *V, float *Z, double *LS, double *out) {
    int d = L->d;
    if (block < 1 || L->S > 1024) return 1;
    float s[L->S > 0 ? L->S : 1];
    for (int i = 0; i < L->S; i++) s[i] = mu ? (s_raw[i] - mu[i]) / sd[i] : s_raw[i];
    int rc = pacer_layer_step(L, h, s, n, K, V, Z);
    if (rc) return rc;
    const float *z = Z + (int64_t)n * d;
    double c = L->b_t;
    for (int i = 0; i < d; i++) c += (double)z[i] * L->w_t[i];
    double log_sigma = c >= 0 ? -log1p(exp(-c)) : c - log1p(exp(c));
    LS[n] = (n ? LS[n - 1] : 0.0) + log_sigma;
    out[0] = c;
    out[1] = NAN;
    if ((n + 1) % block == 0) {
        double surv = LS[n] < -1e-6 ? LS[n] : -1e-6, pooled = L->b_b;
        for (int i = 0; i < d; i++) {
            double mean = 0.0;
            for (int j = n + 1 - block; j <= n; j++) mean += Z[(int64_t)j * d + i];
            pooled += (double)z[i] * L->w_b[i] + mean / block * L->w_b[d + i];
        }
        out[1] = surv - log(-expm1(surv)) + pooled;
    }
    return 0;
}
