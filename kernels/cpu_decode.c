/* A few tokens (a decoding step, a prompt-lookup verify pass, a short re-prefill) through every
 * layer of a Llama-style decoder on the CPU, float32, in one call.
 *
 * The lean engine's torch step spends about half its time in the framework: some forty small
 * tensor operations per layer, each dispatched from Python. This runs all layers in one call and
 * one OpenMP parallel region: every matrix product is split over the threads (rows, or a share of
 * the rows of weights kept in transposed memory), each weight row is read once for all the tokens,
 * and the small operations (RMSNorm, RoPE, causal softmax attention, SiLU) run between barriers.
 * Several tokens (a verify pass) attend with every query of a kv head in the lanes of a few vectors
 * (`attend_chunk`): a 13-token pass took 3.2 single steps with one head at a time, 2.1 so.
 * Where the weights are exactly 4-bit (the embedded model's, dequantized from GGUF Q4_1), the step
 * reads them as 4-bit codes (`gemm_q4`): the same values from a sixth of the bytes, a decoding step
 * 1.9x faster; with AVX-512 VNNI or AVX2 the codes meet the activations in integer products
 * (`gemm_q4x8`, the activations rounded to 15 bits), a decoding step a fifth faster again on a 2-core Xeon. Weights
 * and the KV cache are the caller's tensors, read and written in place; nothing is allocated here
 * but a few rows of weights on the stack.
 *
 * Built at run time by kernels/cpu_decode.py (cc -O3 -march=native -mprefer-vector-width=512
 * -ffp-contract=fast -fopenmp: GCC keeps to 256-bit vectors on AVX-512 machines unless told, and
 * in ISO C mode it fuses no multiply with its add unless told); the process's
 * OpenMP runtime is torch's own (same soname), so the two share one thread pool.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__AVX2__) || defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include <omp.h>

/* Vectors of VL floats (GCC vector extensions), the width of the machine's registers: AVX-512's,
 * else AVX's, else 128-bit ones (SSE, NEON). Every explicit vector loop below is written in them. */
#if defined(__AVX512F__)
#define VL 16
#elif defined(__AVX__)
#define VL 8
#else
#define VL 4 /* SSE, NEON: 128-bit registers */
#endif
typedef float vf __attribute__((vector_size(VL * sizeof(float)), aligned(sizeof(float)), may_alias));
typedef int32_t vi __attribute__((vector_size(VL * sizeof(float)), aligned(sizeof(float)), may_alias));

static inline vf vsplat(float a) { return (vf){0} + a; }

/* A float16 value (the bits of IEEE binary16) as a float: exact, every float16 is a float. */
static inline float half_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, m = h & 1023;
    union { uint32_t u; float f; } v;
    if (e == 0) { /* zero or subnormal: m x 2^-24 */
        v.f = (float)m * 0x1p-24f;
        v.u |= sign;
    } else {
        v.u = sign | (e == 31 ? 0x7f800000u : (e + 112) << 23) | m << 13;
    }
    return v.f;
#endif
}

/* e^x for x <= 0 (scores minus their maximum), within 2 ulp of expf; e^-inf = 0. */
static inline vf vexp(vf x) {
    const vf lo = vsplat(-87.0f);
    const vi under = x < lo; /* e^x below float's normal range: 0 */
    x = (vf)(((vi)x & ~under) | ((vi)lo & under));
    const vf n = __builtin_convertvector(__builtin_convertvector(x * 1.44269504f + vsplat(-0.5f), vi), vf);
    /* x = n ln 2 + r, |r| <= ln 2 / 2, in two parts so that r keeps its low bits */
    vf r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    vf p = vsplat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const vi scale = (__builtin_convertvector(n, vi) + 127) << 23;
    return (vf)((vi)(p * (vf)scale) & ~under);
}

/* row[i] = e^(row[i] - top) for i < n, in place; returns their sum. */
static float exp_sum(float *row, int n, float top) {
    float total = 0.0f;
    int i = 0;
    for (; i + VL <= n; i += VL) {
        const vf e = vexp(*(vf *)(row + i) - top);
        *(vf *)(row + i) = e;
        for (int k = 0; k < VL; k++) total += e[k];
    }
    for (; i < n; i++) {
        row[i] = expf(row[i] - top);
        total += row[i];
    }
    return total;
}

static inline vf vselect(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }
static inline vf vmax(vf a, vf b) { return vselect(a > b, a, b); }
static inline float vmax_lanes(vf a) {
    float m = a[0];
    for (int i = 1; i < VL; i++) m = a[i] > m ? a[i] : m;
    return m;
}

/* Per layer, the caller passes W_COUNT pointers: the nine tensors below, then for 4-bit weights each
 * projection's steps (at W_STEPS + its index) and offsets (at W_OFFSETS + its index). */
enum { W_N1, W_Q, W_K, W_V, W_O, W_N2, W_G, W_U, W_D, W_STEPS, W_OFFSETS = 2 * W_STEPS, W_COUNT = 3 * W_STEPS };
enum { LAYOUT_ROWS, LAYOUT_TRANSPOSED, LAYOUT_Q4 };
/* With LAYOUT_Q4: integer products where the machine has them (`gemm_q4x8`), float32 ones otherwise. */
#define LAYOUT_INTEGER 4

/* 4-bit weights, the GGUF Q4_1 scheme: in groups of 32 inputs, w = offset + step * q with q in
 * 0..15; codes [out][in / 2] bytes, byte j of a group holding q[j] (low nibble) and q[j + 16] (high
 * nibble); steps and offsets [out][in / 32] float16, as GGUF stores them. The embedded model's
 * weights were dequantized from Q4_1, so these codes give back its float32 weights exactly (step * q
 * is exact in float32), from a sixth of the bytes (float32 scales were a third of them; as float16
 * the packed weights take 13 MB less, at the same speed on a 2-core AVX-512 EPYC: its step is not
 * bound by those bytes).
 *
 * Every vector below is `vf`, the machine's own width: a 16-float vector on a machine without
 * AVX-512 has no register of its size, so GCC keeps it in memory and every operation on it loads
 * and stores (a decoding step from 4-bit codes on an AVX2 EPYC: 4 tokens a second, against 19
 * from the float32 weights). */
#define GV (32 / VL) /* vectors per group of 32 codes */

static inline float hsum(vf a) {
    float s = 0.0f;
    for (int i = 0; i < VL; i++) s += a[i];
    return s;
}

/* One group's 32 codes as floats, q[k * VL .. k * VL + VL - 1] in v[k] (GCC widens bytes one by
 * one unless told). */
static inline void q4_codes(const uint8_t *c, vf v[GV]) {
#if defined(__AVX512F__)
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)c));
    v[0] = (vf)_mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(15)));
    v[1] = (vf)_mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
#elif defined(__AVX2__)
    const __m128i raw = _mm_loadu_si128((const __m128i *)c);
    const __m256i b0 = _mm256_cvtepu8_epi32(raw), b1 = _mm256_cvtepu8_epi32(_mm_srli_si128(raw, 8));
    const __m256i low = _mm256_set1_epi32(15);
    v[0] = (vf)_mm256_cvtepi32_ps(_mm256_and_si256(b0, low));
    v[1] = (vf)_mm256_cvtepi32_ps(_mm256_and_si256(b1, low));
    v[2] = (vf)_mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4));
    v[3] = (vf)_mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4));
#else
    for (int j = 0; j < 16; j++) {
        v[j / VL][j % VL] = (float)(c[j] & 15);
        v[(j + 16) / VL][(j + 16) % VL] = (float)(c[j] >> 4);
    }
#endif
}

#if defined(__AVX512F__)
#define Q4_ROWS 4 /* rows per pass of a several-token product (AVX-512: 32 vector registers) */
#else
#define Q4_ROWS 2
#endif
#ifndef Q4_TOKENS
#if defined(__AVX512F__)
#define Q4_TOKENS 6 /* tokens per pass: Q4_ROWS x Q4_TOKENS accumulators (6: 25.0 against 26.0 ms for 4 at T = 13) */
#else
#define Q4_TOKENS 4
#endif
#endif

