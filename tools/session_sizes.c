/* The session arena (g4_session_size) of a config at a few context lengths, from
   the config alone (no weights: the sizes depend on the shapes only, as
   `gemma4 info --train` does for the training arena). The README's table under
   "Running a real checkpoint" comes from it:
       cc -O2 -I. -o build/session_sizes tools/session_sizes.c -lm -lpthread
       build/session_sizes data/configs/gemma-4-E2B.json [MAX_CHUNK]
   MAX_CHUNK (tokens per internal forward step) defaults to 64, what gemma4's
   generate and chat use. One thread (no pool): a pool adds its per-thread
   buffers (about 1 MB each). */
#define GEMMA4_IMPLEMENTATION
#include "gemma4.h"
#include <stdlib.h>

int main(int argc, char **argv) {
    static const int ctx[] = {4096, 32768, 131072};
    g4_model *m = (g4_model *)calloc(1, sizeof(g4_model));
    int i;
    if (argc < 2 || !m) { fprintf(stderr, "usage: session_sizes CONFIG.json [MAX_CHUNK]\n"); return 1; }
    if (g4_config_load(&m->config, argv[1]) != G4_OK || g4_plan_build(&m->plan, &m->config) != G4_OK) {
        fprintf(stderr, "session_sizes: %s: not a config gemma4.h accepts\n", argv[1]);
        return 1;
    }
    m->w.layers = (g4_layer_weights *)calloc((size_t)m->config.num_hidden_layers, sizeof(g4_layer_weights));
    snprintf(m->prefix, sizeof m->prefix, "model.");
    for (i = 0; i < 3; i++) {
        g4_session_config sc = g4_session_config_init();
        size_t bytes = 0;
        g4_result r;
        sc.max_context = ctx[i];
        if (argc > 2) sc.max_chunk = atoi(argv[2]);
        if ((r = g4_session_size(m, &sc, &bytes)) != G4_OK) { fprintf(stderr, "session_sizes: %s\n", g4_result_str(r)); return 1; }
        printf("%s: max_context %d, max_chunk %d: %.1f MiB\n", argv[1], sc.max_context, sc.max_chunk, bytes / 1048576.0);
    }
    free(m->w.layers);
    free(m);
    return 0;
}
