/* args.h - the one argument parser of the CLI (examples/gemma4.c, bench.h, train.h).

   A command describes itself in a g4a_cmd: its name, its positional arguments
   and a table of options (g4a_opt), each with where its value goes, the rule
   it must meet and one line of help. g4a_parse walks argv once; a mistake is
   one line on stderr that names the flag, the value and the rule:

       gemma4 generate: --top-p 1.5: must be in (0, 1]
       gemma4 generate: --new abc: must be an integer >= 0
       gemma4 logits: unknown option --bogus (gemma4 help logits lists the options)

   `--help` or `-h` anywhere prints the command's usage and every option with
   its rule and help on stdout (g4a_help, also `gemma4 help COMMAND`), and the
   command then exits 0. Integers are digits only (a '-' only where the range
   allows one), checked for overflow; numbers go through strtod and must be
   finite and use the whole argument. "--" ends the options. */
#ifndef G4_ARGS_H
#define G4_ARGS_H

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    G4A_FLAG,   /* no value; int *dst set to 1 */
    G4A_STR,    /* const char **dst */
    G4A_INT,    /* int *dst, an integer in [lo, hi] */
    G4A_U64,    /* uint64_t *dst, any 64-bit unsigned integer */
    G4A_NUM,    /* double *dst, a finite number in lo..hi (open: which ends are excluded) */
    G4A_CHOICE, /* int *dst, the index of the value in choices ("bf16|f32") */
    G4A_LIST    /* g4a_list *dst: every value, in command-line order, tagged with the option's
                   tag (lo); repeatable, and several options may share one list */
};

/* The values of repeatable options (G4A_LIST), in the order they were given:
   --image a.png --audio b.wav --image c.png -> (tag, value) x 3. */
#define G4A_LIST_MAX 64
typedef struct {
    const char *value[G4A_LIST_MAX];
    int tag[G4A_LIST_MAX];
    int n;
} g4a_list;
#define G4A_LO_OPEN 1
#define G4A_HI_OPEN 2

typedef struct {
    const char *name;    /* "--top-p" */
    int kind;            /* G4A_* */
    void *dst;
    const char *meta;    /* the value's name in the usage line: "P" (NULL for a flag) */
    double lo, hi;       /* G4A_INT, G4A_NUM: the allowed range (hi = INFINITY: none) */
    int open;            /* G4A_NUM: G4A_LO_OPEN | G4A_HI_OPEN */
    const char *choices; /* G4A_CHOICE: "bf16|f32" */
    int required;
    const char *help;    /* one line: what it does and its default */
    int given;           /* set by g4a_parse */
} g4a_opt;

typedef struct {
    const char *name;    /* "generate" */
    const char *pos;     /* the positional arguments for usage: "DIR", "PATH [TEXT]" */
    int min_pos, max_pos;
    const char *summary; /* what the command does, a few lines for help */
    g4a_opt *opts;
    int n_opts;
} g4a_cmd;

/* Table rows: a flag, a string, an integer in [lo, hi], a 64-bit unsigned
   integer, a number (open: G4A_LO_OPEN | G4A_HI_OPEN), a choice, a repeatable value
   appended to a g4a_list with a tag; *R: required. */
#define G4A_F(name, dst, help) {name, G4A_FLAG, dst, NULL, 0, 0, 0, NULL, 0, help, 0}
#define G4A_S(name, dst, meta, help) {name, G4A_STR, dst, meta, 0, 0, 0, NULL, 0, help, 0}
#define G4A_SR(name, dst, meta, help) {name, G4A_STR, dst, meta, 0, 0, 0, NULL, 1, help, 0}
#define G4A_I(name, dst, meta, lo, hi, help) {name, G4A_INT, dst, meta, lo, hi, 0, NULL, 0, help, 0}
#define G4A_IR(name, dst, meta, lo, hi, help) {name, G4A_INT, dst, meta, lo, hi, 0, NULL, 1, help, 0}
#define G4A_U(name, dst, meta, help) {name, G4A_U64, dst, meta, 0, 0, 0, NULL, 0, help, 0}
#define G4A_D(name, dst, meta, lo, hi, open, help) {name, G4A_NUM, dst, meta, lo, hi, open, NULL, 0, help, 0}
#define G4A_C(name, dst, meta, choices, help) {name, G4A_CHOICE, dst, meta, 0, 0, 0, choices, 0, help, 0}
#define G4A_L(name, list, tag, meta, help) {name, G4A_LIST, list, meta, tag, 0, 0, NULL, 0, help, 0}
#define G4A_N_OPTS(a) ((int)(sizeof(a) / sizeof((a)[0])))

#define G4A_RESULT_OK 0
#define G4A_RESULT_ERR 1
#define G4A_RESULT_HELP 2 /* help printed: exit 0 */

