/* The LSTM and GRU recurrences of npurun's cpu backend (npurun/backends/cpu/ops/recurrent.py), float32,
 * ONNX's default activations (sigmoid for i, o, f; tanh for the cell and the output), no clip,
 * no peepholes, no input_forget: everything else stays on the NumPy path.
 *
 * The input projections of all steps (x @ W^T + Wb + Rb) are one BLAS product done by the
 * caller; this runs what is left, step by step: g = proj[t] + h @ R^T, then
 *     i, o, f = sigmoid(g[0:H]), sigmoid(g[H:2H]), sigmoid(g[2H:3H]);  c~ = tanh(g[3H:4H])
 *     c = f * c + i * c~;   h = o * tanh(c)
 * Why C: silero-vad runs one 128-wide step per 512-sample chunk, and the NumPy form of that
 * step is ~10 calls (~25 us warm, several times that after the 30 ms idle of a streaming
 * caller); here it is one call. h @ R^T reads R^T as panels of 8 columns (vecmat). */
#define _POSIX_C_SOURCE 200809L  /* clock_gettime (par.h) under -std=c11 */
#include <stdlib.h>
#include <string.h>
#include "act.h"

#define SLAB 64  /* gate columns per accumulator block: 8 ymm */

/* out[j0:j1] = (init ? init[j] : 0) + sum_k h[k] * R^T[k, j]: a vector-matrix product over
 * columns [j0, j1) of R^T (H rows), j0 and j1 - j0 multiples of 8, with R^T stored as panels of
 * 8 columns (rtp: (G / 8, H, 8), rtp[p][k][c] = R[8p + c][k]: ops/recurrent.py _panels), in slabs of SLAB columns: 8 accumulators,
 * so each h[k] broadcast feeds 8 FMAs, each reading its own panel front to back. (R^T row-major
 * read a slab as H rows of 256 bytes 16 KB apart at H = 512: a new page every row or two, and
 * 1.32x ONNX Runtime's LSTM time on ddddocr's 512-wide layer, 1.08x as panels: 8 sequential
 * streams; bench/recurrent.py.) */
static void vecmat(const float *init, const float *h, const float *rtp, int H, int j0, int j1, float *out)
{
    const __m256 zero = _mm256_setzero_ps();
    for (int j = j0; j < j1; j += SLAB) {
        int w = j1 - j < SLAB ? j1 - j : SLAB, nv = w / 8;
        __m256 acc[8];
        for (int v = 0; v < 8; v++) acc[v] = v < nv ? (init ? _mm256_loadu_ps(init + j + 8 * v) : zero) : zero;
        const float *r = rtp + (long)(j / 8) * H * 8;  /* panel v of the slab: r + v * H * 8 */
        const long ps = (long)H * 8;
        if (nv == 8) {  /* a full slab: the constant bound lets gcc keep all 8 in registers */
            for (int k = 0; k < H; k++, r += 8) {
                __m256 hk = _mm256_broadcast_ss(h + k);
                for (int v = 0; v < 8; v++) acc[v] = _mm256_fmadd_ps(hk, _mm256_loadu_ps(r + v * ps), acc[v]);
            }
        } else {
            for (int k = 0; k < H; k++, r += 8) {
                __m256 hk = _mm256_broadcast_ss(h + k);
                for (int v = 0; v < nv; v++) acc[v] = _mm256_fmadd_ps(hk, _mm256_loadu_ps(r + v * ps), acc[v]);
            }
        }
        for (int v = 0; v < nv; v++) _mm256_storeu_ps(out + j + 8 * v, acc[v]);
    }
}

/* One direction over steps [s0, s1) of S, for a batch of B. proj (S, B, 4H); rt = R^T (H, 4H) as
 * panels (vecmat);
 * h, c (B, H) the states, overwritten with the ones after step s1 - 1; y: step t's h goes to
 * y + t * ys (B rows of H, row pitch H). reverse: step s is time S-1-s. 4H must be a multiple of
 * 8. Steps [0, S) in one call or in ranges one after the other (pieces of the node, issue L)
 * compute the same: the state is carried in h and c. */
