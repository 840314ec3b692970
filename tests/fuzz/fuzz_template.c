/* libFuzzer harness: the chat-template lexer, parser and renderer on
   arbitrary bytes. The input is a template; if it holds two NUL bytes, what
   follows them is the conversation JSON instead of the fixed one below.
   Property: no crash, no sanitizer report, no leak, and every failure is
   G4_ERR_INPUT/G4_ERR_JSON/G4_ERR_NOMEM with a message naming the template
   and a line (or the messages JSON). Build: make fuzz (clang). */
#define GEMMA4_IMPLEMENTATION
#include "../../gemma4.h"
#include "../../gemma4_processing.h"

#include <stdlib.h>
#include <string.h>

static const char g_chat[] =
    "{\"messages\":[{\"role\":\"system\",\"content\":\" sys \"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"},"
    "{\"type\":\"image\"}]},{\"role\":\"assistant\",\"content\":\"<|channel>x<channel|>ok\",\"reasoning_content\":\"r\","
    "\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1,\"b\":[true,null,2.5]}}}]},"
    "{\"role\":\"tool\",\"content\":\"res\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}}}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t tl = size, i;
    const char *chat = g_chat;
    size_t cl = sizeof g_chat - 1;
    char *src = (char *)malloc(size ? size : 1); /* exact size: ASan sees any over-read */
    char *text = NULL, err[G4_ERROR_MAX];
    size_t n = 0;
    g4_template t;
    g4_template_options o = g4_template_options_init();
    g4_result r;
    if (!src) return 0;
    if (size) memcpy(src, data, size);
    for (i = 0; i + 1 < size; i++)
        if (src[i] == 0 && src[i + 1] == 0) { tl = i; chat = src + i + 2; cl = size - i - 2; break; }
    o.max_steps = 20000;
    o.max_output = 1 << 16;
    o.max_memory = (size_t)32 << 20;
    o.max_depth = 32;
    o.enable_thinking = (int)(size % 3) - 1;
    r = g4_template_parse(&t, src, tl, "fuzz.jinja");
    if (r != G4_OK) {
        if (r != G4_ERR_INPUT && r != G4_ERR_NOMEM) abort();
        if (!strstr(t.error, "fuzz.jinja")) abort();
        if (r == G4_ERR_INPUT && !strstr(t.error, "line ")) abort();
        if (t.impl) abort();
    } else {
        r = g4_template_render(&t, chat, cl, &o, &text, &n, err);
        if (r == G4_OK) {
            if (!text || strlen(text) > n || n > o.max_output) abort();
        } else {
            if (text) abort();
            if (r != G4_ERR_INPUT && r != G4_ERR_JSON && r != G4_ERR_NOMEM) abort();
            if (!strstr(err, "fuzz.jinja") && !strstr(err, "messages JSON")) abort();
        }
        g4_template_free_output(text);
        g4_template_free(&t);
    }
    free(src);
    return 0;
}