/* an option's rule as words ("must be an integer >= 1"); "" when it has none */
static const char *g4a_rule(const g4a_opt *o, char *buf, size_t cap) {
    buf[0] = 0;
    if (o->kind == G4A_INT) {
        if (o->hi >= (double)INT_MAX) snprintf(buf, cap, "must be an integer >= %.0f", o->lo);
        else snprintf(buf, cap, "must be an integer in [%.0f, %.0f]", o->lo, o->hi);
    } else if (o->kind == G4A_U64) {
        snprintf(buf, cap, "must be an integer in [0, 18446744073709551615]");
    } else if (o->kind == G4A_NUM) {
        if (isinf(o->hi)) snprintf(buf, cap, "must be a number %s %g", o->open & G4A_LO_OPEN ? ">" : ">=", o->lo);
        else snprintf(buf, cap, "must be in %c%g, %g%c", o->open & G4A_LO_OPEN ? '(' : '[', o->lo, o->hi,
                      o->open & G4A_HI_OPEN ? ')' : ']');
    } else if (o->kind == G4A_LIST) {
        snprintf(buf, cap, "repeatable, at most %d", G4A_LIST_MAX);
    } else if (o->kind == G4A_CHOICE) {
        const char *c = o->choices, *bar;
        size_t n = 0;
        n += (size_t)snprintf(buf + n, cap - n, "must be one of");
        for (; c && *c && n < cap; c = bar ? bar + 1 : c + strlen(c)) {
            bar = strchr(c, '|');
            n += (size_t)snprintf(buf + n, cap - n, " %.*s", (int)(bar ? (size_t)(bar - c) : strlen(c)), c);
        }
    }
    return buf;
}

/* "usage: gemma4 NAME POS --required X [options]" on f (no newline) */
static void g4a_usage_line(const g4a_cmd *c, FILE *f) {
    int i, optional = 0;
    fprintf(f, "usage: gemma4 %s%s%s", c->name, c->pos && *c->pos ? " " : "", c->pos ? c->pos : "");
    for (i = 0; i < c->n_opts; i++) {
        if (c->opts[i].required) fprintf(f, " %s %s", c->opts[i].name, c->opts[i].meta ? c->opts[i].meta : "");
        else optional = 1;
    }
    if (optional) fprintf(f, " [options]");
}

/* The command's usage, summary and options with their rules (stdout for --help). */
static void g4a_help(const g4a_cmd *c, FILE *f) {
    int i;
    char rule[160], left[64];
    g4a_usage_line(c, f);
    fprintf(f, "\n%s\n", c->summary);
    if (c->n_opts) fprintf(f, "options:\n");
    for (i = 0; i < c->n_opts; i++) {
        const g4a_opt *o = &c->opts[i];
        snprintf(left, sizeof left, "%s%s%s", o->name, o->meta ? " " : "", o->meta ? o->meta : "");
        g4a_rule(o, rule, sizeof rule);
        fprintf(f, "  %-22s %s%s%s%s\n", left, o->help, o->required ? " (required)" : "", rule[0] ? "; " : "", rule);
    }
    fprintf(f, "  %-22s %s\n", "--help, -h", "this text, on stdout (exit 0)");
}

/* A strict integer: optional '-', digits, no overflow. 0 when s is not one. */
static int g4a_strict_ll(const char *s, long long *v) {
    int neg = *s == '-';
    unsigned long long x = 0;
    const char *p = s + neg;
    if (!*p) return 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9') return 0;
        if (x > (ULLONG_MAX - 9) / 10) x = ULLONG_MAX; /* saturates: reported as out of range */
        else x = x * 10 + (unsigned)(*p - '0');
    }
    if (x > (unsigned long long)LLONG_MAX) x = (unsigned long long)LLONG_MAX;
    *v = neg ? -(long long)x : (long long)x;
    return 1;
}

