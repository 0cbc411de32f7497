/* Winograd F(4x4, 3x3), written once for a vector width and included by winograd.c twice
 * (AVX2: VL=8, AVX-512: VL=16). The includer defines VEC, VL, VLOAD, VSTORE, VSET1, VBCAST,
 * VADD, VSUB, VMUL, VFMA (a*b+c), VFNMA (c-a*b), VZERO, ACT(v, act, al, be), the shuffles
 * PHASES6 and INTERLEAVE4, the GEMM tile WMR x WNV vectors, the block TB (tiles), the row
 * buffer pitch RS, IN_PLACE (0/1), the suffix SUF of the static helpers' names and the
 * exported names WINO, WINO_MR. See winograd.c for the algorithm. */
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define N(name) CAT(name, SUF)

/* acc[0:mr][0:nv*VL] = sum_k a[k][0:mr] * b[k][0:nv*VL]: a packed (K, WMR), b rows bs apart;
 * nv = WNV, or 1 for a block of one vector of tiles (a narrow image). */
static inline __attribute__((always_inline)) void
N(gtile)(const float *a, const float *b, int K, long bs, float *c, long cs, const int mr, const int nv)
{
    VEC acc[WMR][WNV];
#pragma GCC unroll 16
    for (int i = 0; i < WMR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nv; j++) acc[i][j] = VZERO();
    for (int k = 0; k < K; k++, a += WMR, b += bs) {
        VEC bv[WNV];
#pragma GCC unroll 4
        for (int j = 0; j < nv; j++) bv[j] = VLOAD(b + j * VL);
#pragma GCC unroll 16
        for (int i = 0; i < WMR; i++) {
            if (i >= mr) break;
            VEC w = VBCAST(a + i);
#pragma GCC unroll 4
            for (int j = 0; j < nv; j++) acc[i][j] = VFMA(w, bv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < WMR; i++) {
        if (i >= mr) break;
#pragma GCC unroll 4
        for (int j = 0; j < nv; j++) VSTORE(c + i * cs + j * VL, acc[i][j]);
    }
}

/* The 36 GEMMs of one block: Mt[p] (M, tb) = U[p] (M, C) @ V[p] (C, tb); tb is a multiple
 * of WNV*VL, or VL. */
static void N(gemm)(const float *U, const float *V, float *Mt, int C, int M, long vps, long mps, int tb)
{
    int mb = (M + WMR - 1) / WMR;
    for (int p = 0; p < 36; p++) {
        const float *up = U + (long)p * mb * C * WMR, *vp = V + p * vps;
        float *mp = Mt + p * mps;
        for (int n0 = 0; n0 < tb; n0 += WNV * VL)  /* (a one-vector block: one pass, nv = 1) */
            for (int b = 0; b < mb; b++) {
                const float *a = up + (long)b * C * WMR, *bb = vp + n0;
                float *c = mp + (long)b * WMR * tb + n0;
                int mr = M - b * WMR < WMR ? M - b * WMR : WMR;
                switch (mr) {  /* one unrolled copy per row count: a ragged M costs no lanes */
#define CASE(n) case n: { if (tb == VL) N(gtile)(a, bb, C, tb, c, tb, n, 1);          \
                         else N(gtile)(a, bb, C, tb, c, tb, n, WNV); } break;
                CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6)
#if WMR > 6
                CASE(7) CASE(8) CASE(9) CASE(10) CASE(11) CASE(12)
#endif
#undef CASE
                }
            }
    }
}

/* B^T d for F(4x4, 3x3) on 6 vectors (in place): 12 adds/FMAs. */
static inline __attribute__((always_inline)) void N(bt6)(VEC *d)
{
    const VEC f2 = VSET1(2.0f), f4 = VSET1(4.0f), f5 = VSET1(5.0f);
    VEC a = VFNMA(f4, d[2], d[4]), b = VFNMA(f4, d[1], d[3]);
    VEC c = VSUB(d[4], d[2]), e = VMUL(f2, VSUB(d[3], d[1]));
    VEC v0 = VFMA(f4, d[0], VFNMA(f5, d[2], d[4]));
    VEC v5 = VFMA(f4, d[1], VFNMA(f5, d[3], d[5]));
    d[0] = v0; d[1] = VADD(a, b); d[2] = VSUB(a, b); d[3] = VADD(c, e); d[4] = VSUB(c, e); d[5] = v5;
}