/* tb tokens from `x` against `rows` float32 rows `w` (row stride `in`), into y[t][r0 + r]: the
 * rows times the tokens in registers, each row and token vector loaded once per step. */
static inline __attribute__((always_inline)) void rows_tokens(const float *w, const float *x, float *y, int rows,
                                                             int tb, int out, int in, int r0) {
    vf acc[Q4_ROWS][Q4_TOKENS];
    for (int r = 0; r < rows; r++)
        for (int t = 0; t < tb; t++) acc[r][t] = (vf){0};
    for (int i = 0; i < in; i += VL) {
        vf xv[Q4_TOKENS];
        for (int t = 0; t < tb; t++) xv[t] = *(const vf *)(x + (int64_t)t * in + i);
        for (int r = 0; r < rows; r++) {
            const vf wv = *(const vf *)(w + (int64_t)r * in + i);
            for (int t = 0; t < tb; t++) acc[r][t] += wv * xv[t];
        }
    }
    for (int r = 0; r < rows; r++)
        for (int t = 0; t < tb; t++) y[(int64_t)t * out + r0 + r] = hsum(acc[r][t]);
}

/* Every token of x [T, in] against `rows` float32 rows w (row stride `in`) into y[t][r0 + r],
 * Q4_TOKENS tokens per pass (the count a constant, so that the accumulators stay in registers). */
static void rows_all_tokens(const float *w, const float *x, float *y, int rows, int T, int out, int in, int r0) {
    for (int t0 = 0; t0 < T; t0 += Q4_TOKENS) {
        const float *xt = x + (int64_t)t0 * in;
        float *yt = y + (int64_t)t0 * out;
        if (rows == Q4_ROWS) {
            switch (T - t0 < Q4_TOKENS ? T - t0 : Q4_TOKENS) {
            case 1: rows_tokens(w, xt, yt, Q4_ROWS, 1, out, in, r0); break;
            case 2: rows_tokens(w, xt, yt, Q4_ROWS, 2, out, in, r0); break;
            case 3: rows_tokens(w, xt, yt, Q4_ROWS, 3, out, in, r0); break;
#if Q4_TOKENS > 4
            case 4: rows_tokens(w, xt, yt, Q4_ROWS, 4, out, in, r0); break;
            case 5: rows_tokens(w, xt, yt, Q4_ROWS, 5, out, in, r0); break;
#endif
#if Q4_TOKENS > 6
            case 6: rows_tokens(w, xt, yt, Q4_ROWS, 6, out, in, r0); break;
            case 7: rows_tokens(w, xt, yt, Q4_ROWS, 7, out, in, r0); break;
#endif
            default: rows_tokens(w, xt, yt, Q4_ROWS, Q4_TOKENS, out, in, r0); break;
            }
        } else {
            rows_tokens(w, xt, yt, rows, T - t0 < Q4_TOKENS ? T - t0 : Q4_TOKENS, out, in, r0);
        }
    }
}

#if !defined(__AVX512F__)
/* y[t] = W x[t] for T (a constant) tokens of 4-bit W, without the float32 rows in memory: each
 * group's codes are expanded in registers and meet every token's x there. Narrower than 16 floats
 * this beats the row buffer `gemm_q4` keeps with AVX-512 (an AVX2 EPYC, a pass of the embedded
 * model: 1 token 11.5 -> 9.4 ms after 100 tokens and 15.8 -> 13.5 ms after 1,000; 2, 3, 4 tokens
 * 15.6, 19.9, 25.7 -> 14.7, 17.6, 21.7 ms; 8 tokens 37.6 -> 35.2 ms). With AVX-512 the buffer
 * stays: it was measured there, this form was not. */
static inline __attribute__((always_inline)) void q4_tokens_direct(const uint8_t *codes, const uint16_t *steps,
        const uint16_t *offsets, const float *x, float *y, int out, int in, const int T) {
    const int groups = in / 32;
#pragma omp for schedule(static)
    for (int r0 = 0; r0 < out; r0 += Q4_ROWS) {
        const int rows = out - r0 < Q4_ROWS ? out - r0 : Q4_ROWS;
        vf acc[Q4_ROWS][Q4_TOKENS];
        for (int r = 0; r < Q4_ROWS; r++)
            for (int t = 0; t < T; t++) acc[r][t] = (vf){0};
        for (int gi = 0; gi < groups; gi++) {
            for (int r = 0; r < rows; r++) {
                const int64_t row = r0 + r;
                vf v[GV];
                q4_codes(codes + row * (in / 2) + gi * 16, v);
                const float st = half_float(steps[row * groups + gi]), of = half_float(offsets[row * groups + gi]);
                for (int k = 0; k < GV; k++) {
                    const vf w = v[k] * st + of;
                    for (int t = 0; t < T; t++)
                        acc[r][t] += w * *(const vf *)(x + (int64_t)t * in + gi * 32 + k * VL);
                }
            }
        }
        for (int r = 0; r < rows; r++)
            for (int t = 0; t < T; t++) y[(int64_t)t * out + r0 + r] = hsum(acc[r][t]);
    }
}

/* Every token of x [T, in], Q4_TOKENS at a time (a constant count: the accumulators stay in
 * registers). */
static void q4_direct(const uint8_t *codes, const uint16_t *steps, const uint16_t *offsets, const float *x,
                      float *y, int T, int out, int in) {
    for (int t0 = 0; t0 < T; t0 += Q4_TOKENS) {
        const float *xt = x + (int64_t)t0 * in;
        float *yt = y + (int64_t)t0 * out;
        switch (T - t0 < Q4_TOKENS ? T - t0 : Q4_TOKENS) {
        case 1: q4_tokens_direct(codes, steps, offsets, xt, yt, out, in, 1); break;
        case 2: q4_tokens_direct(codes, steps, offsets, xt, yt, out, in, 2); break;
        case 3: q4_tokens_direct(codes, steps, offsets, xt, yt, out, in, 3); break;
        default: q4_tokens_direct(codes, steps, offsets, xt, yt, out, in, Q4_TOKENS); break;
        }
    }
}
#endif

/* y[t] = W x[t] for 4-bit W. With AVX-512, Q4_ROWS rows at a time are expanded to their float32
 * values, which then meet Q4_TOKENS tokens per pass from registers (for one token this beat
 * multiplying the codes directly, offset * sum(x) + step * (q . x): 9.9-10.7 against 11.8 ms a
 * step); narrower, `q4_direct`. */
static void gemm_q4(const uint8_t *codes, const uint16_t *steps, const uint16_t *offsets, const float *x,
                    float *y, int T, int out, int in) {
    const int groups = in / 32;
#if !defined(__AVX512F__)
    (void)groups;
    q4_direct(codes, steps, offsets, x, y, T, out, in);
#else
#pragma omp for schedule(static)
    for (int r0 = 0; r0 < out; r0 += Q4_ROWS) {
        const int rows = out - r0 < Q4_ROWS ? out - r0 : Q4_ROWS;
        float w[Q4_ROWS][in];
        for (int r = 0; r < rows; r++) {
            const uint8_t *c = codes + (int64_t)(r0 + r) * (in / 2);
            const uint16_t *st = steps + (int64_t)(r0 + r) * groups, *of = offsets + (int64_t)(r0 + r) * groups;
            for (int gi = 0; gi < groups; gi++) {
                vf v[GV];
                q4_codes(c + gi * 16, v);
                const float step = half_float(st[gi]), offset = half_float(of[gi]);
                for (int k = 0; k < GV; k++) *(vf *)(w[r] + gi * 32 + k * VL) = v[k] * step + offset;
            }
        }
        rows_all_tokens(w[0], x, y, rows, T, out, in, r0);
    }
#endif
}


#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define Q4_INT 512
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(__AVX512F__)
#define Q4_INT 256
#endif

