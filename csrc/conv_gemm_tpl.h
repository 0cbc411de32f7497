/* The conv GEMM of conv_gemm.c, written once for a vector width and included twice: AVX2
 * (VL 8, MR 8, NVM 1) and AVX-512 (VL 16, MR 8, NVM 3). The includer defines VEC, VL, MR, NVM
 * (optional), VLOAD, VBCAST, VSET1, VFMA, VZERO, VADD, VACT, VSTORE, STORE_PART (the first n
 * floats of a vector) and the names KERNEL, CONVG; npr_scratch() and par.h come before. */
#ifndef NVM
#define NVM 3           /* vectors of pixels per tile */
#endif
#define NR (NVM * VL)   /* pixels per tile */
#ifndef PLANE_BYTES
#define PLANE_BYTES (512L << 10)  /* 16->32 3x3 s2 on 160x160: 0.75 -> 0.58 ms; 128-512 KB within 5% elsewhere */
#endif
#ifndef PF_DIST
#define PF_DIST 512  /* floats ahead in the weights: 0.37 -> 0.24 ms cold on 256->64 3x3 10x10, no loss warm */
#endif

/* y[0:mv][0:n] (pitch ys) = act(bias + sum_k a[k][0:MR] * b[off[k] : off[k] + nv*VL]) */
static inline __attribute__((always_inline)) void
KERNEL(const float *a, const float *b, const long *off, long K, const int nv, const float *bias,
       int act, float alpha, float beta, float *y, long ys, int mv, int n)
{
    VEC acc[MR][NVM];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NVM; j++) acc[i][j] = VZERO();
    /* alpha, beta become vectors only after the loop: every register is an accumulator */
    for (const long *oe = off + K; off < oe; off++, a += MR) {
        const float *bk = b + *off;
        /* the weights stream from memory on a node's first tile (YOLOv8n's 10x10 convs: 590 KB,
         * 0.22 -> 0.36 ms cold); the hardware prefetcher alone keeps too few lines in flight */
        __builtin_prefetch(a + PF_DIST);
        VEC bv[NVM];
#pragma GCC unroll 4
        for (int j = 0; j < NVM; j++) if (j < nv) bv[j] = VLOAD(bk + j * VL);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            VEC w = VBCAST(a + i);
#pragma GCC unroll 4
            for (int j = 0; j < NVM; j++) if (j < nv) acc[i][j] = VFMA(w, bv[j], acc[i][j]);
        }
    }
    VEC al = VSET1(alpha), be = VSET1(beta);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        if (i >= mv) break;
        VEC bb = VBCAST(bias + i);
        float *dst = y + i * ys;
#pragma GCC unroll 4
        for (int j = 0; j < NVM; j++) {
            if (j >= nv) break;
            VEC v = VACT(VADD(acc[i][j], bb), act, al, be);
            if ((j + 1) * VL <= n) VSTORE(dst + j * VL, v);
            else STORE_PART(dst + j * VL, v, n - j * VL);
        }
    }
}

/* One out-of-line copy per vector count: inlined into CONVG, the accumulators compete with
 * its pointers for registers and gcc spills a third of them. */
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define KERNEL_NV(nv)                                                                          \
static __attribute__((noinline)) void CAT(KERNEL, nv)(const float *a, const float *b,           \
    const long *off, long K, const float *bias, int act, float alpha, float beta, float *y,     \
    long ys, int mv, int n)                                                                    \
{ KERNEL(a, b, off, K, nv, bias, act, alpha, beta, y, ys, mv, n); }
KERNEL_NV(1)
KERNEL_NV(2)
KERNEL_NV(3)

