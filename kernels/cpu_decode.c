/* One decoding step of a Llama-style decoder on the CPU, float32, one token, all layers.
 *
 * The lean engine's single-token step spends about half its time in the framework: some forty
 * small tensor operations per layer, each dispatched from Python. This runs a whole step in one
 * call and one OpenMP parallel region: every matrix-vector product is split over the threads
 * (rows, or column blocks for weights kept in transposed memory), and the small operations
 * (RMSNorm, RoPE, softmax, SiLU) run between barriers. Weights and the KV cache are the caller's
 * tensors, read and written in place; nothing is allocated here.
 *
 * Built at run time by kernels/cpu_decode.py (cc -O3 -march=native -fopenmp); the process's
 * OpenMP runtime is torch's own (same soname), so the two share one thread pool.
 */
#include <math.h>
#include <stdint.h>

#include <omp.h>

enum { W_N1, W_Q, W_K, W_V, W_O, W_N2, W_G, W_U, W_D, W_COUNT };

/* y = W x for W [out, in]: stored row by row (transposed == 0) or as W^T [in, out] rows. */
static void gemv(const float *W, const float *x, float *y, int out, int in, int transposed,
                 float *partial) {
    if (!transposed) {
#pragma omp for schedule(static)
        for (int r = 0; r < out; r++) {
            const float *w = W + (int64_t)r * in;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int i = 0; i < in; i++) acc += w[i] * x[i];
            y[r] = acc;
        }
        return;
    }
    /* Each thread streams a contiguous share of W^T's rows into its own partial sums (`partial`,
     * [threads, out]), then the partial sums are added up. */
    int threads = omp_get_num_threads(), me = omp_get_thread_num();
    int share = (in + threads - 1) / threads;
    int lo = me * share, hi = lo + share < in ? lo + share : in;
    float *mine = threads == 1 ? y : partial + (int64_t)me * out;
    for (int o = 0; o < out; o++) mine[o] = 0.0f;
    int i = lo;
    for (; i + 4 <= hi; i += 4) { /* four rows per pass: a quarter of the partial sums' traffic */
        const float x0 = x[i], x1 = x[i + 1], x2 = x[i + 2], x3 = x[i + 3];
        const float *w0 = W + (int64_t)i * out, *w1 = w0 + out, *w2 = w1 + out, *w3 = w2 + out;
#pragma omp simd
        for (int o = 0; o < out; o++) mine[o] += x0 * w0[o] + x1 * w1[o] + x2 * w2[o] + x3 * w3[o];
    }
    for (; i < hi; i++) {
        const float xi = x[i];
        const float *w = W + (int64_t)i * out;
#pragma omp simd
        for (int o = 0; o < out; o++) mine[o] += xi * w[o];
    }
    if (threads == 1) return;