#if defined(Q4_INT)
/* 4-bit weights against activations in 8-bit integers (AVX-512 VNNI, or AVX2): the float path above turns
 * every code into a float and spends most of a decoding step doing so; here 64 codes meet 64
 * activations in one integer instruction (vpdpbusd, unsigned codes x signed activations), as
 * llama.cpp's Q4_1 x Q8_1 product does. The activations are kept to 15 bits, not llama.cpp's 8:
 * per group of 32, x = d (a + b / 128) with a = round(x / d) in -127..127, d = max |x| / 127, and
 * b in -64..64 the rounded remainder, so each x is within d / 256 of its value (8-bit alone: d / 2)
 * and the logits stay within float32 rounding of the float path's. Two products per 64 codes, then
 * 128 a.c + b.c in the integer lanes: one conversion and one multiply-add per group pair.
 *
 * Per token, `in` activations in pair order: groups 2p and 2p + 1 share 64 bytes, [2p: 0..15,
 * 2p + 1: 0..15, 2p: 16..31, 2p + 1: 16..31], the order the two groups' codes unpack in (a byte's low
 * nibble holds q[j], its high q[j + 16]).
 *
 * Without AVX-512 (Q4_INT 256) the same numbers meet in 256-bit halves, as llama.cpp's AVX2 Q4_1 x
 * Q8_1 product does: vpmaddubsw multiplies codes and activations into 16-bit sums of pairs (at most 4
 * x 15 x 127 once the two halves are added: no saturation) and vpmaddwd adds those pairs into the
 * 32-bit lanes, weighted 128 for a and 1 for b. */
typedef struct {
    int8_t *a, *b;  /* [T][in], pair order */
    float *scale;   /* [T][in / 64][16]: d / 128 of each lane's group */
    float *sum;     /* [T][in / 32]: the sum of each group's float x, for the offsets */
} Q8X;

static inline int q8x_ok(int in) { return in % 64 == 0; }

/* Floats of scratch a Q8X for T tokens of `in` activations takes. */
static inline int64_t q8x_floats(int T, int in) { return (int64_t)T * (in / 2 + in / 4 + in / 32 + 16); }

static Q8X q8x_at(float *base, int T, int in) {
    Q8X q;
    q.scale = base;
    q.sum = q.scale + (int64_t)T * (in / 4);
    q.a = (int8_t *)(q.sum + (int64_t)T * (in / 32));
    q.b = q.a + (int64_t)T * in;
    return q;
}

/* Group g (32 floats at x) of token t into q. */
#if Q4_INT == 512
static inline void q8x_group(const float *x, Q8X q, int t, int g, int in) {
    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    const float top = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const float d = top / 127.0f, inv = top > 0.0f ? 127.0f / top : 0.0f;
    const __m512 s0 = _mm512_mul_ps(x0, _mm512_set1_ps(inv)), s1 = _mm512_mul_ps(x1, _mm512_set1_ps(inv));
    const __m512i a0 = _mm512_cvtps_epi32(s0), a1 = _mm512_cvtps_epi32(s1); /* nearest, ties to even */
    const __m512 r0 = _mm512_mul_ps(_mm512_sub_ps(s0, _mm512_cvtepi32_ps(a0)), _mm512_set1_ps(128.0f));
    const __m512 r1 = _mm512_mul_ps(_mm512_sub_ps(s1, _mm512_cvtepi32_ps(a1)), _mm512_set1_ps(128.0f));
    const int64_t base = (int64_t)t * in + (g / 2) * 64 + (g % 2) * 16;
    _mm_storeu_si128((__m128i *)(q.a + base), _mm512_cvtsepi32_epi8(a0));
    _mm_storeu_si128((__m128i *)(q.a + base + 32), _mm512_cvtsepi32_epi8(a1));
    _mm_storeu_si128((__m128i *)(q.b + base), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(r0)));
    _mm_storeu_si128((__m128i *)(q.b + base + 32), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(r1)));
    float *scale = q.scale + ((int64_t)t * (in / 64) + g / 2) * 16;
    for (int k = 0; k < 4; k++) scale[(g % 2) * 4 + k] = scale[8 + (g % 2) * 4 + k] = d / 128.0f;
    q.sum[(int64_t)t * (in / 32) + g] = _mm512_reduce_add_ps(_mm512_add_ps(x0, x1));
}
#else
/* 32 int32 (four vectors, in order) as 32 saturated bytes in order. */
static inline __m256i bytes_of(const __m256i v[4]) {
    /* packs work within 128-bit lanes: 4-byte runs come out as v0 0-3, v1 0-3, v2 0-3, v3 0-3 | v0 4-7, ... */
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static inline void q8x_group(const float *x, Q8X q, int t, int g, int in) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4];
    for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(x + 8 * k);
    const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                   _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    const float top = vmax_lanes((vf)m);
    const float d = top / 127.0f, inv = top > 0.0f ? 127.0f / top : 0.0f;
    __m256i a[4], b[4];
    for (int k = 0; k < 4; k++) {
        const __m256 s = _mm256_mul_ps(v[k], _mm256_set1_ps(inv));
        a[k] = _mm256_cvtps_epi32(s); /* nearest, ties to even */
        b[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(s, _mm256_cvtepi32_ps(a[k])), _mm256_set1_ps(128.0f)));
    }
    const __m256i qa = bytes_of(a), qb = bytes_of(b);
    const int64_t base = (int64_t)t * in + (g / 2) * 64 + (g % 2) * 16;
    _mm_storeu_si128((__m128i *)(q.a + base), _mm256_castsi256_si128(qa));
    _mm_storeu_si128((__m128i *)(q.a + base + 32), _mm256_extracti128_si256(qa, 1));
    _mm_storeu_si128((__m128i *)(q.b + base), _mm256_castsi256_si128(qb));
    _mm_storeu_si128((__m128i *)(q.b + base + 32), _mm256_extracti128_si256(qb, 1));
    float *scale = q.scale + ((int64_t)t * (in / 64) + g / 2) * 16;
    for (int k = 0; k < 4; k++) scale[(g % 2) * 4 + k] = scale[8 + (g % 2) * 4 + k] = d / 128.0f;
    q.sum[(int64_t)t * (in / 32) + g] = hsum((vf)_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])));
}
#endif

/* x [T, in] into q, the groups shared among the threads (inside the parallel region). */
static void q8x_rows(const float *x, Q8X q, int T, int in) {
    const int groups = in / 32;
#pragma omp for schedule(static)
    for (int64_t job = 0; job < (int64_t)T * groups; job++) {
        const int t = (int)(job / groups), g = (int)(job % groups);
        q8x_group(x + (int64_t)t * in + g * 32, q, t, g, in);
    }
}

#define Q8_TOKENS 4 /* tokens per pass: Q4_ROWS x Q8_TOKENS accumulators */

#if Q4_INT == 512
/* tb tokens (from t0) against `rows` 4-bit rows from r0, into y[t][r0 + r]. `steps`: the rows'
 * steps as floats, [Q4_ROWS][groups]. */