int npr_lstm_f32(const float *proj, const float *rt, float *h, float *c, float *y, long ys,
                 int S, int B, int H, int reverse, int s0, int s1)
{
    const int G = 4 * H;
    if (G % 8) return -2;
    float *g = aligned_alloc(32, sizeof(float) * (size_t)((G + 7) & ~7));
    if (!g) return -1;
    for (int s = s0; s < s1; s++) {
        int t = reverse ? S - 1 - s : s;
        for (int b = 0; b < B; b++) {
            const float *p = proj + ((long)t * B + b) * G;
            float *hb = h + (long)b * H, *cb = c + (long)b * H;
            vecmat(p, hb, rt, H, 0, G, g);
            /* the gates of all H units are in g: now the state may change */
            int k = 0;
            for (; k + 8 <= H; k += 8) {
                __m256 i = npr_sigmoid(_mm256_load_ps(g + k)), o = npr_sigmoid(_mm256_loadu_ps(g + H + k));
                __m256 f = npr_sigmoid(_mm256_loadu_ps(g + 2 * H + k)), cc = npr_tanh(_mm256_loadu_ps(g + 3 * H + k));
                __m256 cn = _mm256_fmadd_ps(f, _mm256_loadu_ps(cb + k), _mm256_mul_ps(i, cc));
                _mm256_storeu_ps(cb + k, cn);
                _mm256_storeu_ps(hb + k, _mm256_mul_ps(o, npr_tanh(cn)));
            }
            if (k < H) {  /* a ragged tail of H: the same through 8-float buffers */
                float ti[8] = {0}, to[8] = {0}, tf[8] = {0}, tc[8] = {0}, tcs[8] = {0}, th[8];
                int n = H - k;
                memcpy(ti, g + k, 4 * n); memcpy(to, g + H + k, 4 * n);
                memcpy(tf, g + 2 * H + k, 4 * n); memcpy(tc, g + 3 * H + k, 4 * n); memcpy(tcs, cb + k, 4 * n);
                __m256 cn = _mm256_fmadd_ps(npr_sigmoid(_mm256_loadu_ps(tf)), _mm256_loadu_ps(tcs),
                                            _mm256_mul_ps(npr_sigmoid(_mm256_loadu_ps(ti)), npr_tanh(_mm256_loadu_ps(tc))));
                _mm256_storeu_ps(tcs, cn);
                _mm256_storeu_ps(th, _mm256_mul_ps(npr_sigmoid(_mm256_loadu_ps(to)), npr_tanh(cn)));
                memcpy(cb + k, tcs, 4 * n);
                memcpy(hb + k, th, 4 * n);
            }
            memcpy(y + t * ys + (long)b * H, hb, sizeof(float) * H);
        }
    }
    free(g);
    return 0;
}

/* The GRU recurrence, float32, ONNX's default activations (sigmoid for z, r; tanh for the
 * candidate), no clip; H a multiple of 8. proj (S, B, 3H): every step's x W^T plus the biases
 * (z, r: Wb + Rb; candidate: Wbh, plus Rbh unless linear_before_reset); rt = R^T (H, 3H) as panels
 * (vecmat), column blocks z, r, h; rbh: the candidate's recurrent bias (linear_before_reset), or NULL.
 *     z, r = sigmoid(proj[:2H] + h R_zr^T)
 *     c~ = tanh(proj[2H:] + r * (h R_h^T + Rbh))      (linear_before_reset, PyTorch's form)
 *     c~ = tanh(proj[2H:] + (r * h) R_h^T)            (otherwise)
 *     h = c~ + z * (h - c~)
 * h (B, H) holds the initial state and gets the final one; step t's h goes to y + t * ys. */
