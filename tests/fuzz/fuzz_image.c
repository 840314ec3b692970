/* libFuzzer harness: the image processor. The first byte picks the mode:
   even - the rest is a processor_config.json (g4_image_config_parse, and
   g4_unified_fe_parse for the 12B's feature extractor); odd -
   the next 5 bytes give height, width (1 .. 256 each, or 0 / huge from a
   flag) and channels (1 .. 5), the rest the pixels (repeated to fill),
   through g4_image_target_size, g4_image_scratch_size and
   g4_image_preprocess with a small processor (patch 4, k 2, 70 soft tokens).
   Property: no crash, no sanitizer report, every rejection has a message,
   an accepted image's pixel values lie in [0, 1], its positions are a
   grid of n_soft k^2 patches followed by padding. */
#define GEMMA4_IMPLEMENTATION
#include "../../gemma4.h"
#include "../../gemma4_processing.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    g4_image_config ic;
    if (size < 1) return 0;
    if (!(data[0] & 1)) {
        g4_unified_fe fe;
        g4_result r = g4_image_config_parse(&ic, (const char *)data + 1, size - 1, "fuzz.json");
        if (r != G4_OK && !ic.error[0]) abort();
        /* the 12B's image processor is stored merged: patches of k p pixels, no pooling */
        if (r == G4_OK && ic.kind == G4_IMAGE_UNIFIED && (ic.pooling_kernel_size != 1 || ic.patch_size > 1024)) abort();
        r = g4_unified_fe_parse(&fe, (const char *)data + 1, size - 1, "fuzz.json");
        if (r != G4_OK && !fe.error[0]) abort();
        if (r == G4_OK && (fe.audio_samples_per_token < 1 || g4_unified_audio_tokens(&fe, 12345) < 1)) abort();
        return 0;
    }
    if (size < 6) return 0;
    {
        int h = 1 + data[1], w = 1 + data[2], ch = 1 + data[3] % 5, flags = data[4], n_soft = -1, i, th, tw;
        size_t np = (size_t)h * w * (size_t)ch, j, bytes;
        uint8_t *px;
        void *scratch;
        float *pv;
        int32_t *pos;
        g4_result r;
        ic = g4_image_config_init();
        ic.patch_size = 4; ic.pooling_kernel_size = 2; ic.max_soft_tokens = 70;
        if (flags & 1) h = 0;
        if (flags & 2) w = 40000;
        if (flags & 4) ic.do_resize = 0;
        r = g4_image_target_size(&ic, h, w, &th, &tw);
        if (r != G4_OK) { if (!ic.error[0]) abort(); return 0; }
        bytes = g4_image_scratch_size(&ic, h, w);
        if (!bytes) abort();
        px = (uint8_t *)malloc(np);
        for (j = 0; j < np; j++) px[j] = size > 5 ? data[5 + j % (size - 5)] : 0;
        scratch = malloc(bytes);
        pv = (float *)malloc(sizeof(float) * 280 * 48);
        pos = (int32_t *)malloc(sizeof(int32_t) * 280 * 2);
        ic.error[0] = 0;
        r = g4_image_preprocess(&ic, px, h, w, ch, scratch, bytes, pv, pos, &n_soft);
        if (r != G4_OK) {
            if (!ic.error[0] || (ch == 3 || ch == 4)) abort(); /* only the channel count may fail here */
        } else {
            for (i = 0; i < 280 * 48; i++) if (!(pv[i] >= 0.0f && pv[i] <= 1.0f)) abort();
            if (n_soft < 1 || n_soft * 4 > 280) abort();
            for (i = 0; i < 280; i++) {
                int pad = pos[2 * i] == -1 && pos[2 * i + 1] == -1;
                if ((i < n_soft * 4) == pad) abort();
                if (!pad && (pos[2 * i] < 0 || pos[2 * i + 1] < 0 || pos[2 * i] >= tw / 4 || pos[2 * i + 1] >= th / 4)) abort();
            }
        }
        free(px); free(scratch); free(pv); free(pos);
    }
    return 0;
}
