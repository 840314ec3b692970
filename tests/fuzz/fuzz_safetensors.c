/* libFuzzer harness: a safetensors file (the bytes are the whole file, in
   memory) parsed, checked for duplicates and overlaps, and bound against a
   tiny one-layer config. When binding succeeds every byte of every bound
   tensor is read, so ASan catches any tensor that points past the buffer.
   Property: no crash, no sanitizer report, every rejection has a message. */
#define GEMMA4_IMPLEMENTATION
#include "../../gemma4.h"

#include <stdlib.h>
#include <string.h>

/* H 4, V 8, I 8, one full layer, 1 head of dim 2, tied embeddings, no PLE */
static const char g_cfg_json[] =
    "{\"model_type\":\"gemma4_text\",\"vocab_size\":8,\"hidden_size\":4,\"intermediate_size\":8,"
    "\"num_hidden_layers\":1,\"num_attention_heads\":1,\"num_key_value_heads\":1,\"head_dim\":2,"
    "\"global_head_dim\":2,\"hidden_size_per_layer_input\":0,\"layer_types\":[\"full_attention\"]}";

static g4_model g_m;
static g4_config g_cfg;
static g4_plan g_plan;
static int g_ready;

static unsigned sum_tensor(const g4_tensor *t) {
    size_t n = 1, i, bytes;
    unsigned s = 0;
    int k;
    if (!t->data) return 0;
    for (k = 0; k < t->ndim; k++) n *= (size_t)t->shape[k];
    bytes = n * g4__dtype_size(t->dtype);
    for (i = 0; i < bytes; i++) s += ((const unsigned char *)t->data)[i];
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    g4__file f;
    g4_result r;
    unsigned char *copy;
    if (!g_ready) {
        if (g4_config_parse(&g_cfg, g_cfg_json, strlen(g_cfg_json), "cfg") != G4_OK) abort();
        if (g4_plan_build(&g_plan, &g_cfg) != G4_OK) abort();
        g_ready = 1;
    }
    copy = (unsigned char *)malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    memset(&g_m, 0, sizeof g_m);
    memset(&f, 0, sizeof f);
    g_m.config = g_cfg;
    g_m.plan = g_plan;
    f.path = (char *)"fuzz.safetensors";
    f.bytes = copy;
    f.size = size;
    g_m.files = &f;
    g_m.n_files = 1;
    r = g4__st_parse(&f, 0, &g_m.tensors, &g_m.n_tensors, &g_m.tensors_cap, g_m.error);
    if (r == G4_OK) r = g4__st_finish(&g_m);
    if (r == G4_OK) r = g4__bind_weights(&g_m);
    if (r != G4_OK) {
        if (!g_m.error[0]) abort();
        if (r == G4_ERR_SAFETENSORS && !strstr(g_m.error, "fuzz.safetensors") && !strstr(g_m.error, "tensor '")) abort();
    } else {
        const g4_weights *w = &g_m.w;
        volatile unsigned s = sum_tensor(&w->embed_tokens) + sum_tensor(&w->norm) + sum_tensor(&w->lm_head);
        const g4_layer_weights *lw = &w->layers[0];
        const g4_tensor *all = &lw->input_layernorm;
        size_t k, nt = sizeof *lw / sizeof *all;
        for (k = 0; k < nt; k++) s += sum_tensor(&all[k]);
        (void)s;
    }
    g4__json_free(&f.header);
    free(g_m.tensors);
    free(g_m.w.layers);
    free(copy);
    return 0;
}
