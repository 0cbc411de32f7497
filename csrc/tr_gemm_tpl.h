/* One ISA's sgemm with pre-packed B (included by transformer.c with VEC, VL, MR and the
 * intrinsics defined). C (M x N) = A (M x K, row-major) @ B [+ bias (N)] [+ R (M x N)], the
 * adds after the product in that order (as a matmul then its add nodes round them).
 * B is packed once per weight into panels of NR = 2 VL columns, Bp[panel][k][NR], zero
 * padded past N. A call computes panels [p0, p1) for every row: a band of columns per
 * thread, so each thread streams only its share of the weights. Register tile MR x NR:
 * 6 x 16 on AVX2 (12 ymm accumulators), 8 x 32 on AVX-512 (16 zmm). A short last row block
 * reads its last row again for the missing ones and stores only the real rows. */

/* (GEMM_TILE_AB: A's rows `lda` floats apart, B's k rows `ldb` apart (2 VL: packed; a plane's
 * width: B read in place), and with `abias` A's column K a per-row bias added after the sum,
 * as the packed path's row of ones adds it: one rounding either way.) */
static inline __attribute__((always_inline)) void GEMM_TILE_AB(const float *A, long lda, long K, const float *Bp,
        long ldb, float *C, long N, int mr, int nc, const float *bias, const float *R, int abias,
        int act, float alpha, float beta)
{
    VEC c0[MR], c1[MR];
    const float *a[MR];
    for (int r = 0; r < MR; r++) {
        c0[r] = VZERO(); c1[r] = VZERO();
        a[r] = A + (r < mr ? r : mr - 1) * lda;
    }
    if (nc <= VL) {  /* a narrow panel (N of a few columns, or a last panel): half the FMAs */
#pragma GCC unroll 2
        for (long k = 0; k < K; k++) {
            VEC b0 = VLOAD(Bp + k * ldb);
#pragma GCC unroll 16
            for (int r = 0; r < MR; r++) c0[r] = VFMA(VSET1(a[r][k]), b0, c0[r]);
        }
    } else {
#pragma GCC unroll 2
        for (long k = 0; k < K; k++) {
            VEC b0 = VLOAD(Bp + k * ldb), b1 = VLOAD(Bp + k * ldb + VL);
#pragma GCC unroll 16
            for (int r = 0; r < MR; r++) {
                VEC av = VSET1(a[r][k]);
                c0[r] = VFMA(av, b0, c0[r]);
                c1[r] = VFMA(av, b1, c1[r]);
            }
        }
    }
    if (abias)
        for (int r = 0; r < MR; r++) {
            VEC bv = VSET1(a[r][K]);
            c0[r] = VADD(c0[r], bv);
            c1[r] = VADD(c1[r], bv);
        }
    if (nc == 2 * VL) {
        VEC bb0 = bias ? VLOAD(bias) : VZERO(), bb1 = bias ? VLOAD(bias + VL) : VZERO();
        for (int r = 0; r < mr; r++) {
            VEC v0 = c0[r], v1 = c1[r];
            if (bias) { v0 = VADD(v0, bb0); v1 = VADD(v1, bb1); }
            if (R) { v0 = VADD(v0, VLOAD(R + r * N)); v1 = VADD(v1, VLOAD(R + r * N + VL)); }
            if (act) { v0 = VACT(v0, act, alpha, beta); v1 = VACT(v1, act, alpha, beta); }
            VSTORE(C + r * N, v0);
            VSTORE(C + r * N + VL, v1);
        }
    } else {  /* (no caller gives a short panel and an activation: GEMM_ACT takes whole ones) */
        float t[2 * VL];
        for (int r = 0; r < mr; r++) {
            VSTORE(t, c0[r]);
            VSTORE(t + VL, c1[r]);
            for (int j = 0; j < nc; j++) {
                float v = t[j];
                if (bias) v = v + bias[j];
                if (R) v = v + R[r * N + j];
                C[r * N + j] = v;
            }
        }
    }
}

static inline __attribute__((always_inline)) void GEMM_TILE(const float *A, long K, const float *Bp,
        float *C, long N, int mr, int nc, const float *bias, const float *R)
{
    GEMM_TILE_AB(A, K, K, Bp, 2 * VL, C, N, mr, nc, bias, R, 0, 0, 0.0f, 0.0f);
}

