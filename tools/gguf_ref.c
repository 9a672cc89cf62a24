/* llama.cpp reference outputs for one GGUF file (built and run by
 * tools/make_gguf_ref.py, which pins the versions and writes
 * fixtures/gguf/REF.json).
 *
 * Pinned: llama.cpp as vendored by llama-cpp-python 0.3.36 (libllama 0.5.0,
 * ggml 0.25.3), CPU backend only, built Release with GGML_NATIVE=OFF.
 *
 * Usage:
 *   gguf_ref MODEL.gguf PROMPT_IDS SEQ_IDS N_NEW [--repack]
 * PROMPT_IDS and SEQ_IDS are comma-separated token ids, passed to
 * llama_decode as they are (no tokenizer, no BOS). Writes one JSON object
 * on stdout:
 *   greedy        N_NEW ids decoded greedily after PROMPT_IDS (argmax,
 *                 ties to the lowest id; the eos id does not stop it),
 *                 prompt in one batch, then one token per llama_decode
 *   greedy_margin top1 - top2 logit at each of those steps
 *   tf_argmax     argmax of the logits at every position of SEQ_IDS, from
 *                 one llama_decode of the whole sequence (fresh KV cache)
 *   tf_margin     top1 - top2 logit at every position of that pass
 *   logits_first  all logits at position 0 of that pass
 *   logits_last   all logits at the last position of that pass
 *   tf_seq_argmax, tf_seq_margin, logits_last_seq
 *                 the same teacher forcing with one token per llama_decode
 *                 (fresh KV cache): the path llama.cpp decodes with. Its
 *                 values differ from the one-batch pass wherever ggml's
 *                 batched matmuls sum in another order than its vec_dot
 *   tf_router_gap at every position of the teacher-forced pass, the
 *                 smallest gap over the layers between the k-th and the
 *                 (k+1)-th router logit (ffn_moe_logits-L, read through the
 *                 scheduler's eval callback; also ffn_moe_probs_biased-L
 *                 where a selection bias exists): the expert choice's margin
 *   min_router_gap_greedy  the same minimum over every greedy decode call
 * plus the settings used. Floats are printed with 9 significant digits
 * (enough to round-trip an f32).
 *
 * Settings: n_threads = n_threads_batch = 1, K and V cache F32, flash
 * attention disabled, n_ctx 256, n_batch = n_ubatch = 256, one sequence,
 * no GPU layers, no warmup (the library does none by itself; the common/
 * helpers that do are not used). Weight repacking into the CPU "extra"
 * buffer types is off unless --repack, so every matmul runs ggml-cpu's
 * plain vec_dot for the file's type. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "llama.h"

#define N_CTX 256
#define MAX_EXPERTS 256

/* Router-logit capture for the decode call in progress: per row of the
 * batch, the smallest gap (over the layers) between the k-th and the
 * (k+1)-th largest router logit. The last layer keeps only the output rows
 * (inp_out_ids) before its FFN; in the teacher-forced pass every row is an
 * output, so row j is position j there. */
static struct {
    int k;            /* experts used per token */
    float gap[N_CTX]; /* by row of the batch */
} router;

static int router_on = 1;

static bool router_cb(struct ggml_tensor *t, bool ask, void *ud) {
    (void)ud;
    /* the raw router logits, and, where the family adds a selection bias
     * (GLM-4.x, DeepSeek), the biased scores the choice is made on; the
     * smaller of the two gaps is kept */
    /* gpt-oss adds a bias to the logits themselves (ffn_moe_logits_biased-L) */
    const char *p = "ffn_moe_logits-", *pb = "ffn_moe_probs_biased-", *pl = "ffn_moe_logits_biased-";
    if (strncmp(t->name, p, strlen(p)) != 0 && strncmp(t->name, pb, strlen(pb)) != 0 &&
        strncmp(t->name, pl, strlen(pl)) != 0)
        return !ask;
    if (ask) return true;
    const int ne = (int)t->ne[0], nt = (int)t->ne[1], k = router.k;
    if (t->type != GGML_TYPE_F32 || k < 1 || k >= ne || nt > N_CTX) return true;
    float *buf = malloc(sizeof(float) * ne * nt);
    ggml_backend_tensor_get(t, buf, 0, sizeof(float) * ne * nt);
    for (int j = 0; j < nt; j++) {
        const float *x = buf + (size_t)j * ne;
        /* the k-th and (k+1)-th largest: k+1 rounds of selection */
        float prev = INFINITY, kth = 0, next = 0;
        int prev_idx = -1;
        for (int r = 0; r <= k; r++) {
            int bi = -1;
            for (int e = 0; e < ne; e++) {
                /* strictly below the previous pick, or equal to it with a
                 * larger index: ties are kept as distinct entries */
                int below = x[e] < prev || (x[e] == prev && e > prev_idx);
                if (below && (bi < 0 || x[e] > x[bi])) bi = e;
            }
            prev = x[bi];
            prev_idx = bi;
            if (r == k - 1) kth = prev;
            if (r == k) next = prev;
        }
        if (kth - next < router.gap[j]) router.gap[j] = kth - next;
    }
    free(buf);
    return true;
}

