/* The README's API example, kept compiling by `make test`:
       build/minimal data/tiny/e2b_like                                      */
#define GEMMA4_IMPLEMENTATION /* in exactly one file */
#include "../gemma4.h"
#include <stdlib.h>

int main(int argc, char **argv) {
    g4_model model;
    g4_session_config sc;
    g4_session s;
    size_t bytes;
    void *arena;
    float *logits;
    int32_t prompt[] = {2, 81, 101};
    int i;
    if (g4_model_load(&model, argc > 1 ? argv[1] : "gemma-4-E2B-it") != G4_OK) { puts(model.error); return 1; }

    sc = g4_session_config_init();
    sc.max_context = 64;                  /* positions this session can hold    */
    sc.max_chunk = 16;                    /* tokens per internal forward step   */
    g4_session_size(&model, &sc, &bytes); /* how much memory the session needs  */
    arena = malloc(bytes);                /* yours: malloc, mmap, a static buffer */
    if (g4_session_init(&s, &model, &sc, arena, bytes) != G4_OK) { puts(s.error); return 1; }

    logits = (float *)malloc(sizeof(float) * model.config.vocab_size);
    g4_forward(&s, prompt, 3, logits, G4_LOGITS_LAST); /* prefill */
    for (i = 0; i < 16; i++) {                         /* decode  */
        int32_t next = g4_argmax(logits, model.config.vocab_size);
        printf("%d ", (int)next);
        if (g4_forward(&s, &next, 1, logits, G4_LOGITS_LAST) != G4_OK) { puts(s.error); return 1; }
    }
    printf("\n");
    free(logits);
    free(arena);
    g4_model_free(&model);
    return 0;
}
