/* Writes fixtures/ggml-kernels/<TYPE>.bin from ggml itself (built by
 * tools/make_ggml_kernel_fixtures.py, which documents the versions and the
 * file layout). For each weight type: random rows quantized by ggml (case 0)
 * or random block bytes with finite scales (case 1), ggml's dequantized
 * values (type traits `to_float`), random activations, the activations as
 * ggml-cpu quantizes them for the type's vec_dot_type (`from_float`), and
 * ggml-cpu's `vec_dot` result. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "ggml.h"
#include "ggml-cpu.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next_u32(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float uniform(void) { return (next_u32() & 0xFFFFFF) / 16777216.0f; }
static float normal(void) {
    float u = uniform() + 1e-7f, v = uniform();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

static void put_u32(FILE *f, uint32_t v) { fwrite(&v, 4, 1, f); }

/* Byte offsets of the f16 scale fields in one block, for the random-byte
 * case (every other byte stays random). -1 ends the list. */
static void scale_offsets(enum ggml_type t, int out[3]) {
    out[0] = out[1] = out[2] = -1;
    switch (t) {
    case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
        out[0] = 0; out[1] = 2; break;
    case GGML_TYPE_Q2_K: out[0] = 80; out[1] = 82; break;
    case GGML_TYPE_Q3_K: out[0] = 108; break;
    case GGML_TYPE_Q6_K: out[0] = 208; break;
    case GGML_TYPE_MXFP4: break;
    default: out[0] = 0; break;
    }
}

static void write_case(FILE *f, enum ggml_type t, int cols, int random_bytes) {
    const struct ggml_type_traits *tr = ggml_get_type_traits(t);
    const struct ggml_type_traits_cpu *cpu = ggml_get_type_traits_cpu(t);
    enum ggml_type at = cpu->vec_dot_type;
    const struct ggml_type_traits_cpu *acpu = ggml_get_type_traits_cpu(at);
    size_t wb = ggml_row_size(t, cols), ab = ggml_row_size(at, cols);
    float *w = malloc(cols * sizeof(float)), *deq = malloc(cols * sizeof(float));
    float *x = malloc(cols * sizeof(float));
    uint8_t *q = malloc(wb), *qa = malloc(ab);
    for (int i = 0; i < cols; i++) w[i] = normal() * 0.05f;
    if (!random_bytes) {
        ggml_quantize_chunk(t, w, q, 0, 1, cols, NULL);
    } else {
        for (size_t i = 0; i < wb; i++) q[i] = (uint8_t)next_u32();
        size_t bs = tr->type_size;
        int offs[3];
        scale_offsets(t, offs);
        for (size_t b = 0; b < wb / bs; b++) {
            uint8_t *blk = q + b * bs;
            if (t == GGML_TYPE_MXFP4) {
                blk[0] = (uint8_t)(112 + next_u32() % 24);
                continue;
            }
            for (int k = 0; k < 3 && offs[k] >= 0; k++) {
                float s = (uniform() * 2.0f - 1.0f) * 0.01f;
                ggml_fp16_t h = ggml_fp32_to_fp16(s);
                memcpy(blk + offs[k], &h, 2);
            }
        }
    }
    tr->to_float(q, deq, cols);
    /* Activations: normal, one block of 32 all zero (the zero-scale path),
     * one large value (a block whose maximum is far from the rest). */
    for (int i = 0; i < cols; i++) x[i] = normal();
    for (int i = 32; i < 64 && i < cols; i++) x[i] = 0.0f;
    if (cols > 100) x[100] = -37.5f;
    acpu->from_float(x, qa, cols);
    float dot = 0.0f;
    cpu->vec_dot(cols, &dot, 0, q, 0, qa, 0, 1);
    put_u32(f, (uint32_t)cols);
    fwrite(q, 1, wb, f);
    fwrite(deq, 4, cols, f);
    fwrite(x, 4, cols, f);
    fwrite(qa, 1, ab, f);
    fwrite(&dot, 4, 1, f);
    free(w); free(deq); free(x); free(q); free(qa);
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]); return 2; }
    ggml_cpu_init();
    const enum ggml_type types[] = {
        GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
        GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
        GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4,
    };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        enum ggml_type t = types[i];
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.bin", argv[1], ggml_type_name(t));
        FILE *f = fopen(path, "wb");
        if (!f) { perror(path); return 1; }
        fwrite("GGKF", 1, 4, f);
        put_u32(f, 1);
        put_u32(f, (uint32_t)t);
        put_u32(f, (uint32_t)ggml_get_type_traits_cpu(t)->vec_dot_type);
        put_u32(f, 2);
        write_case(f, t, 512, 0);
        write_case(f, t, 256, 1);
        fclose(f);
    }
    return 0;
}