static inline __attribute__((always_inline)) void q4x8_tokens(const uint8_t *codes, const float *steps,
        const uint16_t *offsets, Q8X q, float *y, int rows, int tb, int t0, int out, int in, int r0) {
    const int groups = in / 32, pairs = groups / 2;
    const __m512i shifts = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0), low = _mm512_set1_epi8(15);
    const __m512i lanes = _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512 acc[Q4_ROWS][Q8_TOKENS];
    for (int r = 0; r < rows; r++)
        for (int t = 0; t < tb; t++) acc[r][t] = _mm512_setzero_ps();
    for (int p = 0; p < pairs; p++) {
        __m512i w[Q4_ROWS];
        __m512 step[Q4_ROWS];
        for (int r = 0; r < rows; r++) {
            const uint8_t *c = codes + (int64_t)(r0 + r) * (in / 2) + p * 32;
            /* both halves hold the pair's 32 bytes; the upper one shifted to the high nibbles */
            w[r] = _mm512_and_si512(
                _mm512_srlv_epi64(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)c)), shifts), low);
            step[r] = _mm512_permutexvar_ps(
                lanes, _mm512_castpd_ps(_mm512_castpd128_pd512(_mm_load_sd((const double *)(steps + r * groups + 2 * p)))));
        }
        for (int t = 0; t < tb; t++) {
            const int64_t at = (int64_t)(t0 + t) * in + p * 64;
            const __m512i a = _mm512_loadu_si512(q.a + at), b = _mm512_loadu_si512(q.b + at);
            const __m512 d = _mm512_loadu_ps(q.scale + ((int64_t)(t0 + t) * pairs + p) * 16);
            for (int r = 0; r < rows; r++) {
                const __m512i hi = _mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w[r], a), 7);
                const __m512i dot = _mm512_dpbusd_epi32(hi, w[r], b);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(step[r], d), acc[r][t]);
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        const uint16_t *of = offsets + (int64_t)(r0 + r) * groups;
        for (int t = 0; t < tb; t++) {
            const float *sum = q.sum + (int64_t)(t0 + t) * groups;
            __m512 o = _mm512_setzero_ps();
            for (int g = 0; g < groups; g += 16) {
                const __mmask16 m = groups - g >= 16 ? 0xffff : (__mmask16)((1u << (groups - g)) - 1);
                o = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, of + g)),
                                    _mm512_maskz_loadu_ps(m, sum + g), o);
            }
            y[(int64_t)(t0 + t) * out + r0 + r] = _mm512_reduce_add_ps(acc[r][t]) + _mm512_reduce_add_ps(o);
        }
    }
}

#else
/* As above in 256-bit vectors (AVX2): each pair of groups in two halves, the codes' low nibbles (q[0..15]
 * of both groups) and their high ones (q[16..31]), which the activations' pair order matches. */
static inline __attribute__((always_inline)) void q4x8_tokens(const uint8_t *codes, const float *steps,
        const uint16_t *offsets, Q8X q, float *y, int rows, int tb, int t0, int out, int in, int r0) {
    const int groups = in / 32, pairs = groups / 2;
    const __m256i low = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1), weight_a = _mm256_set1_epi16(128);
    const __m256i lanes = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    __m256 acc[Q4_ROWS][Q8_TOKENS];
    for (int r = 0; r < rows; r++)
        for (int t = 0; t < tb; t++) acc[r][t] = _mm256_setzero_ps();
    for (int p = 0; p < pairs; p++) {
        __m256i lo[Q4_ROWS], hi[Q4_ROWS];
        __m256 step[Q4_ROWS];
        for (int r = 0; r < rows; r++) {
            const __m256i c = _mm256_loadu_si256((const __m256i *)(codes + (int64_t)(r0 + r) * (in / 2) + p * 32));
            lo[r] = _mm256_and_si256(c, low);
            hi[r] = _mm256_and_si256(_mm256_srli_epi16(c, 4), low);
            step[r] = _mm256_permutevar8x32_ps(
                _mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd((const double *)(steps + r * groups + 2 * p)))), lanes);
        }
        for (int t = 0; t < tb; t++) {
            const int64_t at = (int64_t)(t0 + t) * in + p * 64;
            const __m256i a0 = _mm256_loadu_si256((const __m256i *)(q.a + at));
            const __m256i a1 = _mm256_loadu_si256((const __m256i *)(q.a + at + 32));
            const __m256i b0 = _mm256_loadu_si256((const __m256i *)(q.b + at));
            const __m256i b1 = _mm256_loadu_si256((const __m256i *)(q.b + at + 32));
            const __m256 d = _mm256_loadu_ps(q.scale + ((int64_t)(t0 + t) * pairs + p) * 16);
            for (int r = 0; r < rows; r++) {
                const __m256i da = _mm256_add_epi16(_mm256_maddubs_epi16(lo[r], a0), _mm256_maddubs_epi16(hi[r], a1));
                const __m256i db = _mm256_add_epi16(_mm256_maddubs_epi16(lo[r], b0), _mm256_maddubs_epi16(hi[r], b1));
                const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(da, weight_a), _mm256_madd_epi16(db, ones));
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(step[r], d), acc[r][t]);
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        const uint16_t *of = offsets + (int64_t)(r0 + r) * groups;
        for (int t = 0; t < tb; t++) {
            const float *sum = q.sum + (int64_t)(t0 + t) * groups;
            __m256 o = _mm256_setzero_ps();
            int g = 0;
            for (; g + 8 <= groups; g += 8)
                o = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(of + g))), _mm256_loadu_ps(sum + g), o);
            float rest = 0.0f;
            for (; g < groups; g++) rest += half_float(of[g]) * sum[g];
            y[(int64_t)(t0 + t) * out + r0 + r] = hsum((vf)acc[r][t]) + hsum((vf)o) + rest;
        }
    }
}
#endif

/* y[t] = W x[t] for 4-bit W and x quantized in q (`q8x_rows`). */
static void gemm_q4x8(const uint8_t *codes, const uint16_t *steps, const uint16_t *offsets, Q8X q, float *y,
                      int T, int out, int in) {
    const int groups = in / 32;
#pragma omp for schedule(static)
    for (int r0 = 0; r0 < out; r0 += Q4_ROWS) {
        const int rows = out - r0 < Q4_ROWS ? out - r0 : Q4_ROWS;
        float sf[Q4_ROWS * groups];
        for (int r = 0; r < rows; r++) {
            const uint16_t *st = steps + (int64_t)(r0 + r) * groups;
#if Q4_INT == 512
            for (int g = 0; g < groups; g += 16) {
                const __mmask16 m = groups - g >= 16 ? 0xffff : (__mmask16)((1u << (groups - g)) - 1);
                _mm512_mask_storeu_ps(sf + r * groups + g, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, st + g)));
            }
#else
            for (int g = 0; g < groups; g++) sf[r * groups + g] = half_float(st[g]);
#endif
        }
        for (int t0 = 0; t0 < T; t0 += Q8_TOKENS) {
            const int tb = T - t0 < Q8_TOKENS ? T - t0 : Q8_TOKENS;
            if (rows == Q4_ROWS) {
                switch (tb) {
                case 1: q4x8_tokens(codes, sf, offsets, q, y, Q4_ROWS, 1, t0, out, in, r0); break;
                case 2: q4x8_tokens(codes, sf, offsets, q, y, Q4_ROWS, 2, t0, out, in, r0); break;
                case 3: q4x8_tokens(codes, sf, offsets, q, y, Q4_ROWS, 3, t0, out, in, r0); break;
                default: q4x8_tokens(codes, sf, offsets, q, y, Q4_ROWS, Q8_TOKENS, t0, out, in, r0); break;
                }
            } else {
                q4x8_tokens(codes, sf, offsets, q, y, rows, tb, t0, out, in, r0);
            }
        }
    }
}
#endif

static void gemm(const float *W, const float *x, float *y, int T, int out, int in, int transposed,
                 float *partial);

#if !defined(Q4_INT)
typedef struct { int unused; } Q8X;
#endif

/* One projection of the layer's table `w` (W_Q ... W_D) in the given layout; `q8`: x quantized
 * (`q8x_rows`), or NULL. */
static void project(const float *const *w, int which, const float *x, float *y, int T, int out, int in, int layout,
                    float *partial, const Q8X *q8) {
#if defined(Q4_INT)
    if (q8 != NULL) {
        gemm_q4x8((const uint8_t *)w[which], (const uint16_t *)w[W_STEPS + which], (const uint16_t *)w[W_OFFSETS + which],
                  *q8, y, T, out, in);
        return;
    }
#else
    (void)q8;
#endif
    if (layout == LAYOUT_Q4)
        gemm_q4((const uint8_t *)w[which], (const uint16_t *)w[W_STEPS + which], (const uint16_t *)w[W_OFFSETS + which],
                x, y, T, out, in);
    else
        gemm(w[which], x, y, T, out, in, layout == LAYOUT_TRANSPOSED, partial);
}

/* y[t] = W x[t] for T tokens, W [out, in] stored row by row (transposed == 0) or as W^T [in, out]
 * rows; x is [T, in], y [T, out]. `partial`: [threads, T, out] floats for the transposed layout. */