/* Sets one option from its value; 0 after printing the error. */
static int g4a_set(const g4a_cmd *c, g4a_opt *o, const char *v) {
    char rule[160];
    g4a_rule(o, rule, sizeof rule);
    switch (o->kind) {
    case G4A_STR:
        *(const char **)o->dst = v;
        return 1;
    case G4A_LIST: {
        g4a_list *l = (g4a_list *)o->dst;
        if (l->n >= G4A_LIST_MAX) {
            fprintf(stderr, "gemma4 %s: %s %s: more than %d values of this kind\n", c->name, o->name, v, G4A_LIST_MAX);
            return 0;
        }
        l->value[l->n] = v;
        l->tag[l->n++] = (int)o->lo;
        return 1;
    }
    case G4A_INT: {
        long long x;
        if (!g4a_strict_ll(v, &x) || (double)x < o->lo || (double)x > o->hi) break;
        *(int *)o->dst = (int)x;
        return 1;
    }
    case G4A_U64: {
        unsigned long long x = 0;
        const char *p = v;
        if (!*p) break;
        for (; *p; p++) {
            if (*p < '0' || *p > '9' || x > (ULLONG_MAX - (unsigned)(*p - '0')) / 10) break;
            x = x * 10 + (unsigned)(*p - '0');
        }
        if (*p) break;
        *(uint64_t *)o->dst = (uint64_t)x;
        return 1;
    }
    case G4A_NUM: {
        char *end;
        double x;
        errno = 0;
        x = *v ? strtod(v, &end) : NAN;
        if (!*v || *end || !isfinite(x) || x < o->lo || x > o->hi || ((o->open & G4A_LO_OPEN) && x == o->lo) ||
            ((o->open & G4A_HI_OPEN) && x == o->hi))
            break;
        *(double *)o->dst = x;
        return 1;
    }
    case G4A_CHOICE: {
        const char *ch = o->choices, *bar;
        int k = 0;
        size_t n = strlen(v);
        for (; *ch; ch = bar ? bar + 1 : ch + strlen(ch), k++) {
            bar = strchr(ch, '|');
            if ((bar ? (size_t)(bar - ch) : strlen(ch)) == n && strncmp(ch, v, n) == 0) {
                *(int *)o->dst = k;
                return 1;
            }
            if (!bar) break;
        }
        break;
    }
    }
    fprintf(stderr, "gemma4 %s: %s %s: %s\n", c->name, o->name, *v ? v : "''", rule);
    return 0;
}

/* the option named `name` of c, or NULL (g4a_parse's lookup; a command's own checks: given, say) */
static g4a_opt *g4a_opt_of(g4a_cmd *c, const char *name) {
    int k;
    for (k = 0; k < c->n_opts; k++)
        if (strcmp(c->opts[k].name, name) == 0) return &c->opts[k];
    return NULL;
}

/* Parses argv[first..argc): options into c's table, the rest into pos[]
   (up to c->max_pos). G4A_RESULT_OK, G4A_RESULT_ERR (one line printed) or
   G4A_RESULT_HELP (help printed on stdout). */
static int g4a_parse(g4a_cmd *c, int argc, char **argv, int first, const char **pos, int *n_pos) {
    int i, k, only_pos = 0;
    *n_pos = 0;
    for (k = 0; k < c->n_opts; k++) c->opts[k].given = 0;
    for (i = first; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) { g4a_help(c, stdout); return G4A_RESULT_HELP; }
        else if (strcmp(argv[i], "--") == 0) break;
    for (i = first; i < argc; i++) {
        const char *a = argv[i];
        g4a_opt *o;
        if (!only_pos && strcmp(a, "--") == 0) { only_pos = 1; continue; }
        if (only_pos || a[0] != '-' || a[1] == 0) { /* a positional argument */
            if (*n_pos >= c->max_pos) {
                fprintf(stderr, "gemma4 %s: unexpected argument '%s' (", c->name, a);
                g4a_usage_line(c, stderr);
                fprintf(stderr, ")\n");
                return G4A_RESULT_ERR;
            }
            pos[(*n_pos)++] = a;
            continue;
        }
        if (!(o = g4a_opt_of(c, a))) {
            fprintf(stderr, "gemma4 %s: unknown option %s (gemma4 help %s lists the options)\n", c->name, a, c->name);
            return G4A_RESULT_ERR;
        }
        if (o->given && o->kind != G4A_LIST) { fprintf(stderr, "gemma4 %s: %s given twice\n", c->name, a); return G4A_RESULT_ERR; }
        o->given++;
        if (o->kind == G4A_FLAG) { *(int *)o->dst = 1; continue; }
        if (i + 1 >= argc) { fprintf(stderr, "gemma4 %s: %s needs a value (%s)\n", c->name, a, o->meta); return G4A_RESULT_ERR; }
        if (!g4a_set(c, o, argv[++i])) return G4A_RESULT_ERR;
    }
    if (*n_pos < c->min_pos) {
        fprintf(stderr, "gemma4 %s: missing %s (", c->name, c->pos);
        g4a_usage_line(c, stderr);
        fprintf(stderr, ")\n");
        return G4A_RESULT_ERR;
    }
    for (k = 0; k < c->n_opts; k++)
        if (c->opts[k].required && !c->opts[k].given) {
            fprintf(stderr, "gemma4 %s: %s %s is required (", c->name, c->opts[k].name, c->opts[k].meta);
            g4a_usage_line(c, stderr);
            fprintf(stderr, ")\n");
            return G4A_RESULT_ERR;
        }
    return G4A_RESULT_OK;
}

/* One line naming a bad combination: "gemma4 CMD: MSG" (returns 1). */
static int g4a_fail(const g4a_cmd *c, const char *fmt, ...) G4__PRINTF(2, 3);
static int g4a_fail(const g4a_cmd *c, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "gemma4 %s: ", c->name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 1;
}

#endif /* G4_ARGS_H */