#pragma omp barrier
#pragma omp for schedule(static)
    for (int o = 0; o < out; o++) {
        float sum = 0.0f;
        for (int t = 0; t < threads; t++) sum += partial[(int64_t)t * out + o];
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

/* Runs token position `pos` through every layer: `h` [hidden] is the token's embedding on entry
 * and the last layer's output on exit. keys/values: [layers, kv_heads, capacity, head_dim], this
 * position's entries written. cos/sin: [positions, head_dim] tables. scratch: at least
 * squid_decode_scratch(...) floats. Returns 0, or -1 for arguments it cannot run. */
int squid_decode_step(const int64_t *weights, int layers, int hidden, int inter, int heads, int kv_heads,
                      int head_dim, float eps, float scaling, int transposed, float *h, const float *cos,
                      const float *sin, float *keys, float *values, int capacity, int pos, float *scratch,
                      int threads) {
    if (pos < 0 || pos >= capacity || heads % kv_heads || head_dim % 2 || threads < 1) return -1;
    const int qd = heads * head_dim, kd = kv_heads * head_dim, groups = heads / kv_heads;
    const int n = pos + 1;
    float *x = scratch, *q = x + hidden, *k = q + qd, *v = k + kd, *att = v + kd, *o = att + qd;
    float *g = o + hidden, *u = g + inter, *scores = u + inter; /* scores: [heads, capacity] */
    float *partial = scores + (int64_t)heads * capacity; /* [threads, widest output] */
    const float *c = cos + (int64_t)pos * head_dim, *s = sin + (int64_t)pos * head_dim;

#pragma omp parallel num_threads(threads)
    for (int l = 0; l < layers; l++) {
        const float *const *w = (const float *const *)(weights + (int64_t)l * W_COUNT);
        float *layer_keys = keys + (int64_t)l * kv_heads * capacity * head_dim;
        float *layer_values = values + (int64_t)l * kv_heads * capacity * head_dim;
#pragma omp single
        rms_norm(h, w[W_N1], x, hidden, eps);
        gemv(w[W_Q], x, q, qd, hidden, transposed, partial);
        gemv(w[W_K], x, k, kd, hidden, transposed, partial);
        gemv(w[W_V], x, v, kd, hidden, transposed, partial);
#pragma omp single
        {
            for (int hh = 0; hh < heads; hh++) rope(q + hh * head_dim, c, s, head_dim);
            for (int kh = 0; kh < kv_heads; kh++) {
                rope(k + kh * head_dim, c, s, head_dim);
                float *kdst = layer_keys + ((int64_t)kh * capacity + pos) * head_dim;
                float *vdst = layer_values + ((int64_t)kh * capacity + pos) * head_dim;
                for (int i = 0; i < head_dim; i++) {
                    kdst[i] = k[kh * head_dim + i];
                    vdst[i] = v[kh * head_dim + i];
                }
            }
        }
#pragma omp for schedule(static)
        for (int hh = 0; hh < heads; hh++) {
            const float *qh = q + hh * head_dim;
            const float *kbase = layer_keys + (int64_t)(hh / groups) * capacity * head_dim;
            const float *vbase = layer_values + (int64_t)(hh / groups) * capacity * head_dim;
            float *sc = scores + (int64_t)hh * capacity, top = -INFINITY;
            for (int t = 0; t < n; t++) {
                const float *kt = kbase + (int64_t)t * head_dim;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int i = 0; i < head_dim; i++) dot += qh[i] * kt[i];
                sc[t] = dot * scaling;
                top = sc[t] > top ? sc[t] : top;
            }
            float total = 0.0f;
            for (int t = 0; t < n; t++) {
                sc[t] = expf(sc[t] - top);
                total += sc[t];
            }
            float *out = att + hh * head_dim;
            for (int i = 0; i < head_dim; i++) out[i] = 0.0f;
            for (int t = 0; t < n; t++) {
                const float p = sc[t] / total, *vt = vbase + (int64_t)t * head_dim;
#pragma omp simd
                for (int i = 0; i < head_dim; i++) out[i] += p * vt[i];
            }
        }
        gemv(w[W_O], att, o, hidden, qd, transposed, partial);
#pragma omp single
        {
            for (int i = 0; i < hidden; i++) h[i] += o[i];
            rms_norm(h, w[W_N2], x, hidden, eps);
        }
        gemv(w[W_G], x, g, inter, hidden, transposed, partial);
        gemv(w[W_U], x, u, inter, hidden, transposed, partial);
#pragma omp for schedule(static)
        for (int i = 0; i < inter; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        gemv(w[W_D], g, o, hidden, inter, transposed, partial);
#pragma omp single
        for (int i = 0; i < hidden; i++) h[i] += o[i];
    }
    return 0;
}

/* Floats of scratch space squid_decode_step needs. */
int64_t squid_decode_scratch(int hidden, int inter, int heads, int kv_heads, int head_dim, int capacity,
                             int threads) {
    int64_t widest = hidden > inter ? hidden : inter;
    widest = widest > (int64_t)heads * head_dim ? widest : (int64_t)heads * head_dim;
    return 2 * (int64_t)hidden + 2 * (int64_t)heads * head_dim + 2 * (int64_t)kv_heads * head_dim +
           2 * (int64_t)inter + (int64_t)heads * capacity + (int64_t)threads * widest;
}