/* All output channels of one tile: y[m][0:n] (pitch ys) for every block of MR channels. */
static void CAT(KERNEL, _all)(const float *wp, const float *b, const long *off, long K,
                              const float *bias, int M, int act, float alpha, float beta,
                              float *y, long ys, int n)
{
    int nv = (n + VL - 1) / VL;
    for (int m = 0; m < M; m += MR) {
        int mv = M - m < MR ? M - m : MR;
        const float *a = wp + (long)m * K;
        float *yo = y + m * ys;
        if (nv == 3) CAT(KERNEL, 3)(a, b, off, K, bias + m, act, alpha, beta, yo, ys, mv, n);
        else if (nv == 2) CAT(KERNEL, 2)(a, b, off, K, bias + m, act, alpha, beta, yo, ys, mv, n);
        else CAT(KERNEL, 1)(a, b, off, K, bias + m, act, alpha, beta, yo, ys, mv, n);
    }
}

/* Output rows [r0, r1) read the input through "phase planes": for strides (sh, sw) the padded
 * input splits into sh*sw planes, plane (py, px) holding rows py, py+sh, ... and columns px,
 * px+sw, ... of it, each of row pitch Wp = Wo + (kw-1)*dw/sw. Tap (c, ky, kx) of output pixel
 * q = row*Wp + col is then plane ((ky*dh) % sh, (kx*dw) % sw) of channel c at
 * q + ((ky*dh)/sh)*Wp + (kx*dw)/sw: contiguous in q whatever the stride, so there is no
 * im2col (stride 1: one plane, the zero-padded rows themselves). Tiles run over q; the Wp - Wo
 * wrapped columns of each row are computed into a tile buffer and dropped when it is copied
 * out. Copying the planes costs ~C*H*W floats, against K*Ho*Wo for an im2col. */
typedef struct { const float *xp; const long *off; long Wp, total; int r0; } CAT(CONVG, _sh);

/* The two column phases (px = 0, 1) of rows [0, rows) of channel c's planes for row phase py,
 * stride 2 along the columns: d0[i*Wp + j] = x[c, (r0+i)*sh + py - pt, 2j - pl], d1 the same
 * at 2j + 1 - pl, zero outside the input. The columns whose two reads are both inside go
 * through deinterleave2 (YOLOv8n's stride-2 convs spent ~20% of their time in the scalar
 * strided copy); the few at the edges one by one. */
static void CAT(CONVG, _phase2)(const float *x, int c, int H, int W, int r0, long rows, int sh, int py,
                                int pt, int pl, long Wp, float *d0, float *d1)
{
    /* 2j - pl >= 0 and 2j + 1 - pl < W (floored: a 1-wide unpadded row has no such j) */
    long t = (long)W - 2 + pl, jlo = (pl + 1) / 2, jhi = t >= 0 ? t / 2 + 1 : 0;
    if (jhi > Wp) jhi = Wp;
    if (jlo > jhi) jlo = jhi;
    for (long i = 0; i < rows; i++, d0 += Wp, d1 += Wp) {
        long iy = (r0 + i) * sh + py - pt;
        if (iy < 0 || iy >= H) {
            memset(d0, 0, sizeof(float) * Wp);
            memset(d1, 0, sizeof(float) * Wp);
            continue;
        }
        const float *src = x + (c * (long)H + iy) * W;
        for (long j = 0; j < Wp; j++) {
            if (j == jlo && jhi > jlo) {  /* (an empty run would loop here for ever) */
                deinterleave2(src + 2 * jlo - pl, d0 + jlo, d1 + jlo, jhi - jlo);
                j = jhi - 1;
                continue;
            }
            long a = 2 * j - pl, b = a + 1;
            d0[j] = a >= 0 && a < W ? src[a] : 0.0f;
            d1[j] = b >= 0 && b < W ? src[b] : 0.0f;
        }
    }
}

