/* libFuzzer harness: the JSON parser, the config parser, the layer plan and
   session sizing on arbitrary bytes. Property: no crash, no sanitizer report,
   every rejection carries a message that names the file (config errors)
   or the layer (plan errors), and only valid UTF-8 is accepted. Build: make fuzz (clang, -fsanitize=fuzzer). */
#define GEMMA4_IMPLEMENTATION
#include "../../gemma4.h"

#include <stdlib.h>
#include <string.h>

static g4_model g_m; /* large; static so each run does not touch 40 KB of stack */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = (char *)malloc(size ? size : 1); /* exact size: ASan sees any over-read */
    g4_config *c = &g_m.config;
    g4_plan *p = &g_m.plan;
    g4_result r;
    if (!text) return 0;
    if (size) memcpy(text, data, size);
    r = g4_config_parse(c, text, size, "fuzz.json");
    if (r != G4_OK) {
        if (r != G4_ERR_JSON && r != G4_ERR_CONFIG && r != G4_ERR_NOMEM) abort();
        if (!strstr(c->error, "fuzz.json")) abort(); /* every config message names its file */
    } else if (!g4__utf8_valid(data, size)) {
        abort(); /* transformers reads config.json as UTF-8 text: anything else is refused */
    } else if ((r = g4_plan_build(p, c)) != G4_OK) {
        if (r != G4_ERR_PLAN || !strstr(p->error, "layer")) abort();
    } else {
        /* size a session for this config: the arena arithmetic must not overflow */
        g4_session_config sc = g4_session_config_init();
        size_t bytes = 0;
        g4_layer_weights dummy;
        g_m.w.layers = &dummy; /* g4_session_size only checks that a model is loaded */
        sc.max_context = 1 + (int)(size % 4099);
        sc.max_chunk = (int)(size % 7);
        r = g4_session_size(&g_m, &sc, &bytes);
        if (r != G4_OK && r != G4_ERR_ARENA) abort();
        if (r == G4_OK && bytes == 0) abort();
        g_m.w.layers = NULL;
    }
    free(text);
    return 0;
}