static void gemm(const float *W, const float *x, float *y, int T, int out, int in, int transposed,
                 float *partial) {
    if (!transposed) {
#pragma omp for schedule(static)
        for (int r = 0; r < out; r++) {
            const float *w = W + (int64_t)r * in;
            for (int t = 0; t < T; t++) {
                const float *xt = x + (int64_t)t * in;
                float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
                for (int i = 0; i < in; i++) acc += w[i] * xt[i];
                y[(int64_t)t * out + r] = acc;
            }
        }
        return;
    }
    /* Each thread streams a contiguous share of W^T's rows into its own partial sums, then the
     * partial sums are added up. */
    int threads = omp_get_num_threads(), me = omp_get_thread_num();
    int share = (in + threads - 1) / threads;
    int lo = me * share, hi = lo + share < in ? lo + share : in;
    float *mine = threads == 1 ? y : partial + (int64_t)me * T * out;
    for (int64_t o = 0; o < (int64_t)T * out; o++) mine[o] = 0.0f;
    int i = lo;
    if (T == 1) { /* decoding: eight rows per pass, an eighth of the partial sums' traffic */
        for (; i + 8 <= hi; i += 8) {
            const float *w0 = W + (int64_t)i * out, *w1 = w0 + out, *w2 = w1 + out, *w3 = w2 + out;
            const float *w4 = w3 + out, *w5 = w4 + out, *w6 = w5 + out, *w7 = w6 + out;
            const float *xi = x + i;
            const float x0 = xi[0], x1 = xi[1], x2 = xi[2], x3 = xi[3];
            const float x4 = xi[4], x5 = xi[5], x6 = xi[6], x7 = xi[7];
#pragma omp simd
            for (int o = 0; o < out; o++)
                mine[o] += (x0 * w0[o] + x1 * w1[o] + x2 * w2[o] + x3 * w3[o]) +
                           (x4 * w4[o] + x5 * w5[o] + x6 * w6[o] + x7 * w7[o]);
        }
    }
    for (; i + 4 <= hi; i += 4) { /* four rows per pass: a quarter of the partial sums' traffic */
        const float *w0 = W + (int64_t)i * out, *w1 = w0 + out, *w2 = w1 + out, *w3 = w2 + out;
        int t = 0;
        for (; t + 2 <= T; t += 2) { /* two tokens share each weight load */
            const float *xa = x + (int64_t)t * in + i, *xb = xa + in;
            const float a0 = xa[0], a1 = xa[1], a2 = xa[2], a3 = xa[3];
            const float b0 = xb[0], b1 = xb[1], b2 = xb[2], b3 = xb[3];
            float *ya = mine + (int64_t)t * out, *yb = ya + out;
#pragma omp simd
            for (int o = 0; o < out; o++) {
                const float v0 = w0[o], v1 = w1[o], v2 = w2[o], v3 = w3[o];
                ya[o] += a0 * v0 + a1 * v1 + a2 * v2 + a3 * v3;
                yb[o] += b0 * v0 + b1 * v1 + b2 * v2 + b3 * v3;
            }
        }
        for (; t < T; t++) {
            const float *xt = x + (int64_t)t * in + i;
            const float x0 = xt[0], x1 = xt[1], x2 = xt[2], x3 = xt[3];
            float *yt = mine + (int64_t)t * out;
#pragma omp simd
            for (int o = 0; o < out; o++) yt[o] += x0 * w0[o] + x1 * w1[o] + x2 * w2[o] + x3 * w3[o];
        }
    }
    for (; i < hi; i++) {
        const float *w = W + (int64_t)i * out;
        for (int t = 0; t < T; t++) {
            const float xi = x[(int64_t)t * in + i];
            float *yt = mine + (int64_t)t * out;
#pragma omp simd
            for (int o = 0; o < out; o++) yt[o] += xi * w[o];
        }
    }
    if (threads == 1) return;
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t o = 0; o < (int64_t)T * out; o++) {
        float sum = 0.0f;
        for (int t = 0; t < threads; t++) sum += partial[(int64_t)t * T * out + o];
        y[o] = sum;
    }
}

static void rms_norm(const float *x, const float *weight, float *y, int n, float eps) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += x[i] * x[i];
    float scale = 1.0f / sqrtf(sum / n + eps);
    for (int i = 0; i < n; i++) y[i] = weight[i] * (x[i] * scale);
}