/* The phase planes and the tap offsets, in the calling thread's scratch slot 0. */
static int CAT(CONVG, _prep)(const float *x, int C, int H, int W, int kh, int kw, int sh, int sw, int dh,
                             int dw, int pt, int pl, int Wo, int r0, int r1, CAT(CONVG, _sh) *s)
{
    long Wp = Wo + (long)(kw - 1) * dw / sw, rows = (r1 - r0) + (long)(kh - 1) * dh / sh + 1;
    long cp = rows * Wp, K = (long)C * kh * kw, planes = (long)C * sh * sw;
    size_t nx = ((size_t)planes * cp + NR + 15) & ~(size_t)15;
    float *xp = npr_scratch(0, sizeof(float) * nx + sizeof(long) * (size_t)K);
    if (!xp) return -1;
    long *off = (long *)(xp + nx);
    float *d = xp;
    for (int c = 0; c < C; c++)
        for (int py = 0; py < sh; py++)
            for (int px = 0; px < sw; px++) {
                if (sw == 2 && px == 0) {  /* both column phases of each row in one pass */
                    CAT(CONVG, _phase2)(x, c, H, W, r0, rows, sh, py, pt, pl, Wp, d, d + cp);
                    d += 2 * cp;
                    break;
                }
                for (long i = 0; i < rows; i++, d += Wp) {
                    /* d[j] = x[c, (r0 + i)*sh + py - pt, j*sw + px - pl], 0 outside */
                    long iy = (r0 + i) * sh + py - pt;
                    if (iy < 0 || iy >= H) { memset(d, 0, sizeof(float) * Wp); continue; }
                    long ix = px - pl;  /* input column of j = 0 */
                    long lo = ix >= 0 ? 0 : (-ix + sw - 1) / sw, hi = ix < W ? (W - ix + sw - 1) / sw : 0;
                    if (hi > Wp) hi = Wp;
                    if (lo > hi) lo = hi;
                    const float *src = x + (c * (long)H + iy) * W + ix;
                    for (long j = 0; j < lo; j++) d[j] = 0.0f;
                    if (sw == 1) memcpy(d + lo, src + lo, sizeof(float) * (hi - lo));
                    else if (sw == 2) for (long j = lo; j < hi; j++) d[j] = src[2 * j];
                    else for (long j = lo; j < hi; j++) d[j] = src[j * sw];
                    for (long j = hi; j < Wp; j++) d[j] = 0.0f;
                }
            }
    memset(d, 0, sizeof(float) * (nx - (size_t)(d - xp)));  /* the slack the last tile reads */
    long *o = off;
    for (int c = 0; c < C; c++)
        for (int ky = 0; ky < kh; ky++)
            for (int kx = 0; kx < kw; kx++) {
                long oy = (long)ky * dh, ox = (long)kx * dw;
                *o++ = ((c * sh + oy % sh) * sw + ox % sw) * cp + oy / sh * Wp + ox / sw;
            }
    *s = (CAT(CONVG, _sh)){xp, off, Wp, (r1 - r0) * Wp, r0};
    return 0;
}

/* Output channels [0, M) of the prepared rows (wp, bias, y already offset to the first). */
static int CAT(CONVG, _tiles)(const CAT(CONVG, _sh) *s, long K, const float *wp, const float *bias,
                              int M, int act, float alpha, float beta, float *y, int Ho, int Wo)
{
    long plane = (long)Ho * Wo, Wp = s->Wp;
    int mp = (M + MR - 1) / MR * MR;
    float *tile = npr_scratch(1, sizeof(float) * (size_t)mp * NR);
    if (!tile) return -1;
    for (long q = 0; q < s->total; q += NR) {
        int n = s->total - q < NR ? (int)(s->total - q) : NR;
        CAT(KERNEL, _all)(wp, s->xp + q, s->off, K, bias, M, act, alpha, beta, tile, NR, (n + VL - 1) / VL * VL);
        for (int j = 0; j < n;) {  /* row segments of the tile: padded (row, col) -> y */
            long row = (q + j) / Wp, col = (q + j) % Wp;
            int len = Wp - col < n - j ? (int)(Wp - col) : n - j;
            if (col < Wo) {
                int cnt = Wo - col < len ? (int)(Wo - col) : len;
                float *dst = y + (s->r0 + row) * Wo + col;
                for (int m = 0; m < M; m++)
                    memcpy(dst + m * plane, tile + m * NR + j, sizeof(float) * cnt);
            }
            j += len;
        }
    }
    return 0;
}