int npr_gru_f32(const float *proj, const float *rt, const float *rbh, float *h, float *y, long ys,
                int S, int B, int H, int reverse, int lbr, int s0, int s1)
{
    const int G = 3 * H;
    if (H % 8) return -2;
    float *g = aligned_alloc(32, sizeof(float) * (size_t)G), *rh = aligned_alloc(32, sizeof(float) * (size_t)H);
    if (!g || !rh) { free(g); free(rh); return -1; }
    for (int s = s0; s < s1; s++) {
        int t = reverse ? S - 1 - s : s;
        for (int b = 0; b < B; b++) {
            const float *p = proj + ((long)t * B + b) * G;
            float *hb = h + (long)b * H;
            if (lbr) {  /* one product for all three blocks: they all read h */
                vecmat(NULL, hb, rt, H, 0, G, g);
            } else {
                vecmat(NULL, hb, rt, H, 0, 2 * H, g);
            }
            for (int k = 0; k < 2 * H; k += 8)  /* z, r */
                _mm256_store_ps(g + k, npr_sigmoid(_mm256_add_ps(_mm256_load_ps(g + k), _mm256_loadu_ps(p + k))));
            if (!lbr) {  /* (r * h) R_h^T */
                for (int k = 0; k < H; k += 8)
                    _mm256_store_ps(rh + k, _mm256_mul_ps(_mm256_load_ps(g + H + k), _mm256_loadu_ps(hb + k)));
                vecmat(NULL, rh, rt, H, 2 * H, 3 * H, g);
            }
            for (int k = 0; k < H; k += 8) {
                __m256 z = _mm256_load_ps(g + k), r = _mm256_load_ps(g + H + k), hr = _mm256_load_ps(g + 2 * H + k);
                __m256 pre = _mm256_loadu_ps(p + 2 * H + k);
                if (lbr) {
                    if (rbh) hr = _mm256_add_ps(hr, _mm256_loadu_ps(rbh + k));
                    pre = _mm256_fmadd_ps(r, hr, pre);
                } else {
                    pre = _mm256_add_ps(pre, hr);
                }
                __m256 cand = npr_tanh(pre), hv = _mm256_loadu_ps(hb + k);
                _mm256_storeu_ps(hb + k, _mm256_fmadd_ps(z, _mm256_sub_ps(hv, cand), cand));
            }
            memcpy(y + t * ys + (long)b * H, hb, sizeof(float) * H);
        }
    }
    free(g);
    free(rh);
    return 0;
}

/* ---- Both directions of a bidirectional LSTM or GRU at once, one per thread of the library's
 * one pool (par.h). The two recurrences share nothing, and each step is a (B, H) x (H, 4H)
 * product whose weights (4 MB at H = 512) come from L3 or memory every step: run one after the
 * other, a thread streams both sets; here two cores stream one each. */
#include "par.h"

typedef struct {
    int gru, S, B, H, lbr, s0, s1; long ys;
    const float *proj[2], *rt[2], *rbh[2];
    float *h[2], *c[2], *y[2];
    atomic_int rc;
} dirs_job;

static void dirs_chunk(void *ctx, int d)
{
    dirs_job *j = ctx;
    int rc = j->gru ? npr_gru_f32(j->proj[d], j->rt[d], j->rbh[d], j->h[d], j->y[d], j->ys, j->S, j->B, j->H, d, j->lbr,
                                  j->s0, j->s1)
                    : npr_lstm_f32(j->proj[d], j->rt[d], j->h[d], j->c[d], j->y[d], j->ys, j->S, j->B, j->H, d, j->s0, j->s1);
    if (rc) atomic_store(&j->rc, rc);
}

/* Direction 0 forward, direction 1 reverse (ONNX's bidirectional); arguments as npr_lstm_f32 /
 * npr_gru_f32's, one per direction (c0, c1 unused for a GRU, rbh0, rbh1 for an LSTM). */
int npr_recurrent2_mt(int gru, const float *proj0, const float *proj1, const float *rt0, const float *rt1,
                      const float *rbh0, const float *rbh1, float *h0, float *h1, float *c0, float *c1,
                      float *y0, float *y1, long ys, int S, int B, int H, int lbr, int threads, int s0, int s1)
{
    dirs_job j = {gru, S, B, H, lbr, s0, s1, ys, {proj0, proj1}, {rt0, rt1}, {rbh0, rbh1}, {h0, h1}, {c0, c1},
                  {y0, y1}, 0};
    par_run(dirs_chunk, &j, 2, threads);
    return atomic_load(&j.rc);
}