static void router_reset(void) {
    for (int i = 0; i < N_CTX; i++) router.gap[i] = INFINITY;
}

static float router_min(void) {
    float m = INFINITY;
    for (int i = 0; i < N_CTX; i++)
        if (router.gap[i] < m) m = router.gap[i];
    return m;
}

static void quiet_log(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    if (level == GGML_LOG_LEVEL_ERROR || getenv("GGUF_REF_VERBOSE"))
        fputs(text, stderr);
}

static int parse_ids(const char *s, llama_token *out, int cap) {
    int n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || n >= cap) return -1;
        out[n++] = (llama_token)v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

/* index of the largest value, lowest index on ties; *margin = top1 - top2 */
static int argmax(const float *x, int n, float *margin) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    float second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != best && x[i] > second) second = x[i];
    if (margin) *margin = x[best] - second;
    return best;
}

static void fill_batch(struct llama_batch *b, const llama_token *ids, int n, int pos0, int all_logits) {
    b->n_tokens = n;
    for (int i = 0; i < n; i++) {
        b->token[i] = ids[i];
        b->pos[i] = pos0 + i;
        b->n_seq_id[i] = 1;
        b->seq_id[i][0] = 0;
        b->logits[i] = all_logits || i == n - 1;
    }
}

static void print_floats(const char *name, const float *x, int n) {
    printf("\"%s\":[", name);
    for (int i = 0; i < n; i++) printf(i ? ",%.9g" : "%.9g", x[i]);
    printf("]");
}

static void print_ints(const char *name, const int *x, int n) {
    printf("\"%s\":[", name);
    for (int i = 0; i < n; i++) printf(i ? ",%d" : "%d", x[i]);
    printf("]");
}

