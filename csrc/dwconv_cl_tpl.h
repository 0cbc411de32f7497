/* The channels-in-lanes depthwise conv, written once for L channels a vector and included by
 * dwconv_cl.c twice (8 lanes AVX2, 16 lanes AVX-512); see there for the algorithm. The includer
 * defines DW_NAME, L, VEC, VLOADU, VLOADA, VSTOREA, VFMA and VACT. */
int DW_NAME(const float *x, int C, int H, int W, const float *w, const float *bias,
            int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl,
            int act, float alpha, float beta, float *y, int Ho, int Wo, int c0, int c1)
{
    (void)C;
    int Hp = (Ho - 1) * sh + (kh - 1) * dh + 1, Wp = (Wo - 1) * sw + (kw - 1) * dw + 1;
    if (Wp < pl + W) Wp = pl + W;  /* (the copy writes whole input rows) */
    if (Hp < pt + H) Hp = pt + H;
    int taps = kh * kw;
    long npix = (long)Ho * Wo;
    float *buf = aligned_alloc(sizeof(VEC), sizeof(float) * L * ((size_t)Hp * Wp + npix + 8));
    VEC *wv = aligned_alloc(sizeof(VEC), sizeof(VEC) * (size_t)taps);
    long *off = malloc(sizeof(long) * (size_t)(taps + npix));
    if (!buf || !wv || !off) { free(buf); free(wv); free(off); return -1; }
    long *poff = off + taps;  /* output pixel -> its window's first float in buf */
    for (long i = 0; i < npix; i++) poff[i] = ((i / Wo) * sh * (long)Wp + (i % Wo) * sw) * L;
    float *out = buf + L * (size_t)Hp * Wp;
    for (int ky = 0; ky < kh; ky++)
        for (int kx = 0; kx < kw; kx++) off[ky * kw + kx] = ((long)ky * dh * Wp + (long)kx * dw) * L;
    __m256 al = _mm256_set1_ps(alpha), be = _mm256_set1_ps(beta);
    for (int cb = c0; cb < c1; cb += L) {
        int nl = c1 - cb < L ? c1 - cb : L;
        /* the padded, interleaved input: the pad rows and columns zero, each input row a run */
        memset(buf, 0, sizeof(float) * L * (size_t)pt * Wp);
        for (int iy = 0; iy < H; iy++) {
            float *row = buf + L * ((size_t)(iy + pt) * Wp);
            memset(row, 0, sizeof(float) * L * pl);
            const float *src[L];
            for (int l = 0; l < L; l++) src[l] = x + ((long)(cb + (l < nl ? l : 0)) * H + iy) * W;
            interleave(row + L * pl, src, nl, W, L);
            memset(row + L * (pl + W), 0, sizeof(float) * L * (Wp - pl - W));
        }
        memset(buf + L * ((size_t)(pt + H) * Wp), 0, sizeof(float) * L * (size_t)(Hp - pt - H) * Wp);
        for (int t = 0; t < taps; t++) {
            float v[L];
            for (int l = 0; l < L; l++) v[l] = l < nl ? w[(long)(cb + l) * taps + t] : 0.0f;
            wv[t] = VLOADU(v);
        }
        float bv[L];
        for (int l = 0; l < L; l++) bv[l] = bias && l < nl ? bias[cb + l] : 0.0f;
        VEC b0 = VLOADU(bv);
        /* output pixels in flattened order, eight at a time whatever the row length (a 7x7 map
         * is six groups and one pixel, not seven rows of 4 + 3) */
        long p = 0;
        for (; p + 8 <= npix; p += 8) {
            VEC a[8];
            for (int u = 0; u < 8; u++) a[u] = b0;
            for (int t = 0; t < taps; t++) {
                const float *q = buf + off[t];
                for (int u = 0; u < 8; u++) a[u] = VFMA(wv[t], VLOADA(q + poff[p + u]), a[u]);
            }
            for (int u = 0; u < 8; u++) VSTOREA(out + L * (p + u), VACT(a[u], act, al, be));
        }
        for (; p < npix; p++) {
            VEC a0 = b0;
            for (int t = 0; t < taps; t++) a0 = VFMA(wv[t], VLOADA(buf + off[t] + poff[p]), a0);
            VSTOREA(out + L * p, VACT(a0, act, al, be));
        }
        float *dst[L];
        for (int l = 0; l < L; l++) dst[l] = y + (long)(cb + (l < nl ? l : 0)) * npix;
        deinterleave(dst, out, nl, npix, L);
    }
    free(off);
    free(wv);
    free(buf);
    return 0;
}