/* Row k of B goes to row k of every panel: whole panels two vectors at a time, along B's rows
 * (the attention products pack a B every call: element by element, the packing was a tenth of
 * a 128 x 128 @ 128 x 64 head's time), the last partial panel element by element, zero padded. */
void GEMM_PACK_LD(const float *B, long ldb, float *Bp, long K, long N)
{
    long np = (N + 2 * VL - 1) / (2 * VL), whole = N / (2 * VL);
    for (long k = 0; k < K; k++) {
        const float *b = B + k * ldb;
        for (long p = 0; p < whole; p++) {
            float *d = Bp + (p * K + k) * 2 * VL;
            VSTORE(d, VLOAD(b + p * 2 * VL));
            VSTORE(d + VL, VLOAD(b + p * 2 * VL + VL));
        }
    }
    for (long p = whole; p < np; p++)
        for (long k = 0; k < K; k++)
            for (long j = 0; j < 2 * VL; j++) {
                long col = p * 2 * VL + j;
                Bp[(p * K + k) * 2 * VL + j] = col < N ? B[k * ldb + col] : 0.0f;
            }
}

/* (B's rows `ldb` floats apart above: attention's values, a view of heads side by side) */
void GEMM_PACK(const float *B, float *Bp, long K, long N)
{
    GEMM_PACK_LD(B, N, Bp, K, N);
}

/* GEMM_PACK of B = Bt^T, Bt (N x K) with rows `ldt` floats apart: attention's keys (tokens x head size) as the
 * K^T of Q @ K^T, packed straight from them: panel p's row k is column k of Bt's rows
 * p*NR .. p*NR+NR-1. (NumPy's matmul reads such a view in place, with BLAS's transposed-B
 * flag; a contiguous copy first, then the packing, made the packed product slower than it.) */
void GEMM_PACK_T(const float *Bt, long ldt, float *Bp, long K, long N)
{
    long np = (N + 2 * VL - 1) / (2 * VL), whole = N / (2 * VL), k8 = K / 8 * 8;
    for (long p = 0; p < whole; p++) {  /* whole panels: 8 x 8 blocks transposed in registers */
        float *d = Bp + p * K * 2 * VL;
        for (long j0 = 0; j0 < 2 * VL; j0 += 8) {
            const float *src = Bt + (p * 2 * VL + j0) * ldt;
            for (long k0 = 0; k0 < k8; k0 += 8) {
                __m256 r[8];
                for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * ldt + k0);
                npr_transpose8(r);
                for (int i = 0; i < 8; i++) _mm256_storeu_ps(d + (k0 + i) * 2 * VL + j0, r[i]);
            }
            for (long k = k8; k < K; k++)
                for (int i = 0; i < 8; i++) d[k * 2 * VL + j0 + i] = src[i * ldt + k];
        }
    }
    for (long p = whole; p < np; p++) {
        float *d = Bp + p * K * 2 * VL;
        for (long j = 0; j < 2 * VL; j++) {
            long row = p * 2 * VL + j;
            if (row < N) {
                const float *src = Bt + row * ldt;
                for (long k = 0; k < K; k++) d[k * 2 * VL + j] = src[k];
            } else {
                for (long k = 0; k < K; k++) d[k * 2 * VL + j] = 0.0f;
            }
        }
    }
}

int GEMM_NR(void) { return 2 * VL; }

/* One row of A against up to 4 panels at once (a matrix-vector product: LLM decode, a
 * classifier head, a squeeze-excite layer). GEMM_TILE on one row computes MR rows (the missing
 * ones read the last again): 6x the FMAs on AVX2, and its 2 accumulators of the one real row
 * are 2 dependent chains. Here 2 per panel for 4 panels, 8 chains; each output is still
 * the sum over k in order from 0, so its bits are GEMM_TILE's (a row computed alone or in a
 * block gives the same floats). */