int main(int argc, char **argv) {
    if (argc < 5 || argc > 6 || (argc == 6 && strcmp(argv[5], "--repack"))) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT_IDS SEQ_IDS N_NEW [--repack]\n", argv[0]);
        return 2;
    }
    const int repack = argc == 6;
    llama_token prompt[N_CTX], seq[N_CTX];
    int n_prompt = parse_ids(argv[2], prompt, N_CTX);
    int n_seq = parse_ids(argv[3], seq, N_CTX);
    int n_new = atoi(argv[4]);
    if (n_prompt <= 0 || n_seq <= 0 || n_new < 0 || n_prompt + n_new > N_CTX) {
        fprintf(stderr, "bad token lists or N_NEW\n");
        return 2;
    }

    llama_log_set(quiet_log, NULL);
    llama_backend_init();

    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.use_extra_bufts = repack;
    mp.check_tensors = true;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    {
        char arch[64], key[128], val[32];
        if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch) < 0) arch[0] = 0;
        snprintf(key, sizeof key, "%s.expert_used_count", arch);
        router.k = llama_model_meta_val_str(model, key, val, sizeof val) < 0 ? 0 : atoi(val);
    }
    router_on = router.k > 0 && !getenv("GGUF_REF_NO_ROUTER");

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = N_CTX;
    cp.n_batch = N_CTX;
    cp.n_ubatch = N_CTX;
    cp.n_seq_max = 1;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.offload_kqv = false;
    cp.op_offload = false;
    cp.no_perf = true;
    if (router_on) {
        cp.cb_eval = router_cb;
        cp.cb_eval_user_data = NULL;
    }
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot create a context\n");
        return 1;
    }

    struct llama_batch batch = llama_batch_init(N_CTX, 0, 1);

    /* (a) greedy decoding */
    int *greedy = malloc(sizeof(int) * (n_new + 1));
    float *greedy_margin = malloc(sizeof(float) * (n_new + 1));
    router_reset();
    fill_batch(&batch, prompt, n_prompt, 0, 0);
    if (llama_decode(ctx, batch)) { fprintf(stderr, "decode (prompt) failed\n"); return 1; }
    for (int t = 0; t < n_new; t++) {
        const float *lg = llama_get_logits_ith(ctx, -1);
        llama_token next = argmax(lg, n_vocab, &greedy_margin[t]);
        greedy[t] = next;
        if (t + 1 == n_new) break;
        fill_batch(&batch, &next, 1, n_prompt + t, 0);
        if (llama_decode(ctx, batch)) { fprintf(stderr, "decode (step %d) failed\n", t); return 1; }
    }

    /* (b) teacher forcing: the whole sequence in one batch, fresh cache */
    const float greedy_router = router_min();
    llama_memory_clear(llama_get_memory(ctx), true);
    router_reset();
    fill_batch(&batch, seq, n_seq, 0, 1);
    if (llama_decode(ctx, batch)) { fprintf(stderr, "decode (sequence) failed\n"); return 1; }
    int *tf_arg = malloc(sizeof(int) * n_seq);
    float *tf_margin = malloc(sizeof(float) * n_seq);
    float *first = malloc(sizeof(float) * n_vocab), *last = malloc(sizeof(float) * n_vocab);
    for (int i = 0; i < n_seq; i++) {
        const float *lg = llama_get_logits_ith(ctx, i);
        tf_arg[i] = argmax(lg, n_vocab, &tf_margin[i]);
        if (i == 0) memcpy(first, lg, sizeof(float) * n_vocab);
        if (i == n_seq - 1) memcpy(last, lg, sizeof(float) * n_vocab);
    }

    float *tf_router = malloc(sizeof(float) * n_seq);
    for (int i = 0; i < n_seq; i++) tf_router[i] = router.gap[i];

    /* (c) teacher forcing one token per decode call, fresh cache */
    llama_memory_clear(llama_get_memory(ctx), true);
    router_reset();
    int *seq_arg = malloc(sizeof(int) * n_seq);
    float *seq_margin = malloc(sizeof(float) * n_seq);
    float *seq_last = malloc(sizeof(float) * n_vocab);
    for (int i = 0; i < n_seq; i++) {
        fill_batch(&batch, &seq[i], 1, i, 1);
        if (llama_decode(ctx, batch)) { fprintf(stderr, "decode (position %d) failed\n", i); return 1; }
        const float *lg = llama_get_logits_ith(ctx, 0);
        seq_arg[i] = argmax(lg, n_vocab, &seq_margin[i]);
        if (i == n_seq - 1) memcpy(seq_last, lg, sizeof(float) * n_vocab);
    }

    char desc[256];
    llama_model_desc(model, desc, sizeof desc);
    printf("{\"model_desc\":\"%s\",\"n_vocab\":%d,", desc, n_vocab);
    printf("\"settings\":{\"n_threads\":1,\"n_threads_batch\":1,\"type_k\":\"f32\",\"type_v\":\"f32\","
           "\"flash_attn\":false,\"n_ctx\":%d,\"n_batch\":%d,\"n_ubatch\":%d,\"repack\":%s},",
           N_CTX, N_CTX, N_CTX, repack ? "true" : "false");
    print_ints("greedy", greedy, n_new);
    printf(",");
    print_floats("greedy_margin", greedy_margin, n_new);
    printf(",");
    print_ints("tf_argmax", tf_arg, n_seq);
    printf(",");
    print_floats("tf_margin", tf_margin, n_seq);
    printf(",");
    print_floats("logits_first", first, n_vocab);
    printf(",");
    print_floats("logits_last", last, n_vocab);
    printf(",");
    print_ints("tf_seq_argmax", seq_arg, n_seq);
    printf(",");
    print_floats("tf_seq_margin", seq_margin, n_seq);
    printf(",");
    print_floats("logits_last_seq", seq_last, n_vocab);
    printf(",\"n_expert_used\":%d", router.k);
    if (router_on) {
        printf(",");
        print_floats("tf_router_gap", tf_router, n_seq);
        printf(",\"min_router_gap_greedy\":%.9g", greedy_router);
    }
    printf("}\n");

    free(seq_arg); free(seq_margin); free(seq_last);
    free(tf_router); free(greedy); free(greedy_margin); free(tf_arg); free(tf_margin); free(first); free(last);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