/* rotate-half RoPE in place: x * cos + cat(-x[half:], x[:half]) * sin. */
static void rope(float *x, const float *cos, const float *sin, int head_dim) {
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/* Causal attention for several tokens: every query of one kv head (T tokens x its query heads)
 * sits in the lanes of NQ = QL / VL vectors, so each key and value element is loaded once for all
 * of them and the softmax runs across lanes. Positions are cut into chunks of ATT_CHUNK (the last
 * chunk also holding the T new positions), one job each; a job leaves the chunk's maxima m,
 * sums of exponentials l and unnormalized outputs o per query, which `merge_chunks` combines. */
#ifndef ATT_CHUNK
#define ATT_CHUNK 256
#endif
#define PB 8 /* positions per pass: PB accumulators */

/* qT [head_dim][QL]: the queries, scaled, lane j = token j / groups, query head j % groups.
 * S: [(p1 - p0)][QL] scratch. part: m [QL], l [QL], o [head_dim][QL]. */
#if defined(__AVX512F__)
#define QB 3 /* query vectors per pass: QB x PB accumulators */
#else
#define QB 1
#endif

/* `attend_chunk` for the nv (<= QB) query vectors from lane0: each key or value element, loaded
 * once, feeds all of them. */
static inline __attribute__((always_inline)) void attend_lanes(const float *qT, int QL, int lane0, int nv,
                                                              const float *kbase, const float *vbase,
                                                              int head_dim, int p0, int p1, int pos, int groups,
                                                              float *S, float *part) {
    float *m = part, *l = part + QL, *o = part + 2 * QL;
    vf limit[QB], top[QB]; /* the last position each lane's token may see; the lanes' maxima */
    for (int v = 0; v < nv; v++) {
        for (int j = 0; j < VL; j++) limit[v][j] = (float)(pos + (lane0 + v * VL + j) / groups);
        top[v] = vsplat(-INFINITY);
    }
    for (int p = p0; p < p1; p += PB) {
        const int count = p1 - p < PB ? p1 - p : PB;
        vf acc[QB][PB];
        for (int v = 0; v < nv; v++)
            for (int i = 0; i < PB; i++) acc[v][i] = (vf){0};
        const float *kp = kbase + (int64_t)p * head_dim;
        for (int d = 0; d < head_dim; d++) {
            vf qd[QB];
            for (int v = 0; v < nv; v++) qd[v] = *(const vf *)(qT + (int64_t)d * QL + lane0 + v * VL);
            if (count == PB) {
                for (int i = 0; i < PB; i++) {
                    const float key = kp[(int64_t)i * head_dim + d];
                    for (int v = 0; v < nv; v++) acc[v][i] += key * qd[v];
                }
            } else {
                for (int i = 0; i < count; i++) {
                    const float key = kp[(int64_t)i * head_dim + d];
                    for (int v = 0; v < nv; v++) acc[v][i] += key * qd[v];
                }
            }
        }
        for (int i = 0; i < count; i++)
            for (int v = 0; v < nv; v++) {
                vf sc = acc[v][i];
                if (p + i > pos) sc = vselect(vsplat((float)(p + i)) <= limit[v], sc, vsplat(-INFINITY));
                *(vf *)(S + (int64_t)(p + i - p0) * QL + lane0 + v * VL) = sc;
                top[v] = vmax(top[v], sc);
            }
    }
    for (int v = 0; v < nv; v++) {
        vf total = (vf){0};
        for (int p = 0; p < p1 - p0; p++) {
            vf *sp = (vf *)(S + (int64_t)p * QL + lane0 + v * VL);
            const vf e = vexp(*sp - top[v]);
            *sp = e;
            total += e;
        }
        *(vf *)(m + lane0 + v * VL) = top[v];
        *(vf *)(l + lane0 + v * VL) = total;
    }
    for (int d0 = 0; d0 < head_dim; d0 += PB) {
        vf acc[QB][PB];
        for (int v = 0; v < nv; v++)
            for (int i = 0; i < PB; i++) acc[v][i] = (vf){0};
        for (int p = p0; p < p1; p++) {
            vf e[QB];
            for (int v = 0; v < nv; v++) e[v] = *(const vf *)(S + (int64_t)(p - p0) * QL + lane0 + v * VL);
            const float *vp = vbase + (int64_t)p * head_dim + d0;
            for (int i = 0; i < PB; i++) {
                const float value = vp[i];
                for (int v = 0; v < nv; v++) acc[v][i] += value * e[v];
            }
        }
        for (int v = 0; v < nv; v++)
            for (int i = 0; i < PB; i++) *(vf *)(o + (int64_t)(d0 + i) * QL + lane0 + v * VL) = acc[v][i];
    }
}

static void attend_chunk(const float *qT, int QL, const float *kbase, const float *vbase, int head_dim, int p0,
                         int p1, int pos, int groups, float *S, float *part) {
    for (int qv = 0; qv < QL / VL; qv += QB) {
        const int lane0 = qv * VL, nv = QL / VL - qv < QB ? QL / VL - qv : QB;
        switch (nv) { /* a constant count, so that the accumulators stay in registers */
#if QB >= 3
        case 3: attend_lanes(qT, QL, lane0, 3, kbase, vbase, head_dim, p0, p1, pos, groups, S, part); break;
#endif
#if QB >= 2
        case 2: attend_lanes(qT, QL, lane0, 2, kbase, vbase, head_dim, p0, p1, pos, groups, S, part); break;
#endif
        default: attend_lanes(qT, QL, lane0, 1, kbase, vbase, head_dim, p0, p1, pos, groups, S, part); break;
        }
    }
}

/* One query against VL keys at a time, without a horizontal sum per key: the VL keys' products
 * (vectors of VL partial sums, key i in slot REV[i], the bit reversal of i) are added up pairwise
 * across vectors, log2(VL) levels of shuffles, leaving key i's score in lane i. */
#if VL == 16
static const int REV[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

static inline vf reduce_keys(const vf *v) {
    const vi a1 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const vi b1 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    const vi a2 = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27};
    const vi b2 = {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31};
    const vi a3 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
    const vi b3 = {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31};
    const vi a4 = {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30};
    const vi b4 = {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31};
    vf t[8], u[4], w[2];
    for (int i = 0; i < 8; i++)
        t[i] = __builtin_shuffle(v[2 * i], v[2 * i + 1], a1) + __builtin_shuffle(v[2 * i], v[2 * i + 1], b1);
    for (int i = 0; i < 4; i++)
        u[i] = __builtin_shuffle(t[2 * i], t[2 * i + 1], a2) + __builtin_shuffle(t[2 * i], t[2 * i + 1], b2);
    for (int i = 0; i < 2; i++)
        w[i] = __builtin_shuffle(u[2 * i], u[2 * i + 1], a3) + __builtin_shuffle(u[2 * i], u[2 * i + 1], b3);
    return __builtin_shuffle(w[0], w[1], a4) + __builtin_shuffle(w[0], w[1], b4);
}
#elif VL == 8
static const int REV[8] = {0, 4, 2, 6, 1, 5, 3, 7};

static inline vf reduce_keys(const vf *v) {
    const vi a1 = {0, 1, 2, 3, 8, 9, 10, 11}, b1 = {4, 5, 6, 7, 12, 13, 14, 15};
    const vi a2 = {0, 1, 8, 9, 4, 5, 12, 13}, b2 = {2, 3, 10, 11, 6, 7, 14, 15};
    const vi a3 = {0, 8, 2, 10, 4, 12, 6, 14}, b3 = {1, 9, 3, 11, 5, 13, 7, 15};
    vf t[4], u[2];
    for (int i = 0; i < 4; i++)
        t[i] = __builtin_shuffle(v[2 * i], v[2 * i + 1], a1) + __builtin_shuffle(v[2 * i], v[2 * i + 1], b1);
    for (int i = 0; i < 2; i++)
        u[i] = __builtin_shuffle(t[2 * i], t[2 * i + 1], a2) + __builtin_shuffle(t[2 * i], t[2 * i + 1], b2);
    return __builtin_shuffle(u[0], u[1], a3) + __builtin_shuffle(u[0], u[1], b3);
}
#else
static const int REV[4] = {0, 2, 1, 3};

static inline vf reduce_keys(const vf *v) {
    const vi a1 = {0, 1, 4, 5}, b1 = {2, 3, 6, 7}, a2 = {0, 4, 2, 6}, b2 = {1, 5, 3, 7};
    const vf t0 = __builtin_shuffle(v[0], v[1], a1) + __builtin_shuffle(v[0], v[1], b1);
    const vf t1 = __builtin_shuffle(v[2], v[3], a1) + __builtin_shuffle(v[2], v[3], b1);
    return __builtin_shuffle(t0, t1, a2) + __builtin_shuffle(t0, t1, b2);
}
#endif

/* Causal attention for a few queries of one kv head (a decoding step: its query heads) over
 * positions [p0, p1): scores VL keys at a time (`reduce_keys`), each value row loaded once for all
 * the queries. Queries: lane j = token j / groups, query head j % groups; S: nq rows of
 * (p1 - p0 + 16) floats of scratch; part as for `attend_chunk`, lanes 0..nq-1. */
#define ROWS_QUERIES 8
static void attend_rows_chunk(const float *q, int qd, int kh, int groups, int nq, float scaling, const float *kbase,
                              const float *vbase, int head_dim, int p0, int p1, int pos, float *S, int QL,
                              float *part) {
    const int n = p1 - p0, stride = n + 16;
    float qs[ROWS_QUERIES * head_dim];
    for (int j = 0; j < nq; j++)
        for (int d = 0; d < head_dim; d++)
            qs[j * head_dim + d] = q[(int64_t)(j / groups) * qd + (kh * groups + j % groups) * head_dim + d] * scaling;
    int p = p0;
    for (; p + VL <= p1; p += VL)
        for (int j = 0; j < nq; j++) {
            vf products[VL];
            for (int i = 0; i < VL; i++) {
                const float *kp = kbase + (int64_t)(p + i) * head_dim;
                vf a = (vf){0};
                for (int d = 0; d < head_dim; d += VL) a += *(const vf *)(qs + j * head_dim + d) * *(const vf *)(kp + d);
                products[REV[i]] = a;
            }
            *(vf *)(S + (int64_t)j * stride + (p - p0)) = reduce_keys(products);
        }
    for (; p < p1; p++)
        for (int j = 0; j < nq; j++) {
            const float *kp = kbase + (int64_t)p * head_dim;
            vf a = (vf){0};
            for (int d = 0; d < head_dim; d += VL) a += *(const vf *)(qs + j * head_dim + d) * *(const vf *)(kp + d);
            S[(int64_t)j * stride + (p - p0)] = hsum(a);
        }
    float *m = part, *l = part + QL, *o = part + 2 * QL;
    for (int j = 0; j < nq; j++) {
        float *row = S + (int64_t)j * stride;
        for (int i = pos + j / groups + 1 - p0; i < n; i++) row[i] = -INFINITY; /* after its own token */
        float top = -INFINITY;
        for (int i = 0; i < n; i++) top = row[i] > top ? row[i] : top;
        m[j] = top;
        l[j] = exp_sum(row, n, top);
    }
    for (int d0 = 0; d0 < head_dim; d0 += VL) {
        vf acc[ROWS_QUERIES];
        for (int j = 0; j < nq; j++) acc[j] = (vf){0};
        for (int i = 0; i < n; i++) {
            const vf vp = *(const vf *)(vbase + (int64_t)(p0 + i) * head_dim + d0);
            for (int j = 0; j < nq; j++) acc[j] += S[(int64_t)j * stride + i] * vp;
        }
        for (int j = 0; j < nq; j++)
            for (int k = 0; k < VL; k++) o[(int64_t)(d0 + k) * QL + j] = acc[j][k];
    }
}

/* The chunks' partial results of one query lane, combined into its attention output. */
static void merge_chunks(const float *parts, int chunks, int QL, int head_dim, int lane, float *out) {
    const int64_t stride = (int64_t)(2 + head_dim) * QL;
    float top = -INFINITY;
    for (int c = 0; c < chunks; c++) top = parts[c * stride + lane] > top ? parts[c * stride + lane] : top;
    float total = 0.0f;
    for (int i = 0; i < head_dim; i++) out[i] = 0.0f;
    for (int c = 0; c < chunks; c++) {
        const float *part = parts + c * stride;
        const float weight = expf(part[lane] - top);
        total += weight * part[QL + lane];
        for (int i = 0; i < head_dim; i++) out[i] += weight * part[(int64_t)(2 + i) * QL + lane];
    }
    for (int i = 0; i < head_dim; i++) out[i] /= total;
}

/* Floats of the attention's scratch for T tokens: per-head scores, or the lane layout's queries,
 * chunk results and per-thread score blocks. */
/* Floats of one thread's score block: a chunk (up to ATT_CHUNK + T - 1 positions) for nq queries,
 * in QL lanes or in rows padded by 16. */
static int64_t attention_block(int T, int nq, int QL) {
    const int64_t lanes = (int64_t)(ATT_CHUNK + T) * QL, rows = (int64_t)nq * (ATT_CHUNK + T + 16);
    return lanes > rows ? lanes : rows;
}

static int64_t attention_scratch(int T, int heads, int kv_heads, int head_dim, int capacity, int threads) {
    const int nq = T * (heads / kv_heads), QL = (nq + VL - 1) / VL * VL;
    const int64_t chunks = (capacity + ATT_CHUNK - 1) / ATT_CHUNK;
    const int64_t lanes = kv_heads * (int64_t)QL * ((int64_t)head_dim + chunks * (2 + head_dim)) +
                          (int64_t)threads * attention_block(T, nq, QL);
    const int64_t per_head = (int64_t)T * heads * capacity;
    return (lanes > per_head ? lanes : per_head) + VL;
}

/* Several tokens go through the lane layout from this many queries per kv head. */
#ifndef LANES_FROM
#define LANES_FROM 6
#endif
_Static_assert(LANES_FROM - 1 <= ROWS_QUERIES, "attend_rows_chunk holds at most ROWS_QUERIES queries");

/* Runs T tokens at positions pos..pos+T-1 through every layer: `h` [T, hidden] holds their
 * embeddings on entry and the last layer's outputs on exit. keys/values: [layers, kv_heads,
 * capacity, head_dim], these positions' entries written; token t attends to positions
 * 0..pos+t. cos/sin: [positions, head_dim] tables. scratch: at least squid_decode_scratch(...)
 * floats. layout: LAYOUT_ROWS or LAYOUT_TRANSPOSED float32 weights, or LAYOUT_Q4 codes with their
 * steps and offsets in the table (LAYOUT_Q4 | LAYOUT_INTEGER: in integer products where the CPU has
 * them). Returns 0, or -1 for arguments it cannot run. */
int squid_decode_step(const int64_t *weights, int layers, int hidden, int inter, int heads, int kv_heads,
                      int head_dim, float eps, float scaling, int layout, float *h, int T,
                      const float *cos, const float *sin, float *keys, float *values, int capacity, int pos,
                      float *scratch, int threads) {
    const int integer = layout == (LAYOUT_Q4 | LAYOUT_INTEGER);
    if (integer) layout = LAYOUT_Q4;
    if (T < 1 || pos < 0 || pos + T > capacity || heads % kv_heads || head_dim % 2 || threads < 1) return -1;
    if (layout == LAYOUT_Q4 && (hidden % 32 || inter % 32 || (heads * head_dim) % 32 || (kv_heads * head_dim) % 32))
        return -1;
    const int qd = heads * head_dim, kd = kv_heads * head_dim, groups = heads / kv_heads;
    float *x = scratch, *q = x + (int64_t)T * hidden, *k = q + (int64_t)T * qd, *v = k + (int64_t)T * kd;
    float *att = v + (int64_t)T * kd, *o = att + (int64_t)T * qd, *g = o + (int64_t)T * hidden;
    float *u = g + (int64_t)T * inter, *scores = u + (int64_t)T * inter; /* attention_scratch(...) */
    float *partial = scores + attention_scratch(T, heads, kv_heads, head_dim, capacity, threads);
#if defined(Q4_INT)
    int64_t widest = hidden > inter ? hidden : inter;
    widest = widest > qd ? widest : qd;
    /* 4-bit weights meet integer activations where every input width allows it */
    Q8X q8s, *q8 = NULL;
    if (integer && q8x_ok(hidden) && q8x_ok(inter) && q8x_ok(qd)) {
        q8s = q8x_at(partial + (int64_t)threads * T * widest, T, (int)widest);
        q8 = &q8s;
    }
#define QUANTIZE(x, in) do { if (q8 != NULL) q8x_rows(x, *q8, T, in); } while (0)
#else
    (void)integer;
    const Q8X *q8 = NULL;
#define QUANTIZE(x, in) do { } while (0)
#endif

#pragma omp parallel num_threads(threads)
    for (int l = 0; l < layers; l++) {
        const float *const *w = (const float *const *)(weights + (int64_t)l * W_COUNT);
        float *layer_keys = keys + (int64_t)l * kv_heads * capacity * head_dim;
        float *layer_values = values + (int64_t)l * kv_heads * capacity * head_dim;
#pragma omp for schedule(static)
        for (int t = 0; t < T; t++)
            rms_norm(h + (int64_t)t * hidden, w[W_N1], x + (int64_t)t * hidden, hidden, eps);
        QUANTIZE(x, hidden);
        project(w, W_Q, x, q, T, qd, hidden, layout, partial, q8);
        project(w, W_K, x, k, T, kd, hidden, layout, partial, q8);
        project(w, W_V, x, v, T, kd, hidden, layout, partial, q8);
#pragma omp for schedule(static)
        for (int t = 0; t < T; t++) {
            const float *c = cos + (int64_t)(pos + t) * head_dim, *s = sin + (int64_t)(pos + t) * head_dim;
            for (int hh = 0; hh < heads; hh++) rope(q + (int64_t)t * qd + hh * head_dim, c, s, head_dim);
            for (int kh = 0; kh < kv_heads; kh++) {
                float *kt = k + (int64_t)t * kd + kh * head_dim, *vt = v + (int64_t)t * kd + kh * head_dim;
                rope(kt, c, s, head_dim);
                float *kdst = layer_keys + ((int64_t)kh * capacity + pos + t) * head_dim;
                float *vdst = layer_values + ((int64_t)kh * capacity + pos + t) * head_dim;
                for (int i = 0; i < head_dim; i++) {
                    kdst[i] = kt[i];
                    vdst[i] = vt[i];
                }
            }
        }
        if (head_dim % 16 == 0) {
            /* In chunks of positions, one job per kv head and chunk, then merged: many queries in
             * vector lanes (`attend_chunk`), a few 16 keys at a time (`attend_rows_chunk`). */
            const int nq = T * groups, lanes = nq >= LANES_FROM;
            const int QL = (nq + VL - 1) / VL * VL, chunks = (pos + ATT_CHUNK) / ATT_CHUNK;
            float *qT = scores, *parts = qT + (int64_t)kv_heads * head_dim * QL;
            float *blocks = parts + (int64_t)kv_heads * chunks * (2 + head_dim) * QL;
            if (lanes) {
#pragma omp for schedule(static)
                for (int kh = 0; kh < kv_heads; kh++)
                    for (int d = 0; d < head_dim; d++)
                        for (int j = 0; j < QL; j++)
                            qT[((int64_t)kh * head_dim + d) * QL + j] =
                                j < nq ? q[(int64_t)(j / groups) * qd + (kh * groups + j % groups) * head_dim + d] *
                                             scaling
                                       : 0.0f;
            }
#pragma omp for schedule(dynamic, 1)
            for (int job = 0; job < kv_heads * chunks; job++) {
                const int kh = job / chunks, c = job % chunks;
                const int p0 = c * ATT_CHUNK, p1 = c == chunks - 1 ? pos + T : p0 + ATT_CHUNK;
                const float *kbase = layer_keys + (int64_t)kh * capacity * head_dim;
                const float *vbase = layer_values + (int64_t)kh * capacity * head_dim;
                float *block = blocks + (int64_t)omp_get_thread_num() * attention_block(T, nq, QL);
                float *part = parts + (int64_t)job * (2 + head_dim) * QL;
                if (lanes)
                    attend_chunk(qT + (int64_t)kh * head_dim * QL, QL, kbase, vbase, head_dim, p0, p1, pos, groups,
                                 block, part);
                else
                    attend_rows_chunk(q, qd, kh, groups, nq, scaling, kbase, vbase, head_dim, p0, p1, pos, block, QL,
                                      part);
            }
#pragma omp for schedule(static)
            for (int job = 0; job < kv_heads * nq; job++) {
                const int kh = job / nq, lane = job % nq;
                merge_chunks(parts + (int64_t)kh * chunks * (2 + head_dim) * QL, chunks, QL, head_dim, lane,
                             att + (int64_t)(lane / groups) * qd + (kh * groups + lane % groups) * head_dim);
            }
        } else {
#pragma omp for schedule(dynamic, 1)
            for (int job = 0; job < T * heads; job++) {
                const int t = job / heads, hh = job % heads, n = pos + t + 1;
                const float *qh = q + (int64_t)t * qd + hh * head_dim;
                const float *kbase = layer_keys + (int64_t)(hh / groups) * capacity * head_dim;
                const float *vbase = layer_values + (int64_t)(hh / groups) * capacity * head_dim;
                float *sc = scores + (int64_t)job * capacity, top = -INFINITY;
                for (int p = 0; p < n; p++) {
                    const float *kp = kbase + (int64_t)p * head_dim;
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int i = 0; i < head_dim; i++) dot += qh[i] * kp[i];
                    sc[p] = dot * scaling;
                    top = sc[p] > top ? sc[p] : top;
                }
                const float total = exp_sum(sc, n, top);
                float *out = att + (int64_t)t * qd + hh * head_dim;
                for (int i = 0; i < head_dim; i++) out[i] = 0.0f;
                for (int p = 0; p < n; p++) {
                    const float weight = sc[p] / total, *vp = vbase + (int64_t)p * head_dim;
#pragma omp simd
                    for (int i = 0; i < head_dim; i++) out[i] += weight * vp[i];
                }
            }
        }
        QUANTIZE(att, qd);
        project(w, W_O, att, o, T, hidden, qd, layout, partial, q8);
#pragma omp for schedule(static)
        for (int t = 0; t < T; t++) {
            float *ht = h + (int64_t)t * hidden;
            const float *ot = o + (int64_t)t * hidden;
            for (int i = 0; i < hidden; i++) ht[i] += ot[i];
            rms_norm(ht, w[W_N2], x + (int64_t)t * hidden, hidden, eps);
        }
        QUANTIZE(x, hidden);
        project(w, W_G, x, g, T, inter, hidden, layout, partial, q8);
        project(w, W_U, x, u, T, inter, hidden, layout, partial, q8);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < (int64_t)T * inter; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        QUANTIZE(g, inter);
        project(w, W_D, g, o, T, hidden, inter, layout, partial, q8);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < (int64_t)T * hidden; i++) h[i] += o[i];
    }