static inline __attribute__((always_inline)) void GEMV_PANELS(const float *A, long K, const float *Bp,
        float *C, long N, long col, int np, const float *bias, const float *R)
{
    VEC c[8];
    const float *b[4];
    for (int j = 0; j < 4; j++) {
        c[2 * j] = VZERO(); c[2 * j + 1] = VZERO();
        b[j] = Bp + (j < np ? j : 0) * K * 2 * VL;
    }
#pragma GCC unroll 2
    for (long k = 0; k < K; k++) {
        VEC av = VSET1(A[k]);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            c[2 * j] = VFMA(av, VLOAD(b[j] + k * 2 * VL), c[2 * j]);
            c[2 * j + 1] = VFMA(av, VLOAD(b[j] + k * 2 * VL + VL), c[2 * j + 1]);
        }
    }
    for (int j = 0; j < np; j++) {
        long cj = col + j * 2 * VL;
        int nc = (int)(N - cj < 2 * VL ? N - cj : 2 * VL);
        float t[2 * VL];
        VSTORE(t, c[2 * j]);
        VSTORE(t + VL, c[2 * j + 1]);
        for (int i = 0; i < nc; i++) {
            float v = t[i];
            if (bias) v = v + bias[cj + i];
            if (R) v = v + R[cj + i];
            C[cj + i] = v;
        }
    }
}

void GEMM(const float *A, const float *Bp, float *C, const float *bias, const float *R,
          long M, long K, long N, long p0, long p1)
{
    if (M == 1) {
        for (long p = p0; p < p1; p += 4) {
            int np = (int)(p1 - p < 4 ? p1 - p : 4);
            GEMV_PANELS(A, K, Bp + p * K * 2 * VL, C, N, p * 2 * VL, np, bias, R);
        }
        return;
    }
    for (long p = p0; p < p1; p++) {
        long col = p * 2 * VL;
        int nc = (int)(N - col < 2 * VL ? N - col : 2 * VL);
        const float *bp = Bp + p * K * 2 * VL;
        for (long i = 0; i < M; i += MR) {
            int mr = (int)(M - i < MR ? M - i : MR);
            GEMM_TILE(A + i * K, K, bp, C + i * N + col, N, mr, nc, bias ? bias + col : NULL,
                      R ? R + i * N + col : NULL);
        }
    }
}

/* C = act(A @ B) written in place into rows `ldc` floats apart (a conv's output planes), for
 * whole panels only (N a multiple of NR): the im2col GEMM's product goes straight to the
 * output with its activation applied in the registers, where it went through a tile buffer,
 * an activation pass over it and a copy out (16->96 on 112x112: the output written three
 * times). A's rows are `lda` apart; B is packed (ldb = NR, panels K*NR apart) or read in place
 * (a pointwise conv's planes: ldb = the plane's size, panels NR apart), then with `abias` A's
 * column K is each row's bias (GEMM_TILE_AB). Each output is GEMM_TILE's sum, and the
 * activation is act.h's on the same floats (VACT), so the bits of the tile's path. */
void GEMM_ACT(const float *A, long lda, const float *Bp, long ldb, long bstep, float *C, long ldc, long M, long K,
              long p0, long p1, int abias, int act, float alpha, float beta)
{
    for (long p = p0; p < p1; p++) {
        long col = p * 2 * VL;
        const float *bp = Bp + p * bstep;
        for (long i = 0; i < M; i += MR) {
            int mr = (int)(M - i < MR ? M - i : MR);
            GEMM_TILE_AB(A + i * lda, lda, K, bp, ldb, C + i * ldc + col, ldc, mr, 2 * VL, NULL, NULL, abias,
                         act, alpha, beta);
        }
    }
}

/* The same product with B held as int8 panels Bq[panel][k][NR] (zero padded) and one scale
 * per column (padded to whole panels): each panel is widened once into ws (K x NR floats)
 * as f32(q) * s, the very floats of the dequantized weights, so C is what GEMM gives on those
 * weights; the weights cross the memory bus at a quarter of the bytes. */
void GEMM_Q8(const float *A, const signed char *Bq, const float *scale, float *C, const float *bias,
             const float *R, long M, long K, long N, long p0, long p1, float *ws)
{
    for (long p = p0; p < p1; p++) {
        long col = p * 2 * VL;
        int nc = (int)(N - col < 2 * VL ? N - col : 2 * VL);
        const signed char *bq = Bq + p * K * 2 * VL;
        VEC s0 = VLOAD(scale + col), s1 = VLOAD(scale + col + VL);
        for (long k = 0; k < K; k++) {
            VSTORE(ws + k * 2 * VL, VMUL(VLOADQ8(bq + k * 2 * VL), s0));
            VSTORE(ws + k * 2 * VL + VL, VMUL(VLOADQ8(bq + k * 2 * VL + VL), s1));
        }
        for (long i = 0; i < M; i += MR) {
            int mr = (int)(M - i < MR ? M - i : MR);
            GEMM_TILE(A + i * K, K, ws, C + i * N + col, N, mr, nc, bias ? bias + col : NULL,
                      R ? R + i * N + col : NULL);
        }
    }
}