/* One image, flattened output pixels [p0, p1). wp: (ceil(M/MR), K, MR), bias padded to MR.
 * A 1x1 stride-1 unpadded conv reads x in place (channel pitch H*W; a last tile that would run
 * past the plane goes through a copy); the others read phase planes (above; p0, p1 must then
 * be whole rows). Returns 0, or -1 when a buffer cannot be had. */
int CONVG(const float *x, int C, int H, int W, const float *wp, const float *bias, int M,
          int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl,
          int act, float alpha, float beta, float *y, int Ho, int Wo, long p0, long p1)
{
    long K = (long)C * kh * kw, plane = (long)Ho * Wo;
    int direct = kh == 1 && kw == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0 && Ho == H && Wo == W;
    if (!direct) {
        /* rows in sub-bands whose planes stay in L2 (PLANE_BYTES), each with its own halo */
        int r0 = (int)(p0 / Wo), r1 = (int)((p1 + Wo - 1) / Wo);
        long row_bytes = 4L * C * sh * sw * (Wo + (long)(kw - 1) * dw / sw);
        int halo = (kh - 1) * dh / sh + 1, rb = (int)(PLANE_BYTES / row_bytes) - halo;
        if (rb < 1) rb = 1;
        for (int r = r0; r < r1; r += rb) {
            CAT(CONVG, _sh) s;
            int re = r + rb < r1 ? r + rb : r1;
            if (CAT(CONVG, _prep)(x, C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, Wo, r, re, &s)) return -1;
            if (CAT(CONVG, _tiles)(&s, K, wp, bias, M, act, alpha, beta, y, Ho, Wo)) return -1;
        }
        return 0;
    }
    float *buf = npr_scratch(0, sizeof(float) * (size_t)K * NR + 2 * sizeof(long) * (size_t)K);
    if (!buf) return -1;
    long *off = (long *)(buf + K * NR), *offd = off + K;
    for (long k = 0; k < K; k++) { off[k] = k * NR; offd[k] = k * plane; }
    for (long p = p0; p < p1; p += NR) {
        int n = p1 - p < NR ? (int)(p1 - p) : NR, nv = (n + VL - 1) / VL;
        if (p + nv * VL <= plane) {
            CAT(KERNEL, _all)(wp, x + p, offd, K, bias, M, act, alpha, beta, y + p, plane, n);
        } else {  /* the plane's last tile: its pixels copied, the rest of the vectors zero */
            for (long k = 0; k < K; k++) {
                memcpy(buf + k * NR, x + k * plane + p, sizeof(float) * n);
                memset(buf + k * NR + n, 0, sizeof(float) * (NR - n));
            }
            CAT(KERNEL, _all)(wp, buf, off, K, bias, M, act, alpha, beta, y + p, plane, n);
        }
    }
    return 0;
}

/* CONVG over all pixels of one image on `threads` threads (par.h), in chunks claimed one at a
 * time: blocks of MR output channels when split_m (the phase planes are then made once, here,
 * for all chunks), else bands of output rows (each makes its own rows' planes), or of NR-pixel
 * tiles for an in-place 1x1 conv. */
typedef struct {
    const float *x; int C, H, W; const float *wp, *bias; int M, kh, kw, sh, sw, dh, dw, pt, pl, act;
    float alpha, beta; float *y; int Ho, Wo, split_m, chunks; long step, lo, hi; CAT(CONVG, _sh) s;
    atomic_int rc;
} CAT(CONVG, _job);

