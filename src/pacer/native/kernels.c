/* pacer's native kernels, built and checked on first use by pacer/native/__init__.py (numpy's path otherwise).
 *
 * pacer_exp_stats - one pass over a float32 logits row x[0..n) with its top logit m, no memory written:
 *   z = sum_i exp(x_i - m)            (the softmax's normaliser: top probability 1 / z)
 *   s = sum_i exp(x_i - m) (x_i - m)  (the entropy is log z - s / z)
 * x_i - m is clamped at -87 (exp of that is ~1.6e-38): a masked id (-inf) adds nothing measurable and no NaN.
 * exp is a degree-6 polynomial on [-ln2/2, ln2/2] scaled by 2^k (Cephes' expf coefficients), written so that the
 * loop vectorises without -ffast-math; sums are float32 within blocks of 2048 and double across them. */
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

void pacer_exp_stats(const float *x, int64_t n, float m, double *z, double *s) {
    double zt = 0.0, st = 0.0;
    for (int64_t a = 0; a < n; a += 2048) {
        int64_t b = a + 2048 < n ? a + 2048 : n;
        float zb = 0.0f, sb = 0.0f;
#pragma omp simd reduction(+:zb, sb)
        for (int64_t i = a; i < b; i++) {
            float d = x[i] - m;
            d = d < -87.0f ? -87.0f : d;
            float e = exp_poly(d);
            zb += e;
            sb += e * d;
        }
        zt += zb;
        st += sb;
    }
    *z = zt;
    *s = st;
}

/* ------------------------------------------------------------------------------------------------------------
 * One drafted token through the pre-verification layer (pacer.preverify.layer.CpuExtend, r = 1): the same folded
 * weights, every vector in float32 and every reduction in double. Writes token n's key, value and state into rows
 * n of K, V, Z ([max, d] each; the keys and values are laid out [heads, d / heads] within a row). */

typedef struct {
    int D, S, d, heads, context, tanh_gelu, max;
    float eps_h, eps_a, eps_m;
    const float *w_h, *b_h, *w_s, *b_s, *pos, *w_qkv, *b_qkv, *w_o, *b_o, *w_1, *b_1, *w_2, *b_2;
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

int pacer_layer_step(const pacer_layer *L, const float *h, const float *s, int n, float *K, float *V, float *Z) {
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
