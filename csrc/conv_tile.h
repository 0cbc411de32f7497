/* The dense conv kernel, written once for a vector width and included by conv.c twice: for
 * AVX2 (VL=8, NR=24) and for AVX-512 (VL=16, NR=32). The includer defines VEC, VL, NR, VLOAD,
 * VBCAST, VSET1, VFMA, VZERO, VADD, VACT (activation), VSTORE, VSTREAM (non-temporal store) and the
 * names TILE, GATHER, TILES, CONV2D.
 * See conv.c for the algorithm. */
#define XB (NR * (240 / NR))  /* column block (pixels), a multiple of NR */


/* acc[MR][nv] += sum_k a[k][MR] * b_k[0 : nv*VL], b_k at base + c*cs + ky*rs + kx*xs. */
static inline __attribute__((always_inline)) void
TILE(const float *a, const float *b, long cs, long rs, long xs, int C, int kh, int kw, const int nv,
     const float *bias, int act, VEC al, VEC be, float *y, long ys, int mvalid, int nvalid, int nt)
{
    VEC c00 = VZERO(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00,
           c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;
    for (int c = 0; c < C; c++) {
        for (int ky = 0; ky < kh; ky++) {
            const float *p = b + c * cs + ky * rs;
            for (int kx = 0; kx < kw; kx++, p += xs, a += MR) {
                VEC b0 = VLOAD(p), b1 = b0, b2 = b0, w;
                if (nv > 1) b1 = VLOAD(p + VL);
                if (nv > 2) b2 = VLOAD(p + 2 * VL);
#define ROW(i)                                                         \
                w = VBCAST(a + i);                        \
                c##i##0 = VFMA(w, b0, c##i##0);             \
                if (nv > 1) c##i##1 = VFMA(w, b1, c##i##1); \
                if (nv > 2) c##i##2 = VFMA(w, b2, c##i##2);
                ROW(0) ROW(1) ROW(2) ROW(3)
#undef ROW
            }
        }
    }
    /* Epilogue: bias and activation in registers, then one store per vector. A tile that
     * is not whole (channels past M, pixels past the row end) goes through a small buffer. */
    VEC acc[MR][3] = {{c00, c01, c02}, {c10, c11, c12}, {c20, c21, c22}, {c30, c31, c32}};
    int whole = mvalid == MR && nvalid == nv * VL;
    float tmp[NR];
    for (int i = 0; i < mvalid; i++) {
        VEC bb = VBCAST(bias + i);
        float *dst = whole ? y + i * ys : tmp;
        if (nt && whole && ((size_t)dst & (sizeof(VEC) - 1)) == 0)  /* see CONV2D's nt */
            for (int j = 0; j < nv; j++) VSTREAM(dst + VL * j, VACT(VADD(acc[i][j], bb), act, al, be));
        else
            for (int j = 0; j < nv; j++) VSTORE(dst + VL * j, VACT(VADD(acc[i][j], bb), act, al, be));
        if (!whole)
            memcpy(y + i * ys, tmp, sizeof(float) * nvalid);
    }
}


/* im2col of one tile: buf[c][ky][kx][0:NR] = x[c, r*sh - pt + ky*dh, (x0+j)*sw - pl + kx*dw]. */
static void GATHER(const conv_args *p, int r, int x0, int n, float *buf)
{
    long hw = (long)p->H * p->W;
    for (int c = 0; c < p->C; c++)
        for (int ky = 0; ky < p->kh; ky++) {
            int iy = r * p->sh - p->pt + ky * p->dh;
            const float *row = p->x + c * hw + (long)iy * p->W;
            for (int kx = 0; kx < p->kw; kx++, buf += NR) {
                if (iy < 0 || iy >= p->H) { memset(buf, 0, sizeof(float) * NR); continue; }
                int ix = x0 * p->sw - p->pl + kx * p->dw;
                for (int j = 0; j < NR; j++, ix += p->sw)
                    buf[j] = (j < n && ix >= 0 && ix < p->W) ? row[ix] : 0.0f;
            }
        }
}

static void TILES(const conv_args *p, const float *b, long cs, long rs, long xs, int nv, int r, int x0,
                  int n, VEC al, VEC be)
{
    long K = (long)p->C * p->kh * p->kw, plane = p->ys;
    for (int m = 0; m < p->M; m += MR) {
        const float *a = p->wp + (long)m * K;
        float *y = p->y + m * plane + (long)r * p->Wo + x0;
        int mv = p->M - m < MR ? p->M - m : MR;
        if (nv == 3) TILE(a, b, cs, rs, xs, p->C, p->kh, p->kw, 3, p->bias + m, p->act, al, be, y, plane, mv, n, p->nt);
        else if (nv == 2) TILE(a, b, cs, rs, xs, p->C, p->kh, p->kw, 2, p->bias + m, p->act, al, be, y, plane, mv, n, p->nt);
        else TILE(a, b, cs, rs, xs, p->C, p->kh, p->kw, 1, p->bias + m, p->act, al, be, y, plane, mv, n, p->nt);
    }
}

/* One image, output rows [r0, r1). Returns 0, or -1 when the gather buffer cannot be had. */
int CONV2D(const float *x, int C, int H, int W, const float *wpack, const float *bias, int M,
               int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl,
               int act, float alpha, float beta, float *y, int Ho, int Wo, int r0, int r1, long ys, int nt)
{
    /* nt: store the output with non-temporal stores (an output far bigger than the caches,
     * which the next layer reads from memory anyway: no read-for-ownership of each line). */
    conv_args p = {x, C, H, W, wpack, bias, M, kh, kw, sh, sw, dh, dw, pt, pl, act, alpha, beta, y, Ho, Wo,
                   ys ? ys : (long)Ho * Wo, nt};
    float *buf = aligned_alloc(64, sizeof(float) * (((size_t)C * kh * kw * NR + 15) & ~(size_t)15));
    if (!buf) return -1;
    VEC al = VSET1(alpha), be = VSET1(beta);
    long hw = (long)H * W;
    for (int xb = 0; xb < Wo; xb += XB) {
        int xe = xb + XB < Wo ? xb + XB : Wo;
        for (int r = r0; r < r1; r++) {
            int iy = r * sh - pt;
            int rows_in = iy >= 0 && iy + (kh - 1) * dh < H;
            for (int x0 = xb; x0 < xe; x0 += NR) {
                int n = xe - x0 < NR ? xe - x0 : NR, nv = (n + VL - 1) / VL;
                int ix = x0 - pl;
                if (sh == 1 && sw == 1 && rows_in && ix >= 0 && ix + nv * VL - 1 + (kw - 1) * dw < W) {
                    TILES(&p, x + (long)iy * W + ix, hw, (long)dh * W, dw, nv, r, x0, n, al, be);
                } else {
                    GATHER(&p, r, x0, n, buf);
                    TILES(&p, buf, (long)kh * kw * NR, (long)kw * NR, NR, nv, r, x0, n, al, be);
                }
            }
        }
    }
    if (nt) _mm_sfence();  /* the streamed lines are visible before the caller reads them */
    free(buf);
    return 0;
}

#undef XB