/* A^T m for F(4x4, 3x3): 6 vectors -> 4. */
static inline __attribute__((always_inline)) void N(at6)(const VEC *m, VEC *o)
{
    const VEC f2 = VSET1(2.0f), f4 = VSET1(4.0f), f8 = VSET1(8.0f);
    VEC s1 = VADD(m[1], m[2]), d1 = VSUB(m[1], m[2]), s2 = VADD(m[3], m[4]), d2 = VSUB(m[3], m[4]);
    o[0] = VADD(VADD(m[0], s1), s2);
    o[1] = VFMA(f2, d2, d1);
    o[2] = VFMA(f4, s2, s1);
    o[3] = VADD(VFMA(f8, d2, d1), m[5]);
}

/* Input transform of one block of tb tiles (tile row tr, tiles t0..t0+tb-1) for every
 * channel: V[(i*6+j)][c][t] = (B^T d_t B)[i][j]. rb: 6 padded rows of RS floats, where rows
 * are copied with their zero padding; with IN_PLACE rows wholly inside the image are read
 * where they are (measured: AVX-512 5% faster, AVX2 5-25% slower, so only the former does). */
static void N(input)(const float *x, int C, int H, int W, int pt, int pl, int tr, int t0,
                     float *V, long vps, int tb, float *rb, VEC *tmp)
{
    int x0 = 4 * t0 - pl;  /* the image column under rb[0] */
    int lo = x0 < 0 ? -x0 : 0, hi = W - x0 < RS ? W - x0 : RS;  /* rb[lo:hi] is in the image */
    for (int c = 0; c < C; c++) {
        const float *xc = x + (long)c * H * W, *rp[6];
        for (int i = 0; i < 6; i++) {
            float *r = rb + i * RS;
            int iy = 4 * tr - pt + i;
            rp[i] = r;
            if (iy < 0 || iy >= H || hi <= lo) { memset(r, 0, sizeof(float) * RS); continue; }
            if (IN_PLACE && lo == 0 && hi == RS) { rp[i] = xc + (long)iy * W + x0; continue; }
            if (lo) memset(r, 0, sizeof(float) * lo);
            memcpy(r + lo, xc + (long)iy * W + x0 + lo, sizeof(float) * (hi - lo));
            if (hi < RS) memset(r + hi, 0, sizeof(float) * (RS - hi));
        }
        for (int g = 0; g < tb; g += VL) {
            for (int i = 0; i < 6; i++) {  /* rows: d B (along x), tile lanes */
                VEC d[6];
                PHASES6(rp[i] + 4 * g, d);
                N(bt6)(d);
                for (int j = 0; j < 6; j++) tmp[i * 6 + j] = d[j];
            }
            for (int j = 0; j < 6; j++) {  /* columns: B^T (d B) (along y) */
                VEC d[6];
                for (int i = 0; i < 6; i++) d[i] = tmp[i * 6 + j];
                N(bt6)(d);
                for (int i = 0; i < 6; i++) VSTORE(V + (i * 6 + j) * vps + (long)c * tb + g, d[i]);
            }
        }
    }
}

