/* examples/minimal.c: load a model, size and give it an arena, prefill, decode greedily.
       build/minimal MODEL_DIR          (make test runs it on data/tiny/e2b_like) */
#define GEMMA4_IMPLEMENTATION            /* in exactly one file */
#include "gemma4.h"
#include <stdlib.h>

int main(int argc, char **argv) {
    g4_model model;
    if (g4_model_load(&model, argc > 1 ? argv[1] : "gemma-4-E2B-it") != G4_OK) { puts(model.error); return 1; }

    g4_session_config sc = g4_session_config_init();
    sc.max_context = 64;                      /* positions this session can hold  */
    sc.max_chunk = 16;                        /* tokens per internal forward step */
    size_t bytes;
    g4_session_size(&model, &sc, &bytes);     /* the memory the session needs     */
    void *arena = malloc(bytes);              /* yours: malloc, mmap, a static buffer */
    g4_session s;
    if (g4_session_init(&s, &model, &sc, arena, bytes) != G4_OK) { puts(s.error); return 1; }

    int32_t prompt[] = {2, 81, 101};          /* token ids: <bos> and two more */
    float *logits = (float *)malloc(sizeof(float) * model.config.vocab_size);
    g4_result r = g4_forward(&s, prompt, 3, logits, G4_LOGITS_LAST);         /* prefill */
    for (int i = 0; r == G4_OK && i < 16; i++) {                             /* decode  */
        int32_t next = g4_argmax(logits, model.config.vocab_size);
        printf("%d ", (int)next);
        r = g4_forward(&s, &next, 1, logits, G4_LOGITS_LAST);
    }
    printf("\n");
    if (r != G4_OK) puts(s.error);
    free(logits);
    free(arena);
    g4_model_free(&model);
    return r == G4_OK ? 0 : 1;
}
