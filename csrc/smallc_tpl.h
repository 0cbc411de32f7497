/* The direct conv for few input channels, written once for a vector width and included by
 * smallc.c twice (AVX2, AVX-512). The includer defines VEC, VL, MB (output channels a tile),
 * NV (vectors a tile row), VLOAD, VBCAST, VSET1, VFMA, VZERO, VADD, VACT, VSTORE, VSTREAM
 * and the names SMALLC, SMALLC_MR. See smallc.c for the algorithm. */
#define NW (NV * VL)  /* output pixels a tile */

int SMALLC_MR(void) { return MB; }

/* Output rows [r0, r1) of one image: x (C, H, W), weights packed (ceil(M/MB), C*kh*kw, MB)
 * in (c, ky, kx) order, bias padded to a multiple of MB; y (M, Ho, Wo). Stride 1, dilation 1,
 * pads pt/pl at the top/left (the bottom/right ones follow from Ho, Wo). */
int SMALLC(const float *x, int C, int H, int W, const float *wp, const float *bias, int M,
           int kh, int kw, int pt, int pl, int act, float alpha, float beta,
           float *y, int Ho, int Wo, int r0, int r1, int nt)
{
    /* The kh input rows of each channel, zero-padded: pixel j of a row is x[.., j - pl], and
     * every tile reads whole vectors of it (the row is rounded up to whole tiles). */
    long Wp = ((long)(Wo + NW - 1) / NW * NW + kw - 1 + 15) & ~15L;
    int K = C * kh * kw;
    float *buf = aligned_alloc(64, sizeof(float) * (size_t)(C * kh) * Wp);
    if (!buf) return -1;
    VEC al = VSET1(alpha), be = VSET1(beta);
    long hw = (long)H * W, plane = (long)Ho * Wo;
    for (int r = r0; r < r1; r++) {
        for (int c = 0; c < C; c++)
            for (int ky = 0; ky < kh; ky++) {
                float *d = buf + (long)(c * kh + ky) * Wp;
                int iy = r - pt + ky;
                memset(d, 0, sizeof(float) * Wp);
                long n = W < Wp - pl ? W : Wp - pl;
                if (iy >= 0 && iy < H && n > 0)
                    memcpy(d + pl, x + c * hw + (long)iy * W, sizeof(float) * n);
            }
        for (int x0 = 0; x0 < Wo; x0 += NW) {
            int nvalid = Wo - x0 < NW ? Wo - x0 : NW;
            for (int mb = 0; mb < M; mb += MB) {
                const float *a = wp + (long)(mb / MB) * K * MB;
                /* Named accumulators (an array indexed in unrolled loops stayed in memory:
                 * 420 spills); rows past MB and vectors past NV are compiled out. */
                VEC z = VZERO(), c00 = z, c01 = z, c02 = z, c10 = z, c11 = z, c12 = z,
                    c20 = z, c21 = z, c22 = z, c30 = z, c31 = z, c32 = z, c40 = z, c41 = z, c42 = z,
                    c50 = z, c51 = z, c52 = z, c60 = z, c61 = z, c62 = z, c70 = z, c71 = z, c72 = z;
                for (int cy = 0; cy < C * kh; cy++) {
                    const float *p = buf + cy * Wp + x0;
                    for (int kx = 0; kx < kw; kx++, p++, a += MB) {
                        /* one shifted input vector, FMA'd into MB channels */
                        VEC b0 = VLOAD(p), b1 = b0, b2 = b0, wv;
                        if (NV > 1) b1 = VLOAD(p + VL);
                        if (NV > 2) b2 = VLOAD(p + 2 * VL);
#define ROW(i)                                                   \
                        if (i < MB) {                                    \
                            wv = VBCAST(a + i);                          \
                            c##i##0 = VFMA(wv, b0, c##i##0);             \
                            if (NV > 1) c##i##1 = VFMA(wv, b1, c##i##1); \
                            if (NV > 2) c##i##2 = VFMA(wv, b2, c##i##2); \
                        }
                        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7)
#undef ROW
                    }
                }
                VEC acc[8][3] = {{c00, c01, c02}, {c10, c11, c12}, {c20, c21, c22}, {c30, c31, c32},
                                 {c40, c41, c42}, {c50, c51, c52}, {c60, c61, c62}, {c70, c71, c72}};
                /* Epilogue: bias + activation in registers, one store per vector. */
                int mvalid = M - mb < MB ? M - mb : MB;
                for (int i = 0; i < mvalid; i++) {
                    VEC bb = VBCAST(bias + mb + i);
                    float *dst = y + (mb + i) * plane + (long)r * Wo + x0;
                    if (nvalid == NW) {
                        int stream = nt && ((size_t)dst & (sizeof(VEC) - 1)) == 0;
#pragma GCC unroll 4
                        for (int j = 0; j < NV; j++) {
                            VEC v = VACT(VADD(acc[i][j], bb), act, al, be);
                            if (stream) VSTREAM(dst + j * VL, v); else VSTORE(dst + j * VL, v);
                        }
                    } else {
                        float tmp[NW];
                        for (int j = 0; j < NV; j++) VSTORE(tmp + j * VL, VACT(VADD(acc[i][j], bb), act, al, be));
                        memcpy(dst, tmp, sizeof(float) * nvalid);
                    }
                }
            }
        }
    }
    free(buf);
    return 0;
}
#undef NW
