/* libFuzzer harness: model.safetensors.index.json text. Two small shards
   (a.safetensors, b.safetensors) live in a temporary directory made at start
   (never in the repository), so the index can name real, missing, escaping or
   duplicated shards. Property: no crash, no sanitizer report, every
   rejection has a message, and no file outside that directory is opened. */
#define _POSIX_C_SOURCE 200809L
#define GEMMA4_IMPLEMENTATION
#include "../../gemma4.h"

#include <stdlib.h>
#include <string.h>

static char g_dir[64];
static g4_model g_m;

static void write_shard(const char *name, const char *header, size_t data_bytes) {
    char path[128];
    FILE *f;
    size_t hl = strlen(header), i;
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    if (!(f = fopen(path, "wb"))) abort();
    for (i = 0; i < 8; i++) fputc((int)((hl >> (8 * i)) & 0xff), f);
    fwrite(header, 1, hl, f);
    for (i = 0; i < data_bytes; i++) fputc((int)(i * 7), f);
    fclose(f);
}

static void cleanup(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/a.safetensors", g_dir);
    remove(path);
    snprintf(path, sizeof path, "%s/b.safetensors", g_dir);
    remove(path);
    remove(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    strcpy(g_dir, "/tmp/g4fuzz-index-XXXXXX");
    if (!mkdtemp(g_dir)) abort();
    write_shard("a.safetensors",
                "{\"x.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                "\"y.weight\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[16,24]},"
                "\"__metadata__\":{\"format\":\"pt\"}}",
                24);
    write_shard("b.safetensors", "{\"z.weight\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]}}", 6);
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = (char *)malloc(size ? size : 1);
    g4_result r;
    int i;
    size_t dl = strlen(g_dir);
    if (!text) return 0;
    if (size) memcpy(text, data, size);
    memset(&g_m, 0, sizeof g_m);
    r = g4__load_index_text(&g_m, g_dir, "fuzz.index.json", text, size);
    if (r == G4_OK) r = g4__st_finish(&g_m);
    if (r != G4_OK && !g_m.error[0]) abort();
    for (i = 0; i < g_m.n_files; i++) { /* every opened shard is a plain name inside g_dir */
        const char *p = g_m.files[i].path;
        if (!p) continue;
        if (strncmp(p, g_dir, dl) != 0 || p[dl] != '/' || strchr(p + dl + 1, '/') || strcmp(p + dl + 1, "..") == 0)
            abort();
    }
    g4_model_free(&g_m);
    free(text);
    return 0;
}