static void CAT(CONVG, _chunk)(void *ctx, int i)
{
    CAT(CONVG, _job) *j = ctx;
    long K = (long)j->C * j->kh * j->kw, plane = (long)j->Ho * j->Wo;
    int rc;
    if (j->split_m) {  /* chunk i: blocks [b0, b1) */
        int nb = (j->M + MR - 1) / MR, b0 = (int)par_at(0, nb, i, j->chunks), b1 = (int)par_at(0, nb, i + 1, j->chunks);
        int m0 = b0 * MR, m1 = b1 * MR < j->M ? b1 * MR : j->M;
        if (m1 <= m0) return;
        if (j->s.xp)
            rc = CAT(CONVG, _tiles)(&j->s, K, j->wp + m0 * K, j->bias + m0, m1 - m0, j->act, j->alpha,
                                    j->beta, j->y + m0 * plane, j->Ho, j->Wo);
        else
            rc = CONVG(j->x, j->C, j->H, j->W, j->wp + m0 * K, j->bias + m0, m1 - m0, j->kh, j->kw, j->sh,
                       j->sw, j->dh, j->dw, j->pt, j->pl, j->act, j->alpha, j->beta, j->y + m0 * plane,
                       j->Ho, j->Wo, 0, plane);
    } else {  /* chunk i: pixels lo + [i*step, (i+1)*step), step = whole rows or whole tiles */
        long p0 = j->lo + i * j->step, p1 = p0 + j->step < j->hi ? p0 + j->step : j->hi;
        if (p1 <= p0) return;
        rc = CONVG(j->x, j->C, j->H, j->W, j->wp, j->bias, j->M, j->kh, j->kw, j->sh, j->sw, j->dh,
                   j->dw, j->pt, j->pl, j->act, j->alpha, j->beta, j->y, j->Ho, j->Wo, p0, p1);
    }
    if (rc) atomic_store(&j->rc, rc);
}

int CAT(CONVG, _mt)(const float *x, int C, int H, int W, const float *wp, const float *bias, int M,
                    int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl,
                    int act, float alpha, float beta, float *y, int Ho, int Wo, int threads, int split_m,
                    long lo, long hi)
{
    /* Pixels [lo, hi) only (whole rows; split_m: all of them): a piece of the node, with a
     * preemption point after it (nativeconv.py, backends/pieces.py). */
    CAT(CONVG, _job) j = {x, C, H, W, wp, bias, M, kh, kw, sh, sw, dh, dw, pt, pl, act, alpha, beta,
                          y, Ho, Wo, split_m, 0, 0, lo, hi, {0}, 0};
    long plane = hi - lo;
    int direct = kh == 1 && kw == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0 && Ho == H && Wo == W;
    if (split_m) {
        int nb = (M + MR - 1) / MR;
        j.chunks = nb < 2 * threads ? nb : 2 * threads;
        if (!direct && CAT(CONVG, _prep)(x, C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, Wo, 0, Ho, &j.s))
            return -1;
    } else if (!direct) {
        long rows = (plane + Wo - 1) / Wo;
        j.chunks = rows < 2 * threads ? (int)rows : 2 * threads;
        j.step = (rows + j.chunks - 1) / j.chunks * Wo;
    } else {
        long tiles = (plane + NR - 1) / NR;
        j.chunks = tiles < 2 * threads ? (int)tiles : 2 * threads;
        j.step = (tiles + j.chunks - 1) / j.chunks * NR;
    }
    par_run(CAT(CONVG, _chunk), &j, j.chunks, threads);
    return atomic_load(&j.rc);
}

/* The weights' packing: MR output channels per block. */
int CAT(CONVG, _mr)(void) { return MR; }
/* Pixels per tile: a single-threaded call's pieces start at multiples of it (same tiles). */
int CAT(CONVG, _nr)(void) { return NR; }
#undef NR
#undef NVM
#undef KERNEL_NV
#undef CAT
#undef CAT_