#undef QUANTIZE
    return 0;
}

/* The bits a 4-bit step keeps of each activation: 15 where it multiplies in integers (`gemm_q4x8`),
 * 0 where it multiplies in float32. */
int squid_q4_activation_bits(void) {
#if defined(Q4_INT)
    return 15;
#else
    return 0;
#endif
}

/* The instructions a 4-bit step's integer products run in ("" where it multiplies in float32). */
const char *squid_q4_integer_products(void) {
#if Q4_INT == 512
    return "AVX-512 VNNI";
#elif defined(Q4_INT)
    return "AVX2";
#else
    return "";
#endif
}

/* Floats of scratch space squid_decode_step needs for T tokens. */
int64_t squid_decode_scratch(int T, int hidden, int inter, int heads, int kv_heads, int head_dim, int capacity,
                             int threads) {
    int64_t widest = hidden > inter ? hidden : inter;
    widest = widest > (int64_t)heads * head_dim ? widest : (int64_t)heads * head_dim;
    return (int64_t)T * (2 * (int64_t)hidden + 2 * (int64_t)heads * head_dim + 2 * (int64_t)kv_heads * head_dim +
                         2 * (int64_t)inter + (int64_t)threads * widest) +
           attention_scratch(T, heads, kv_heads, head_dim, capacity, threads)
#if defined(Q4_INT)
           + q8x_floats(T, (int)widest)
#endif
        ;
}

