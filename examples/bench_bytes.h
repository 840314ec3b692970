/* bench_bytes.h - what one token reads from the weights, for the benchmarks
   (examples/bench.h's `gemma4 bench`, bench/cuda_bench.c). Include after
   gemma4.h with GEMMA4_IMPLEMENTATION. */
#ifndef G4_BENCH_BYTES_H
#define G4_BENCH_BYTES_H

/* What one token reads and multiplies: every matrix and vector of every
   layer (for MoE only top_k of num_experts experts), the final norm, the
   lm_head, the PLE projection, one embedding row and one PLE row. *elems
   counts weights, so a token costs about 2 * *elems FLOPs. */
static double g4b_bytes_per_token(const g4_model *m, double *elems) {
    const g4_config *c = &m->config;
    double b = 0, e = 0;
    int i, j;
    const g4_tensor *extra[6];
    extra[0] = &m->w.norm; extra[1] = &m->w.lm_head; extra[2] = &m->w.per_layer_model_projection;
    extra[3] = &m->w.per_layer_projection_norm; extra[4] = NULL; extra[5] = NULL;
    for (i = 0; i <= c->num_hidden_layers; i++) {
        const g4_tensor *lt = i < c->num_hidden_layers ? (const g4_tensor *)(const void *)&m->w.layers[i] : NULL;
        int n = lt ? (int)(sizeof(g4_layer_weights) / sizeof(g4_tensor)) : 4;
        for (j = 0; j < n; j++) {
            const g4_tensor *t = lt ? &lt[j] : extra[j];
            double cnt = 1;
            int k;
            if (!t->data) continue;
            for (k = 0; k < t->ndim; k++) cnt *= (double)t->shape[k];
            if (lt && c->enable_moe_block && (t == &m->w.layers[i].experts_gate_up || t == &m->w.layers[i].experts_down))
                cnt *= (double)c->top_k_experts / (double)c->num_experts;
            e += cnt;
            b += cnt * (double)g4__dtype_size(t->dtype);
        }
    }
    b += (double)g4__dtype_size(m->w.embed_tokens.dtype) * (double)m->w.embed_tokens.shape[1];
    if (m->w.embed_tokens_per_layer.data)
        b += (double)g4__dtype_size(m->w.embed_tokens_per_layer.dtype) * (double)m->w.embed_tokens_per_layer.shape[1];
    if (elems) *elems = e;
    return b;
}

#endif /* G4_BENCH_BYTES_H */
