/* libFuzzer harness: the image and video processors. The first byte picks
   the mode (its value mod 4): 0 and 2 - the rest is a processor_config.json
   (g4_image_config_parse, g4_audio_fe_parse for Gemma 4's feature
   extractor, and g4_unified_fe_parse for the 12B's; 2 also
   g4_video_config_parse); 1 - the next 5 bytes give
   height, width (1 .. 256 each, or 0 / huge from a flag) and channels
   (1 .. 5), the rest the pixels (repeated to fill), through
   g4_image_target_size, g4_image_scratch_size and g4_image_preprocess with a
   small processor (patch 4, k 2, 70 soft tokens); 3 - the same sizes as a
   video of 1 .. 3 frames through g4_video_sample_frames, g4_video_preprocess
   and g4_mm_expand_videos (frame indices and fps from the bytes; the text is
   the rest, so it may hold any number of placeholders).
   Property: no crash, no sanitizer report, every rejection has a message,
   an accepted image's pixel values lie in [0, 1] (a video's too: mean 0,
   std 1), its positions are a grid of n_soft k^2 patches followed by padding;
   an expansion's length is what it reports. */
#define GEMMA4_IMPLEMENTATION
#include "../../gemma4.h"
#include "../../gemma4_processing.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* a grid of n real patches (x < tw/4, y < th/4) followed by (-1, -1) */
static void check_grid(const int32_t *pos, int n_real, int th, int tw) {
    int i;
    for (i = 0; i < 280; i++) {
        int pad = pos[2 * i] == -1 && pos[2 * i + 1] == -1;
        if ((i < n_real) == pad) abort();
        if (!pad && (pos[2 * i] < 0 || pos[2 * i + 1] < 0 || pos[2 * i] >= tw / 4 || pos[2 * i + 1] >= th / 4)) abort();
    }
}