/* The output projection, logits [T, vocab] = x [T, hidden] W^T, from 8-bit weights in groups of 32
 * inputs: w = step * q with q in -127..127, the GGUF Q8_0 scheme of the embedded model's token
 * embeddings, which its output projection shares (step * q is exact in float32, so these give back
 * its float32 weights). codes [vocab][hidden] int8, steps [vocab][hidden / 32]. Half the bytes of
 * a bfloat16 copy, and every logit exact. Returns 0, or -1 for arguments it cannot run. */
static inline void q8_codes(const int8_t *c, vf v[GV]) {
#if defined(__AVX512F__)
    v[0] = (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)c)));
    v[1] = (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(c + 16))));
#elif defined(__AVX2__)
    for (int k = 0; k < 4; k++)
        v[k] = (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(c + 8 * k))));
#else
    for (int j = 0; j < 32; j++) v[j / VL][j % VL] = (float)c[j];
#endif
}

int squid_head_q8(const int8_t *codes, const uint16_t *steps, const float *x, float *logits, int T, int vocab,
                  int hidden, int threads) {
    if (T < 1 || hidden % 32 || threads < 1) return -1;
    const int groups = hidden / 32;
    if (T == 1) {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int r = 0; r < vocab; r++) {
            const int8_t *c = codes + (int64_t)r * hidden;
            const uint16_t *st = steps + (int64_t)r * groups;
            vf acc = (vf){0};
            for (int gi = 0; gi < groups; gi++) {
                vf v[GV];
                q8_codes(c + gi * 32, v);
                vf dot = v[0] * *(const vf *)(x + gi * 32);
                for (int k = 1; k < GV; k++) dot += v[k] * *(const vf *)(x + gi * 32 + k * VL);
                acc += half_float(st[gi]) * dot;
            }
            logits[r] = hsum(acc);
        }
        return 0;
    }
    /* Several rows: Q4_ROWS vocabulary rows at a time expanded to float32, then every token. */
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int r0 = 0; r0 < vocab; r0 += Q4_ROWS) {
        const int rows = vocab - r0 < Q4_ROWS ? vocab - r0 : Q4_ROWS;
        float w[Q4_ROWS][hidden];
        for (int r = 0; r < rows; r++) {
            const int8_t *c = codes + (int64_t)(r0 + r) * hidden;
            const uint16_t *st = steps + (int64_t)(r0 + r) * groups;
            for (int gi = 0; gi < groups; gi++) {
                vf v[GV];
                q8_codes(c + gi * 32, v);
                const float step = half_float(st[gi]);
                for (int k = 0; k < GV; k++) *(vf *)(w[r] + gi * 32 + k * VL) = v[k] * step;
            }
        }
        rows_all_tokens(w[0], x, logits, rows, T, vocab, hidden, r0);
    }
    return 0;
}
