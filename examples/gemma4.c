/* gemma4 - the command-line face of gemma4.h.

     gemma4 info PATH                       PATH: model directory or config.json
     gemma4 logits DIR --ids 2,818,1010 --out FILE [--chunk N]
     gemma4 greedy DIR --ids 2,818 --new N [--chunk N]

   `logits` runs the ids as one sequence and writes float32 little-endian
   logits for every position, [n_ids][vocab], to FILE, and prints the argmax
   of each position. `greedy` appends N greedily chosen tokens and prints all
   ids. Errors: one line on stderr, exit status 1. */
#define GEMMA4_IMPLEMENTATION
#include "../gemma4.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int usage(void) {
    fprintf(stderr,
            "usage: gemma4 info PATH\n"
            "       gemma4 logits DIR --ids 2,818,1010 --out FILE [--chunk N]\n"
            "       gemma4 greedy DIR --ids 2,818 --new N [--chunk N]\n");
    return 1;
}

/* "2,818,1010" -> ids; returns the count, or -1 with a message. */
static int parse_ids(const char *s, int32_t **out) {
    int n = 1, k = 0;
    const char *p;
    int32_t *ids;
    for (p = s; *p; p++) n += *p == ',';
    ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    if (!ids) return -1;
    for (p = s; k < n; k++) {
        long v = 0;
        const char *start = p;
        while (*p >= '0' && *p <= '9') {
            v = v * 10 + (*p - '0');
            if (v > 0x7fffffffL) break;
            p++;
        }
        if (p == start || (*p && *p != ',') || v > 0x7fffffffL) {
            fprintf(stderr, "gemma4: --ids: '%s' is not a comma-separated list of token ids\n", s);
            free(ids);
            return -1;
        }
        ids[k] = (int32_t)v;
        if (*p == ',') p++;
    }
    *out = ids;
    return n;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int cmd_info(const char *path) {
    g4_config c;
    g4_plan p;
    g4_result r;
    char buf[4096];
    if (is_dir(path)) {
        snprintf(buf, sizeof buf, "%s/config.json", path);
        path = buf;
    }
    r = g4_config_load(&c, path);
    if (r != G4_OK) { fprintf(stderr, "gemma4: %s\n", c.error); return 1; }
    if (g4_plan_build(&p, &c) != G4_OK) { fprintf(stderr, "gemma4: %s: %s\n", path, p.error); return 1; }
    g4_plan_print(&p, &c, stdout);
    return 0;
}

/* Loads DIR, sizes and allocates the arena, opens a session for n tokens. */
static int open_session(const char *dir, int n, int chunk, g4_model *m, g4_session *s, void **arena) {
    g4_session_config sc = g4_session_config_init();
    size_t bytes;
    if (g4_model_load(m, dir) != G4_OK) { fprintf(stderr, "gemma4: %s\n", m->error); return 1; }
    sc.max_context = n;
    if (chunk > 0) sc.max_chunk = chunk;
    if (g4_session_size(m, &sc, &bytes) != G4_OK || !(*arena = malloc(bytes))) {
        fprintf(stderr, "gemma4: cannot allocate a session for %d positions\n", n);
        g4_model_free(m);
        return 1;
    }
    if (g4_session_init(s, m, &sc, *arena, bytes) != G4_OK) {
        fprintf(stderr, "gemma4: %s\n", s->error);
        free(*arena);
        g4_model_free(m);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *cmd, *dir, *ids_arg = NULL, *out_path = NULL;
    int32_t *ids = NULL;
    int n, i, chunk = 0, n_new = -1, rc = 1;
    g4_model m;
    g4_session s;
    void *arena = NULL;
    float *logits = NULL;

    if (argc < 3) return usage();
    cmd = argv[1];
    dir = argv[2];
    if (strcmp(cmd, "info") == 0) return argc == 3 ? cmd_info(dir) : usage();
    if (strcmp(cmd, "logits") != 0 && strcmp(cmd, "greedy") != 0) return usage();
    for (i = 3; i < argc; i++) {
        if (i + 1 >= argc) return usage();
        if (strcmp(argv[i], "--ids") == 0) ids_arg = argv[++i];
        else if (strcmp(argv[i], "--out") == 0) out_path = argv[++i];
        else if (strcmp(argv[i], "--chunk") == 0) chunk = atoi(argv[++i]);
        else if (strcmp(argv[i], "--new") == 0) n_new = atoi(argv[++i]);
        else return usage();
    }
    if (!ids_arg || (cmd[0] == 'l' && !out_path) || (cmd[0] == 'g' && n_new < 0) || chunk < 0) return usage();
    if ((n = parse_ids(ids_arg, &ids)) < 0) return 1;
    if (open_session(dir, cmd[0] == 'g' ? n + n_new : n, chunk, &m, &s, &arena)) { free(ids); return 1; }

    if (cmd[0] == 'l') { /* logits */
        FILE *f;
        int V = m.config.vocab_size;
        logits = (float *)malloc(sizeof(float) * (size_t)n * (size_t)V);
        if (!logits) { fprintf(stderr, "gemma4: out of memory for %d x %d logits\n", n, V); goto done; }
        if (g4_forward(&s, ids, n, logits, G4_LOGITS_ALL) != G4_OK) { fprintf(stderr, "gemma4: %s\n", s.error); goto done; }
        if (!(f = fopen(out_path, "wb"))) { fprintf(stderr, "gemma4: cannot write %s\n", out_path); goto done; }
        if (fwrite(logits, sizeof(float), (size_t)n * V, f) != (size_t)n * V) {
            fclose(f);
            fprintf(stderr, "gemma4: short write to %s\n", out_path);
            goto done;
        }
        fclose(f);
        printf("argmax:");
        for (i = 0; i < n; i++) printf(" %d", (int)g4_argmax(logits + (size_t)i * V, V));
        printf("\nwrote %d x %d float32 logits to %s\n", n, V, out_path);
    } else { /* greedy */
        int32_t next;
        logits = (float *)malloc(sizeof(float) * (size_t)m.config.vocab_size);
        if (!logits) goto done;
        if (g4_forward(&s, ids, n, logits, G4_LOGITS_LAST) != G4_OK) { fprintf(stderr, "gemma4: %s\n", s.error); goto done; }
        for (i = 0; i < n; i++) printf("%d ", (int)ids[i]);
        for (i = 0; i < n_new; i++) {
            next = g4_argmax(logits, m.config.vocab_size);
            printf("%d%s", (int)next, i + 1 < n_new ? " " : "");
            fflush(stdout);
            if (i + 1 < n_new && g4_forward(&s, &next, 1, logits, G4_LOGITS_LAST) != G4_OK) {
                fprintf(stderr, "\ngemma4: %s\n", s.error);
                goto done;
            }
        }
        printf("\n");
    }
    rc = 0;
done:
    free(logits);
    free(ids);
    free(arena);
    g4_model_free(&m);
    return rc;
}
