// llama_logits: the llama.cpp side of bench/peers.sh's check that the GGUF is
// the same model as the safetensors checkpoint. It runs a prompt of token ids
// through llama.cpp and writes every position's logits, then greedy-decodes
// N more tokens and prints their ids. Built by bench/peers.sh against the
// llama.cpp it builds (not part of `make`).
//   llama_logits MODEL.gguf IDS(2,818,...) N_NEW OUT.f32 [THREADS]
// OUT.f32: n_prompt rows of n_vocab float32 logits, row-major, no header.
// The KV cache is float32 (llama-bench's default is f16), so that with an f32
// GGUF the only rounding left is llama.cpp's own order of operations.
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: llama_logits MODEL.gguf IDS N_NEW OUT.f32 [THREADS]\n");
        return 2;
    }
    std::vector<llama_token> ids;
    for (char *s = argv[2]; *s;) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s) { fprintf(stderr, "llama_logits: bad id list '%s'\n", argv[2]); return 2; }
        ids.push_back((llama_token)v);
        s = *end == ',' ? end + 1 : end;
    }
    int n_new = atoi(argv[3]);
    int threads = argc > 5 ? atoi(argv[5]) : 2;
    int n_prompt = (int)ids.size();

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "llama_logits: cannot load %s\n", argv[1]); return 1; }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n_prompt + n_new + 16);
    cp.n_batch = cp.n_ubatch = (uint32_t)n_prompt;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.type_k = cp.type_v = GGML_TYPE_F32;  // the default f16 cache would round K and V
    llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "llama_logits: cannot create a context\n"); return 1; }
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    llama_batch b = llama_batch_init(n_prompt, 0, 1);
    for (int i = 0; i < n_prompt; i++) {
        b.token[i] = ids[i];
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = n_prompt;
    if (llama_decode(ctx, b) != 0) { fprintf(stderr, "llama_logits: decode failed\n"); return 1; }
    FILE *f = fopen(argv[4], "wb");
    if (!f) { fprintf(stderr, "llama_logits: cannot write %s\n", argv[4]); return 1; }
    printf("prompt argmax:");
    for (int i = 0; i < n_prompt; i++) {
        const float *row = llama_get_logits_ith(ctx, i);
        fwrite(row, sizeof(float), (size_t)n_vocab, f);
        printf(" %d", argmax(row, n_vocab));
    }
    fclose(f);
    printf("\ngreedy:");
    llama_token next = argmax(llama_get_logits_ith(ctx, n_prompt - 1), n_vocab);
    for (int t = 0; t < n_new; t++) {
        printf(" %d", next);
        if (t == n_new - 1) break;
        llama_batch one = llama_batch_get_one(&next, 1);
        if (llama_decode(ctx, one) != 0) { fprintf(stderr, "llama_logits: decode failed\n"); return 1; }
        next = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
    }
    printf("\n");
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
