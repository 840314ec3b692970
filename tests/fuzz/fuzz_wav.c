/* libFuzzer harness: WAV bytes (g4_wav_parse), and the samples of an accepted
   16 kHz file through the feature extractor (g4_audio_features: its rate,
   length and finiteness checks). Property: no crash, no sanitizer report,
   every rejection has a message, an accepted file's samples lie inside it,
   and the features of an accepted clip are finite. */
#define GEMMA4_IMPLEMENTATION
#include "../../gemma4.h"
#include "../../gemma4_processing.h"

#include <stdlib.h>
#include <string.h>

static g4_audio_fe g_fe;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void cleanup(void) { g4_audio_fe_free(&g_fe); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (g4_audio_fe_init(&g_fe) != G4_OK) abort();
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[G4_ERROR_MAX];
    size_t n = 0, n2 = 0;
    int rate = 0, rate2 = 0, nf = 0, i;
    float *pcm, *feat, *scratch;
    unsigned char *mask;
    err[0] = 0;
    if (g4_wav_parse(data, size, NULL, 0, &n, &rate, err) != G4_OK) {
        if (!err[0]) abort();
        return 0;
    }
    if (n * 2 > size) abort(); /* every sample takes at least 2 bytes of the file */
    if (n > 40000) return 0;   /* keep runs short */
    pcm = (float *)malloc(sizeof(float) * (n ? n : 1));
    if (!pcm) return 0;
    if (n > 0) { /* one sample short of room: refused with a message */
        err[0] = 0;
        if (g4_wav_parse(data, size, pcm, n - 1, &n2, &rate2, err) == G4_OK || !err[0]) abort();
    }
    if (g4_wav_parse(data, size, pcm, n, &n2, &rate2, err) != G4_OK || n2 != n || rate2 != rate) abort();
    nf = g4_audio_fe_frames(&g_fe, (int)n);
    feat = (float *)malloc(sizeof(float) * (size_t)(nf > 0 ? nf : 1) * (size_t)g_fe.feature_size);
    mask = (unsigned char *)malloc((size_t)(nf > 0 ? nf : 1));
    scratch = (float *)malloc(sizeof(float) * g4_audio_fe_scratch(&g_fe));
    if (feat && mask && scratch) {
        int got = -1;
        g_fe.error[0] = 0;
        if (g4_audio_features(&g_fe, pcm, (int)n, rate, feat, mask, &got, scratch) != G4_OK) {
            if (!g_fe.error[0]) abort();
        } else {
            if (got != nf) abort();
            for (i = 0; i < got * g_fe.feature_size; i++)
                if (!(feat[i] == feat[i]) || feat[i] > 1e30f || feat[i] < -1e30f) abort();
        }
    }
    free(feat);
    free(mask);
    free(scratch);
    free(pcm);
    return 0;
}
