/* pacer's native row statistics (built and checked on first use by pacer/native/__init__.py; numpy's path
 * otherwise). One pass over a float32 logits row x[0..n) with its top logit m, no memory written:
 *   z = sum_i exp(x_i - m)            (the softmax's normaliser: top probability 1 / z)
 *   s = sum_i exp(x_i - m) (x_i - m)  (the entropy is log z - s / z)
 * x_i - m is clamped at -87 (exp of that is ~1.6e-38): a masked id (-inf) adds nothing measurable and no NaN.
 * exp is a degree-6 polynomial on [-ln2/2, ln2/2] scaled by 2^k (Cephes' expf coefficients), written so that the
 * loop vectorises without -ffast-math; sums are float32 within blocks of 2048 and double across them. */
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