/* Output transform + epilogue of one block: y[m][4tr+a][4(t0+t)+b] = act(bias + A^T M A). */
static void N(output)(const float *Mt, long mps, const float *bias, int M, int act, VEC al, VEC be,
                      float *y, int Ho, int Wo, int tr, int t0, int tb, int nt)
{
    float tmp[4 * VL] __attribute__((aligned(64)));
    for (int m = 0; m < M; m++) {
        VEC bb = VSET1(bias[m]);
        for (int g = 0; g < tb; g += VL) {
            int ox = 4 * (t0 + g);
            if (ox >= Wo) break;
            VEC q[6][4];
            for (int i = 0; i < 6; i++) {  /* rows: M A (along x) */
                VEC mv[6];
                for (int j = 0; j < 6; j++) mv[j] = VLOAD(Mt + (i * 6 + j) * mps + (long)m * tb + g);
                N(at6)(mv, q[i]);
            }
            for (int b = 0; b < 4; b++) {  /* columns: A^T (M A) (along y), then per output row */
                VEC mv[6], o[4];
                for (int i = 0; i < 6; i++) mv[i] = q[i][b];
                N(at6)(mv, o);
                for (int a = 0; a < 4; a++) q[a][b] = ACT(VADD(o[a], bb), act, al, be);
            }
            for (int a = 0; a < 4; a++) {
                int oy = 4 * tr + a;
                if (oy >= Ho) break;
                float *dst = y + ((long)m * Ho + oy) * Wo + ox;
                if (ox + 4 * VL <= Wo) {
                    INTERLEAVE4(q[a], dst, nt && ((size_t)dst & (sizeof(VEC) - 1)) == 0);
                } else {
                    INTERLEAVE4(q[a], tmp, 0);
                    memcpy(dst, tmp, sizeof(float) * (Wo - ox));
                }
            }
        }
    }
}

#define BLOCK(t) ((t) >= TB ? TB : (t) <= VL ? VL : ((t) + WNV * VL - 1) / (WNV * VL) * (WNV * VL))

/* Packed-weight row count of the GEMM tile: the Python side packs U as (36, ceil(M/MR), C, MR). */
int WINO_MR(void) { return WMR; }

/* One image, tile rows [tr0, tr1) (output rows 4*tr0 .. 4*tr1-1). U: (36, ceil(M/WMR), C, WMR)
 * float32, the transformed weights G g G^T. nt: non-temporal stores of the output (see
 * conv_tile.h). Returns 0, or -1 when a buffer cannot be had. */
int WINO(const float *x, int C, int H, int W, const float *U, const float *bias, int M,
         int pt, int pl, int act, float alpha, float beta, float *y, int Ho, int Wo, int tr0, int tr1,
         int nt)
{
    /* Blocks of TB tiles; a narrower one at the end of a row, or across a narrow image
     * (BLOCK: a multiple of the GEMM tile's width, or one vector): at 20 pixels across a
     * full block would be 12x the work. */
    int tw = (Wo + 3) / 4, tb = BLOCK(tw);
    /* Point pitches padded by a cache line: C*tb floats is a multiple of 4 KiB for common C,
     * and 36 streams 4 KiB apart would fight over one L1 set. */
    long vps = (long)C * tb + 16, mps = (long)M * tb + 16;
    float *V = aligned_alloc(64, sizeof(float) * 36 * vps);
    float *Mt = aligned_alloc(64, sizeof(float) * 36 * mps);
    float *rb = aligned_alloc(64, sizeof(float) * 6 * RS);
    VEC *tmp = aligned_alloc(64, sizeof(VEC) * 36);
    int rc = -1;
    if (!V || !Mt || !rb || !tmp) goto done;
    VEC al = VSET1(alpha), be = VSET1(beta);
    /* Along a tile row: the input rows and output rows of the next block continue the
     * ones of this block (C x 6 + M x 4 streams). Measured: walking down a column of blocks
     * instead (to find the 2 shared input rows in L2) is 15-35% slower. */
    for (int tr = tr0; tr < tr1; tr++)
        for (int t0 = 0, n; t0 < tw; t0 += n) {
            n = BLOCK(tw - t0);
            N(input)(x, C, H, W, pt, pl, tr, t0, V, vps, n, rb, tmp);
            N(gemm)(U, V, Mt, C, M, vps, mps, n);
            N(output)(Mt, mps, bias, M, act, al, be, y, Ho, Wo, tr, t0, n, nt);
        }
    if (nt) _mm_sfence();
    rc = 0;
done:
    free(V); free(Mt); free(rb); free(tmp);
    return rc;
}

#undef BLOCK
#undef N
#undef CAT
#undef CAT_