/* A conv as the transposed product, output channels in the vectors:
 *     y^T (P x M) = A (P x K) @ W^T (K x M) + bias,   A = im2col(x)^T (x itself for a pointwise conv)
 * A is packed (gemm_mt.c npr_tconvk_range_mt) MR pixels per k side by side, W^T packed once as
 * any weight (GEMM_PACK of the K x M matrix), and each MR x NR tile (pixels x channels) is
 * written back into the planes y (M, P). Against the im2col GEMM, whose vectors run over
 * pixels: a 7x7 map's 49 pixels take 9 row blocks of 6 (54) instead of 4 panels of 16 (64), and
 * the weights stream once per group of pixels, not once per panel of 16. */
/* One tile: Ap[k][MR], the block's MR pixels under tap k side by side; sums over k in order
 * from zero, then the bias. */
static inline __attribute__((always_inline)) void GEMM_TILE_TP(const float *Ap, long P, long K, const float *Bp,
        float *y, int mr, int nc, const float *bias, int wide)
{
    VEC c0[MR], c1[MR];
    for (int r = 0; r < MR; r++) { c0[r] = VZERO(); c1[r] = VZERO(); }
#pragma GCC unroll 2
    for (long k = 0; k < K; k++) {
        VEC b0 = VLOAD(Bp + k * 2 * VL), b1 = VLOAD(Bp + k * 2 * VL + VL);
        const float *a = Ap + k * MR;
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            VEC av = VSET1(a[r]);
            c0[r] = VFMA(av, b0, c0[r]);
            c1[r] = VFMA(av, b1, c1[r]);
        }
    }
    VEC bb0 = VLOAD(bias), bb1 = VLOAD(bias + VL);
#if VL == 8 && MR == 6
    /* `wide`: the 8 floats from each channel's first pixel may be written (the 2 past the
     * block's 6 belong to the next block, written after): the tile goes out as 8x8
     * transposes, a vector per channel, where 96 single floats went one by one (K 27, a
     * 3x3 conv from RGB: a third of the tile's time) */
    if (wide && mr == MR) {
        __m256 lo[8], hi[8];
        for (int r = 0; r < MR; r++) { lo[r] = VADD(c0[r], bb0); hi[r] = VADD(c1[r], bb1); }
        lo[6] = lo[7] = hi[6] = hi[7] = VZERO();
        npr_transpose8(lo);
        npr_transpose8(hi);
        for (int j = 0; j < nc && j < 8; j++) VSTORE(y + j * P, lo[j]);
        for (int j = 8; j < nc; j++) VSTORE(y + j * P, hi[j - 8]);
        return;
    }
#else
    (void)wide;
#endif
    float t[MR][2 * VL];
    for (int r = 0; r < MR; r++) {
        VSTORE(t[r], VADD(c0[r], bb0));
        VSTORE(t[r] + VL, VADD(c1[r], bb1));
    }
    for (int j = 0; j < nc; j++)
        for (int r = 0; r < mr; r++) y[j * P + r] = t[r][j];
}

/* Panels [p0, p1) of output channels over np pixels packed in Ap, into y's planes (P floats
 * apart: np may be a group of a bigger map's pixels). */
void GEMM_TCONV_AP(const float *Ap, const float *Bp, float *y, const float *bias, long np, long P, long K, long M,
                   long p0, long p1)
{
    for (long p = p0; p < p1; p++) {
        long col = p * 2 * VL;
        int nc = (int)(M - col < 2 * VL ? M - col : 2 * VL);
        const float *bp = Bp + p * K * 2 * VL;
        for (long i = 0; i < np; i += MR) {
            int mr = (int)(np - i < MR ? np - i : MR);
            GEMM_TILE_TP(Ap + (i / MR) * K * MR, P, K, bp, y + col * P + i, mr, nc, bias + col, i + 8 <= np);
        }
    }
}