static int fuzz_video(const uint8_t *data, size_t size) {
    g4_video_config vc = g4_video_config_init();
    int h = 1 + data[1] % 64, w = 1 + data[2] % 64, ch = 1 + data[3] % 4, flags = data[4], n_frames = 1 + data[4] % 3;
    int idx[8], n = 0, n_soft = -1, f, i, th, tw;
    size_t np, j, bytes, n_out = 0;
    uint8_t *px;
    void *scratch;
    float *pv;
    int32_t *pos;
    g4_result r;
    g4_image_config ic;
    vc.patch_size = 4; vc.pooling_kernel_size = 2; vc.max_soft_tokens = 70;
    if (flags & 8) h = 0;
    if (flags & 16) vc.do_resize = 0;
    vc.num_frames = flags & 32 ? 0 : n_frames;
    vc.fps = flags & 64 ? (double)(data[5] % 7) * 0.25 : 0.0;
    r = g4_video_sample_frames(&vc, 1 + data[1] % 5, (double)(data[2] % 4) * 0.5, idx, 8, &n);
    if (r != G4_OK && !vc.error[0]) abort();
    if (r == G4_OK) for (i = 0; i < n; i++) if (idx[i] < 0 || idx[i] > data[1] % 5 || (i && idx[i] <= idx[i - 1])) abort();
    np = (size_t)(h ? h : 1) * w * (size_t)ch * (size_t)n_frames;
    px = (uint8_t *)malloc(np);
    for (j = 0; j < np; j++) px[j] = data[5 + j % (size - 5)];
    bytes = g4_video_scratch_size(&vc, h, w);
    scratch = malloc(bytes ? bytes : 1);
    pv = (float *)malloc(sizeof(float) * 3 * 280 * 48);
    pos = (int32_t *)malloc(sizeof(int32_t) * 3 * 280 * 2);
    vc.error[0] = 0;
    r = g4_video_preprocess(&vc, px, n_frames, h, w, ch, scratch, bytes, pv, pos, &n_soft);
    if (r != G4_OK) {
        if (!vc.error[0]) abort();
    } else {
        ic = g4_image_config_init();
        ic.patch_size = 4; ic.pooling_kernel_size = 2; ic.max_soft_tokens = 70; ic.do_resize = vc.do_resize;
        if (ch != 3 || !bytes || g4_image_target_size(&ic, h, w, &th, &tw) != G4_OK) abort();
        if (n_soft < 1 || n_soft * 4 > 280) abort();
        for (f = 0; f < n_frames; f++) check_grid(pos + (size_t)f * 560, n_soft * 4, th, tw);
        for (j = 0; j < (size_t)n_frames * 280 * 48; j++) if (!(pv[j] >= 0.0f && pv[j] <= 1.0f)) abort();
    }
    { /* the expansion, with a config and a tokenizer that know the three tokens */
        static g4_tokenizer tok;
        static int have;
        static g4_config cfg;
        g4_video_item it[2];
        char *out;
        size_t cap = 1 << 16;
        if (!have) {
            const char *tj = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"added_tokens\": ["
                             "{\"id\": 1, \"content\": \"<|video|>\", \"special\": true},"
                             "{\"id\": 2, \"content\": \"<|image>\", \"special\": true},"
                             "{\"id\": 3, \"content\": \"<image|>\", \"special\": true}]}";
            if (g4_tokenizer_parse(&tok, tj, strlen(tj), "fuzz_tokenizer.json") != G4_OK) abort();
            memset(&cfg, 0, sizeof cfg);
            cfg.video_token_id = 1; cfg.boi_token_id = 2; cfg.eoi_token_id = 3;
            have = 1;
        }
        for (i = 0; i < 2; i++) {
            it[i].n_frames = n > 0 ? n : n_frames;
            it[i].n_soft = 1 + data[3] % 3;
            it[i].frame_indices = n > 0 ? idx : NULL;
            it[i].fps = (double)data[5] * (flags & 128 ? 1e-6 : 0.1);
        }
        out = (char *)malloc(cap);
        r = g4_mm_expand_videos(&tok, &cfg, (const char *)data + 5, size - 5, it, 1 + (flags & 1), out, cap, &n_out, vc.error);
        if (r != G4_OK && !vc.error[0]) abort();
        if (r == G4_OK && (out[n_out] != 0 || n_out + 1 > cap)) abort();
        free(out);
    }
    free(px); free(scratch); free(pv); free(pos);
    return 0;
}

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
        { /* Gemma 4's feature extractor: an accepted one has its tables and frames a clip */
            g4_audio_fe afe;
            memset(&afe, 0, sizeof afe);
            r = g4_audio_fe_parse(&afe, (const char *)data + 1, size - 1, "fuzz.json");
            if (r != G4_OK && (!afe.error[0] || afe.window)) abort();
            if (r == G4_OK && (!afe.window || !afe.mel_filters || afe.hop_length < 1 || afe.fft_length < afe.frame_length ||
                               g4_audio_fe_frames(&afe, 16000) < 1)) abort();
            if (r == G4_OK) g4_audio_fe_free(&afe);
        }
        if (data[0] % 4 == 2) {
            g4_video_config vc;
            g4_result rv = g4_video_config_parse(&vc, (const char *)data + 1, size - 1, "fuzz.json");
            if (rv != G4_OK && !vc.error[0]) abort();
            /* the 12B's video processor is stored merged too: patches of k p pixels, no pooling */
            if (rv == G4_OK && vc.kind == G4_IMAGE_UNIFIED && (vc.pooling_kernel_size != 1 || vc.patch_size > 1024)) abort();
        }
        return 0;
    }
    if (size < 6) return 0;
    if (data[0] % 4 == 3) return fuzz_video(data, size);
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
            check_grid(pos, n_soft * 4, th, tw);
        }
        free(px); free(scratch); free(pv); free(pos);
    }
    return 0;
}
