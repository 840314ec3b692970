/* mm.h - the CLI's images and audio in a prompt (logits, greedy, generate,
   chat, template). Included by examples/gemma4.c after image.h.

   --image FILE and --audio FILE are repeatable and fill the prompt's
   placeholder runs as Gemma4Processor fills them: the k-th image placeholder
   (the config's image_token_id, "<|image|>") takes the k-th --image file, the
   k-th audio placeholder (audio_token_id, "<|audio|>") the k-th --audio file,
   whatever order the two kinds come in; each placeholder becomes
   boi + n x image + eoi (boa + n x audio + eoa), n the file's soft tokens as
   the processor counts them (the image's target size; the clip's feature mask
   after two stride-2 convolutions, replace_audio_token). A count of
   placeholders that differs from the files of its kind is an error naming
   both counts.

   Sizes up front: g4mm_prepare decodes every file and runs the image
   processor and the feature extractor (no model needed: template --ids uses
   it alone), so the expanded length, the longest image run (a step must hold
   one) and the longest clip (the audio arena) are known before the session
   and the tower arenas are made; g4mm_encode then runs the towers in prompt
   order into one [total][H] buffer for g4_forward_mm.

   --video DIR|F1,F2,... is a video's frames (PNG or JPEG files of one size,
   in order; a directory: its .png/.jpg/.jpeg files by name), taken as
   transformers takes a list of frame images: already sampled
   (do_sample_frames false), at --video-fps frames per second for their
   "mm:ss" stamps (unknown: 24, as transformers assumes). The stamps are text
   tokenized with the prompt: where there is text (a prompt, a chat template's
   rendering) g4mm_expand_text expands the k-th "<|video|>" with the k-th
   video's frames before tokenizing (g4_mm_expand_videos); ids' lone <|video|>
   get their expansion tokenized alone (g4mm_expand_video_ids); g4mm_expand then
   checks the frames' runs and puts the file in prompt order, g4mm_encode
   runs its frames through the tower (g4_video_encode). */
#ifndef G4_MM_H
#define G4_MM_H

#define G4MM_IMAGE 1 /* g4a_list tags: G4_MM_IMAGE, G4_MM_VIDEO and G4_MM_AUDIO */
#define G4MM_VIDEO 2
#define G4MM_AUDIO 3
#define G4MM_TYPED 8 /* or'ed into a tag: the file came from a chat line (/image FILE), not a flag */
#define G4MM_KIND(tag) ((tag) & 7)

typedef struct {
    int kind;                  /* G4_MM_IMAGE, G4_MM_VIDEO or G4_MM_AUDIO */
    const char *path;
    int n_soft;                /* the processor's count: the run's length (a video: all its frames') */
    float *pv;                 /* image: pixel_values [max_patches][3 p^2]; video: [n_frames][vmax_patches][3 p^2] */
    int32_t *pos;              /* image: positions [max_patches][2]; video: [n_frames][vmax_patches][2] */
    int n_frames, per_frame;   /* video: its frames, each one's soft tokens */
    float *feat;               /* audio: features [nf][feature_size] */
    unsigned char *mask;       /* audio: [nf] */
    int nf;
} g4mm_file;

typedef struct {
    g4mm_file *f;              /* command-line order; prompt order after g4mm_expand */
    int n, n_image, n_audio, n_video;
    g4_image_config ic;        /* with images: the processor's settings */
    g4_video_config vc;        /* with videos: the video processor's */
    int vmax_patches;
    g4_audio_fe fe;            /* with audio: the feature extractor */
    int has_fe, max_patches, max_nf;
    int max_run;               /* the longest image run + 2 (boi, eoi) */
    int total_soft;            /* every file's n_soft */
    g4_unified_fe ufe;         /* a 12B's audio: frames of raw samples (feat [nf][A], mask all 1) */
    int bf16;                  /* g4mm_encode runs the towers in the bf16-faithful mode (the decoder
                                  session's mode: --bf16); set after g4mm_prepare */
    int flagged, typed;        /* bit G4MM_x: a file of that kind came from a flag (--image), a chat line (/image) */
} g4mm;

/* What the user typed for a kind of file, for messages: "--image", "/image" or both */
static const char *g4mm_word(const g4mm *mm, int tag) {
    static const char *const word[4][3] = {{"", "", ""},
                                           {"--image", "/image", "--image and /image"},
                                           {"--video", "/video", "--video and /video"},
                                           {"--audio", "/audio", "--audio and /audio"}};
    int t = G4MM_KIND(tag), typed = mm->typed >> t & 1, flagged = mm->flagged >> t & 1;
    if (!typed && !flagged) { typed = mm->typed != 0; flagged = mm->flagged != 0; } /* none of this kind: as the others came */
    return word[t & 3][typed && flagged ? 2 : typed ? 1 : 0];
}

/* Does list hold a file of this tag? */
static int g4mm_has(const g4a_list *list, int tag) {
    int k;
    for (k = 0; k < list->n; k++)
        if (G4MM_KIND(list->tag[k]) == tag) return 1;
    return 0;
}

static void g4mm_free(g4mm *mm) {
    int k;
    for (k = 0; k < mm->n; k++) {
        free(mm->f[k].pv); free(mm->f[k].pos); free(mm->f[k].feat); free(mm->f[k].mask);
    }
    free(mm->f);
    if (mm->has_fe) g4_audio_fe_free(&mm->fe);
    memset(mm, 0, sizeof *mm);
}

/* A WAV file's log-mel features (malloc'd; *nf frames of fe->feature_size)
   through an initialised fe; 1 after a message naming the file. */
static int g4mm_audio_features(const char *wav, g4_audio_fe *fe, float **feat, unsigned char **mask, int *nf,
                               size_t *n_samples) {
    char *bytes = NULL, err[G4_ERROR_MAX];
    float *pcm = NULL, *scratch = NULL;
    size_t len, n = 0;
    int rate = 0, rc = 1;
    *feat = NULL;
    *mask = NULL;
    *nf = 0;
    if (g4__read_file(wav, &bytes, &len, (size_t)1 << 30, err) != G4_OK) { fprintf(stderr, "gemma4: %s\n", err); return 1; }
    if (g4_wav_parse((const unsigned char *)bytes, len, NULL, 0, &n, &rate, err) != G4_OK) {
        fprintf(stderr, "gemma4: %s: %s\n", wav, err);
        free(bytes);
        return 1;
    }
    if (n > (size_t)INT_MAX) { fprintf(stderr, "gemma4: %s: %zu samples\n", wav, n); free(bytes); return 1; }
    if (!(pcm = (float *)malloc(sizeof(float) * (n ? n : 1))) ||
        g4_wav_parse((const unsigned char *)bytes, len, pcm, n, &n, &rate, err) != G4_OK) {
        fprintf(stderr, "gemma4: %s: %s\n", wav, pcm ? err : "out of memory");
        goto done;
    }
    *nf = g4_audio_fe_frames(fe, (int)n);
    *feat = (float *)malloc(sizeof(float) * (size_t)(*nf > 0 ? *nf : 1) * (size_t)fe->feature_size);
    *mask = (unsigned char *)malloc((size_t)(*nf > 0 ? *nf : 1));
    scratch = (float *)malloc(sizeof(float) * g4_audio_fe_scratch(fe));
    if (!*feat || !*mask || !scratch) { fprintf(stderr, "gemma4: out of memory\n"); goto done; }
    if (g4_audio_features(fe, pcm, (int)n, rate, *feat, *mask, nf, scratch) != G4_OK) {
        fprintf(stderr, "gemma4: %s: %s\n", wav, fe->error);
        goto done;
    }
    if (n_samples) *n_samples = n;
    rc = 0;
done:
    if (rc) { free(*feat); free(*mask); *feat = NULL; *mask = NULL; }
    free(bytes); free(pcm); free(scratch);
    return rc;
}

/* Gemma4Processor.replace_audio_token: the mask through two stride-2
   convolutions (mask[::2][:t_out], t_out = (t + 2 - 3) // 2 + 1), summed. */
static int g4mm_audio_count(const unsigned char *mask, int nf) {
    int t = nf, step = 1, r, k, n = 0, kept;
    for (r = 0; r < 2; r++) {
        int t_out = (t + 2 - 3) / 2 + 1;
        kept = (t + 1) / 2 < t_out ? (t + 1) / 2 : t_out;
        step *= 2;
        t = kept;
    }
    for (k = 0; k < t; k++) n += mask[(size_t)k * step] != 0;
    return n;
}

/* The clip's soft tokens through m's audio tower into soft (room for
   g4_audio_tokens_max(nf) rows), in an arena of arena_bytes sized for pool
   (NULL: one thread); 1 after a message. */
static int g4mm_audio_encode(const g4_model *m, const char *wav, const float *feat, const unsigned char *mask, int nf,
                             g4_pool *pool, int bf16, void *arena, size_t arena_bytes, float *soft, int *n_soft) {
    g4_audio_run run;
    memset(&run, 0, sizeof run);
    run.pool = pool;
    run.bf16 = bf16;
    if (g4_audio_encode(m, feat, mask, nf, arena, arena_bytes, &run, soft, n_soft) != G4_OK) {
        fprintf(stderr, "gemma4: %s: %s\n", wav, run.error);
        return 1;
    }
    return 0;
}

/* The model's audio tower, checked against the feature extractor; 1 after a message. */
static int g4mm_audio_ready(const g4_model *m, const char *dir, const g4_audio_fe *fe) {
    if (!m->audio.loaded) { fprintf(stderr, "gemma4: %s: no audio tower: %s\n", dir, m->audio.error); return 1; }
    if (m->config.audio.subsampling_conv_channels[0] != fe->feature_size) {
        fprintf(stderr, "gemma4: %s: the audio tower takes %d mel bins, the feature extractor makes %d\n", dir,
                m->config.audio.subsampling_conv_channels[0], fe->feature_size);
        return 1;
    }
    return 0;
}

/* ---- the 12B (gemma4_unified): no towers. Images are the same files through
   its Gemma4UnifiedImageProcessor (g4_image_config_check makes the settings
   merged patches), clips raw frames (Gemma4UnifiedAudioFeatureExtractor, one
   soft token each), both through the encoder-free embedders. */

/* A WAV file -> frames of the 12B's feature extractor in f (feat, mask all 1,
   nf = n_soft); 1 after a message naming the file. */
static int g4mm_unified_clip(g4mm *mm, g4mm_file *f) {
    char *bytes = NULL, err[G4_ERROR_MAX];
    float *pcm = NULL;
    size_t len, n = 0;
    int rate = 0, rc = 1;
    long long rows;
    if (g4__read_file(f->path, &bytes, &len, (size_t)1 << 30, err) != G4_OK) { fprintf(stderr, "gemma4: %s\n", err); return 1; }
    err[0] = 0;
    if (g4_wav_parse((const unsigned char *)bytes, len, NULL, 0, &n, &rate, err) != G4_OK) {
        fprintf(stderr, "gemma4: %s: %s\n", f->path, err);
    } else if (rate != mm->ufe.sampling_rate) {
        fprintf(stderr, "gemma4: %s: %d Hz; the feature extractor takes %d Hz\n", f->path, rate, mm->ufe.sampling_rate);
    } else if ((rows = g4_unified_audio_tokens(&mm->ufe, n)) < 1 || rows > (1 << 24)) {
        fprintf(stderr, "gemma4: %s: %zu samples make %lld soft tokens\n", f->path, n, rows);
    } else if (!(pcm = (float *)malloc(sizeof(float) * n)) ||
               !(f->feat = (float *)malloc(sizeof(float) * (size_t)rows * (size_t)mm->ufe.audio_samples_per_token)) ||
               !(f->mask = (unsigned char *)malloc((size_t)rows))) {
        fprintf(stderr, "gemma4: %s: out of memory\n", f->path);
    } else if (g4_wav_parse((const unsigned char *)bytes, len, pcm, n, &n, &rate, err) != G4_OK ||
               g4_unified_fe_frames(&mm->ufe, pcm, n, f->feat, (int)rows, &f->nf) != G4_OK) {
        fprintf(stderr, "gemma4: %s: %s\n", f->path, err[0] ? err : mm->ufe.error);
    } else {
        memset(f->mask, 1, (size_t)rows);
        f->n_soft = f->nf;
        if (f->nf > mm->max_nf) mm->max_nf = f->nf;
        rc = 0;
    }
    free(bytes);
    free(pcm);
    return rc;
}

/* The first image or video (flag: its word, g4mm_word): a model without a vision tower or without
   that id (token_id, named id_name) gets a message; 1 then */
static int g4mm_no_vision(const g4_config *c, const char *dir, const char *flag, int token_id, const char *id_name) {
    if ((c->unified ? c->unified_vision.present : c->vision.present) && token_id >= 0) return 0;
    fprintf(stderr, "gemma4: %s: %s: the model has no vision tower (config.json has no vision_config or no %s)\n", dir, flag,
            id_name);
    return 1;
}

/* g4mm_encode for a 12B: every file through its embedder into buf, in mm->f's order, on pool's threads
   (mm->bf16: the embedders in the bf16-faithful mode, as the towers). */
static int g4mm_unified_encode(g4mm *mm, const g4_model *m, g4_pool *pool, float *buf) {
    int k, used = 0, rows = mm->max_patches > mm->max_nf ? mm->max_patches : mm->max_nf, rc = 1, fr;
    if (mm->vmax_patches > rows) rows = mm->vmax_patches;
    size_t bytes = 0;
    void *arena = NULL;
    g4_unified_run run;
    memset(&run, 0, sizeof run);
    run.pool = pool;
    run.bf16 = mm->bf16;
    if (g4_unified_size_pool(m, rows > 0 ? rows : 1, pool, &bytes) != G4_OK || posix_memalign(&arena, 64, bytes) != 0) {
        fprintf(stderr, "gemma4: out of memory for the embedders' arena\n");
        return 1;
    }
    for (k = 0; k < mm->n; k++) {
        g4mm_file *f = &mm->f[k];
        int got = 0;
        float *out = buf + (size_t)used * m->config.hidden_size;
        if (f->kind == G4_MM_VIDEO) { /* each frame as an image through embed_vision (get_video_features) */
            size_t P = (size_t)3 * mm->vc.patch_size * mm->vc.patch_size;
            for (fr = 0, got = 0; fr < f->n_frames; fr++) {
                int g = 0;
                if (g4_unified_embed_image(m, f->pv + (size_t)fr * mm->vmax_patches * P, f->pos + (size_t)fr * mm->vmax_patches * 2,
                                           mm->vmax_patches, arena, bytes, &run, out + (size_t)got * m->config.hidden_size,
                                           &g) != G4_OK) {
                    fprintf(stderr, "gemma4: %s: %s\n", f->path, run.error);
                    goto done;
                }
                got += g;
            }
        } else if (f->kind != G4_MM_IMAGE && f->kind != G4_MM_AUDIO) {
            fprintf(stderr, "gemma4: %s: the 12B takes images, videos and audio, not this kind of file\n", f->path);
            goto done;
        } else if ((f->kind == G4_MM_IMAGE ? g4_unified_embed_image(m, f->pv, f->pos, mm->max_patches, arena, bytes, &run, out, &got)
                                    : g4_unified_embed_audio(m, f->feat, f->mask, f->nf, arena, bytes, &run, out, &got)) != G4_OK) {
            fprintf(stderr, "gemma4: %s: %s\n", f->path, run.error);
            goto done;
        }
        if (got != f->n_soft) {
            fprintf(stderr, "gemma4: %s: the embedder gave %d soft tokens, the processor counts %d\n", f->path, got, f->n_soft);
            goto done;
        }
        used += got;
    }
    rc = 0;
done:
    free(arena);
    return rc;
}

static int g4mm_prepare(g4mm *mm, const g4_config *c, const char *dir, const char *pdir, const g4a_list *list);
static int g4mm_encode(g4mm *mm, const g4_model *m, const char *dir, g4_pool *pool, float **soft);

/* `gemma4 image` on a 12B (image.h): the file's soft tokens, float32 [n][H] to out (bf16: the
   embedder in the bf16-faithful mode); 1 after a message. */
static int g4mm_unified_image_cmd(const g4_model *m, const char *dir, const char *pdir, const char *path, const char *out,
                                  g4_pool *pool, int bf16) {
    g4mm mm;
    g4a_list one;
    float *soft = NULL;
    FILE *fo = NULL;
    int rc = 1;
    size_t n;
    memset(&one, 0, sizeof one);
    one.value[0] = path;
    one.tag[0] = G4MM_IMAGE;
    one.n = 1;
    if (g4mm_prepare(&mm, &m->config, dir, pdir, &one) == 0 && (mm.bf16 = bf16, g4mm_encode(&mm, m, dir, pool, &soft) == 0)) {
        n = (size_t)mm.total_soft * (size_t)m->config.hidden_size;
        if (!(fo = fopen(out, "wb")) || fwrite(soft, sizeof(float), n, fo) != n || fclose(fo) != 0)
            fprintf(stderr, "gemma4: %s: cannot write (%s)\n", out, strerror(errno));
        else {
            printf("%s: %d merged patches, %d soft tokens (encoder-free embedder)\nwrote %d x %d float32 soft tokens to %s\n",
                   path, mm.total_soft, mm.total_soft, mm.total_soft, m->config.hidden_size, out);
            rc = 0;
        }
        fo = NULL;
    }
    if (fo) fclose(fo);
    g4mm_free(&mm);
    free(soft);
    return rc;
}

static int g4mm_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* p appended to *paths (*n of *cap); 0 when out of memory (p freed). */
static int g4mm_push(char ***paths, int *n, int *cap, char *p) {
    if (!p) return 0;
    if (*n == *cap) {
        char **grown = (char **)realloc(*paths, sizeof **paths * (size_t)(*cap ? 2 * *cap : 16));
        if (!grown) { free(p); return 0; }
        *paths = grown;
        *cap = *cap ? 2 * *cap : 16;
    }
    (*paths)[(*n)++] = p;
    return 1;
}

/* --video's value: a directory's .png/.jpg/.jpeg files by name, or a comma
   list; malloc'd paths (*n), NULL after a message. */
static char **g4mm_frame_paths(const char *value, int *n) {
    char **paths = NULL;
    int cap = 0, k, ok = 1;
    DIR *d = opendir(value);
    *n = 0;
    if (d) {
        struct dirent *e;
        while (ok && (e = readdir(d)) != NULL) {
            size_t l = strlen(e->d_name);
            const char *x = strrchr(e->d_name, '.');
            char *p;
            if (!x || (strcmp(x, ".png") && strcmp(x, ".PNG") && strcmp(x, ".jpg") && strcmp(x, ".JPG") && strcmp(x, ".jpeg") &&
                       strcmp(x, ".JPEG")))
                continue;
            if ((p = (char *)malloc(strlen(value) + l + 2)) != NULL) sprintf(p, "%s/%s", value, e->d_name);
            ok = g4mm_push(&paths, n, &cap, p);
        }
        closedir(d);
        if (*n) qsort(paths, (size_t)*n, sizeof *paths, g4mm_cmp);
    } else {
        const char *q = value;
        while (ok && *q) {
            size_t l = strcspn(q, ",");
            char *p = (char *)malloc(l + 1);
            if (p) { memcpy(p, q, l); p[l] = 0; }
            ok = g4mm_push(&paths, n, &cap, p);
            q += l + (q[l] == ',');
        }
    }
    if (!ok || *n == 0) {
        if (!ok) fprintf(stderr, "gemma4: out of memory\n");
        else fprintf(stderr, "gemma4: --video %s: no frames (a directory of .png/.jpg files, or FILE,FILE,...)\n", value);
        for (k = 0; k < *n; k++) free(paths[k]);
        free(paths);
        *n = 0;
        return NULL;
    }
    return paths;
}

/* A video's frames decoded (one size, RGB) and through the video processor
   into f; 1 after a message. */
static int g4mm_video(g4mm *mm, g4mm_file *f) {
    char **paths;
    uint8_t *frames = NULL, *px = NULL;
    void *scratch = NULL;
    int n, k, h = 0, w = 0, ch, P = 3 * mm->vc.patch_size * mm->vc.patch_size, rc = 1;
    size_t fpx = 0, bytes;
    if (!(paths = g4mm_frame_paths(f->path, &n))) return 1;
    if (n > G4_VIDEO_MAX_FRAMES) { fprintf(stderr, "gemma4: --video %s: %d frames, at most %d\n", f->path, n, G4_VIDEO_MAX_FRAMES); goto done; }
    for (k = 0; k < n; k++) {
        int fh, fw;
        if (g4img_read(paths[k], &px, &fh, &fw, &ch)) goto done;
        if (ch != 3) {
            fprintf(stderr, "gemma4: %s: a frame of %d channels: video frames must be RGB (transformers cannot take RGBA "
                    "frames)\n", paths[k], ch);
            goto done;
        }
        if (k == 0) {
            h = fh; w = fw; fpx = (size_t)h * w * 3;
            if (!(frames = (uint8_t *)malloc(fpx * (size_t)n))) { fprintf(stderr, "gemma4: out of memory\n"); goto done; }
        } else if (fh != h || fw != w) {
            fprintf(stderr, "gemma4: %s: a frame of %d x %d in a video of %d x %d frames (%s)\n", paths[k], fw, fh, w, h, paths[0]);
            goto done;
        }
        memcpy(frames + (size_t)k * fpx, px, fpx);
        free(px);
        px = NULL;
    }
    bytes = g4_video_scratch_size(&mm->vc, h, w);
    if (!bytes) {
        int th, tw;
        g4_image_config ic = g4_image_config_init();
        ic.patch_size = mm->vc.patch_size; ic.pooling_kernel_size = mm->vc.pooling_kernel_size;
        ic.max_soft_tokens = mm->vc.max_soft_tokens; ic.do_resize = mm->vc.do_resize;
        g4_image_target_size(&ic, h, w, &th, &tw); /* for its message */
        fprintf(stderr, "gemma4: %s: %s\n", paths[0], ic.error);
        goto done;
    }
    if (!(f->pv = (float *)malloc(sizeof(float) * (size_t)n * mm->vmax_patches * P)) ||
        !(f->pos = (int32_t *)malloc(sizeof(int32_t) * 2 * (size_t)n * mm->vmax_patches)) || !(scratch = malloc(bytes))) {
        fprintf(stderr, "gemma4: %s: out of memory\n", f->path);
        goto done;
    }
    if (g4_video_preprocess(&mm->vc, frames, n, h, w, 3, scratch, bytes, f->pv, f->pos, &f->per_frame) != G4_OK) {
        fprintf(stderr, "gemma4: --video %s: %s\n", f->path, mm->vc.error);
        goto done;
    }
    f->n_frames = n;
    f->n_soft = n * f->per_frame;
    rc = 0;
done:
    for (k = 0; k < n; k++) free(paths[k]);
    free(paths);
    free(frames);
    free(px);
    free(scratch);
    return rc;
}

/* Every file of list (tags G4MM_IMAGE, G4MM_VIDEO, G4MM_AUDIO) decoded and through its
   processor: images through DIR's (or pdir's) processor_config.json, checked
   against the config c; clips through the feature extractor. 1 after a message. */
static int g4mm_prepare(g4mm *mm, const g4_config *c, const char *dir, const char *pdir, const g4a_list *list) {
    int k;
    memset(mm, 0, sizeof *mm);
    if (list->n == 0) return 0;
    if (!(mm->f = (g4mm_file *)calloc((size_t)list->n, sizeof *mm->f))) { fprintf(stderr, "gemma4: out of memory\n"); return 1; }
    for (k = 0; k < list->n; k++) {
        g4mm_file *f = &mm->f[mm->n];
        f->path = list->value[k];
        int tag = G4MM_KIND(list->tag[k]);
        if (list->tag[k] & G4MM_TYPED) mm->typed |= 1 << tag;
        else mm->flagged |= 1 << tag;
        f->kind = tag == G4MM_IMAGE ? G4_MM_IMAGE : tag == G4MM_VIDEO ? G4_MM_VIDEO : G4_MM_AUDIO;
        mm->n++;
        if (f->kind == G4_MM_VIDEO) {
            if (!mm->n_video) {
                if (g4mm_no_vision(c, dir, g4mm_word(mm, G4MM_VIDEO), c->video_token_id, "video_token_id")) return 1;
                if (g4_video_config_load(&mm->vc, pdir ? pdir : dir) != G4_OK || g4_video_config_check(&mm->vc, c) != G4_OK) {
                    fprintf(stderr, "gemma4: %s: %s\n", pdir ? pdir : dir, mm->vc.error);
                    return 1;
                }
                mm->vc.do_sample_frames = 0; /* frame files are the frames (transformers refuses to sample a list of images) */
                mm->vmax_patches = mm->vc.max_soft_tokens * mm->vc.pooling_kernel_size * mm->vc.pooling_kernel_size;
            }
            mm->n_video++;
            if (g4mm_video(mm, f)) return 1;
            if (f->per_frame + 2 > mm->max_run) mm->max_run = f->per_frame + 2;
        } else if (f->kind == G4_MM_IMAGE) {
            uint8_t *px = NULL;
            void *scratch = NULL;
            int h, w, ch, P, rc = 1;
            size_t bytes;
            if (!mm->n_image) {
                if (g4mm_no_vision(c, dir, g4mm_word(mm, G4MM_IMAGE), c->image_token_id, "image_token_id")) return 1;
                if (g4_image_config_load(&mm->ic, pdir ? pdir : dir) != G4_OK || g4_image_config_check(&mm->ic, c) != G4_OK) {
                    fprintf(stderr, "gemma4: %s: %s\n", pdir ? pdir : dir, mm->ic.error);
                    return 1;
                }
                mm->max_patches = mm->ic.max_soft_tokens * mm->ic.pooling_kernel_size * mm->ic.pooling_kernel_size;
            }
            mm->n_image++;
            P = 3 * mm->ic.patch_size * mm->ic.patch_size;
            if (g4img_read(f->path, &px, &h, &w, &ch)) return 1;
            bytes = g4_image_scratch_size(&mm->ic, h, w);
            if (!bytes) {
                int th, tw;
                g4_image_target_size(&mm->ic, h, w, &th, &tw); /* for its message */
                fprintf(stderr, "gemma4: %s: %s\n", f->path, mm->ic.error);
            } else if (!(f->pv = (float *)malloc(sizeof(float) * (size_t)mm->max_patches * P)) ||
                       !(f->pos = (int32_t *)malloc(sizeof(int32_t) * 2 * (size_t)mm->max_patches)) ||
                       !(scratch = malloc(bytes))) {
                fprintf(stderr, "gemma4: %s: out of memory\n", f->path);
            } else if (g4_image_preprocess(&mm->ic, px, h, w, ch, scratch, bytes, f->pv, f->pos, &f->n_soft) != G4_OK) {
                fprintf(stderr, "gemma4: %s: %s\n", f->path, mm->ic.error);
            } else {
                rc = 0;
            }
            free(px);
            free(scratch);
            if (rc) return 1;
            if (f->n_soft + 2 > mm->max_run) mm->max_run = f->n_soft + 2;
        } else {
            if (c->unified) { /* the 12B: raw frames, its processor's settings checked against the model */
                if (!mm->n_audio && (g4_unified_fe_load(&mm->ufe, pdir ? pdir : dir) != G4_OK ||
                                     g4_unified_fe_check(&mm->ufe, c) != G4_OK || c->audio_token_id < 0 ||
                                     c->boa_token_id < 0 || c->eoa_token_id < 0)) {
                    fprintf(stderr, "gemma4: %s: %s: %s\n", pdir ? pdir : dir, g4mm_word(mm, G4MM_AUDIO),
                            mm->ufe.error[0] ? mm->ufe.error : "the config has no audio, boa or eoa token id");
                    return 1;
                }
                mm->n_audio++;
                if (g4mm_unified_clip(mm, f)) return 1;
                mm->total_soft += f->n_soft;
                continue;
            }
            if (!mm->n_audio) {
                if (!c->audio.present || c->audio_token_id < 0 || c->boa_token_id < 0 || c->eoa_token_id < 0) {
                    fprintf(stderr, "gemma4: %s: %s: the model has no audio tower (config.json has no audio_config "
                            "or no audio, boa or eoa token id)\n", dir, g4mm_word(mm, G4MM_AUDIO));
                    return 1;
                }
                /* the checkpoint's feature extractor settings (processor_config.json), checked against the tower */
                if (g4_audio_fe_load(&mm->fe, pdir ? pdir : dir) != G4_OK) {
                    fprintf(stderr, "gemma4: %s: %s\n", pdir ? pdir : dir, mm->fe.error);
                    return 1;
                }
                mm->has_fe = 1;
                if (g4_audio_fe_check(&mm->fe, c) != G4_OK) {
                    fprintf(stderr, "gemma4: %s: %s: %s\n", pdir ? pdir : dir, g4mm_word(mm, G4MM_AUDIO), mm->fe.error);
                    return 1;
                }
            }
            mm->n_audio++;
            if (g4mm_audio_features(f->path, &mm->fe, &f->feat, &f->mask, &f->nf, NULL)) return 1;
            f->n_soft = g4mm_audio_count(f->mask, f->nf);
            if (f->n_soft < 1) { fprintf(stderr, "gemma4: %s: the clip gives no soft tokens\n", f->path); return 1; }
            if (f->n_soft > mm->fe.audio_seq_length) { /* Gemma4Processor caps the placeholders; the tower would not */
                fprintf(stderr, "gemma4: %s: the clip gives %d soft tokens, but processor_config.json's audio_seq_length "
                        "caps its placeholders at %d\n", f->path, f->n_soft, mm->fe.audio_seq_length);
                return 1;
            }
            if (f->nf > mm->max_nf) mm->max_nf = f->nf;
        }
        mm->total_soft += f->n_soft;
    }
    return 0;
}

/* The prompt's text with each "<|video|>" expanded for the videos in order
   (g4_mm_expand_videos: the frames' stamps, at fps frames per second, 0
   unknown), malloc'd; NULL after a message. */
static char *g4mm_expand_text(const g4mm *mm, const g4_tokenizer *t, const g4_config *c, const char *text, double fps) {
    g4_video_item *items;
    char err[G4_ERROR_MAX], *out = NULL;
    size_t need = 0;
    int k, v = 0;
    if (!(items = (g4_video_item *)calloc((size_t)(mm->n_video ? mm->n_video : 1), sizeof *items))) {
        fprintf(stderr, "gemma4: out of memory\n");
        return NULL;
    }
    for (k = 0; k < mm->n; k++)
        if (mm->f[k].kind == G4_MM_VIDEO) {
            items[v].n_frames = mm->f[k].n_frames;
            items[v].n_soft = mm->f[k].per_frame;
            items[v].fps = fps;
            v++;
        }
    err[0] = 0;
    if (g4_mm_expand_videos(t, c, text, strlen(text), items, v, NULL, 0, &need, err) != G4_OK && need == 0)
        fprintf(stderr, "gemma4: --video: %s\n", err);
    else if (!(out = (char *)malloc(need + 1)))
        fprintf(stderr, "gemma4: out of memory\n");
    else if (g4_mm_expand_videos(t, c, text, strlen(text), items, v, out, need + 1, &need, err) != G4_OK) {
        fprintf(stderr, "gemma4: --video: %s\n", err);
        free(out);
        out = NULL;
    }
    free(items);
    return out;
}

/* Ids whose video placeholders are lone ids (a chat template's <|video|>, or
   --ids): the k-th becomes the ids of the k-th video's expansion text
   (g4_mm_expand_videos on the placeholder alone: each frame's "mm:ss " stamp,
   <|image>, its run, <image|>, frames joined by a space; fps 0: unknown, 24 as
   transformers) tokenized on its own. Gemma4Processor replaces the text and
   tokenizes the whole, which gives the same ids unless the text just before the
   placeholder merges with the first stamp (checked against apply_chat_template
   in tests/test_mm.c). Ids that already hold the frames' runs (a text prompt
   expanded before tokenizing), or no video placeholder, are left as they are;
   g4mm_expand checks the counts. *ids replaced (malloc'd); 1 after a message. */
static int g4mm_expand_video_ids(const g4mm *mm, const g4_tokenizer *t, const g4_config *c, double fps, int32_t **ids,
                                 size_t *n) {
    size_t i, used = 0, cap, len = 0, ptl = 0;
    int lone = 0, runs = 0, k, rc = 1;
    int32_t *out = NULL, vid = c->video_token_id;
    char ph[256], err[G4_ERROR_MAX], *text = NULL;
    if (!mm->n_video || vid < 0) return 0;
    for (i = 0; i < *n; i++)
        if ((*ids)[i] == vid && (i == 0 || (*ids)[i - 1] != vid)) {
            runs++;
            lone += i + 1 == *n || (*ids)[i + 1] != vid;
        }
    if (lone != runs || lone != mm->n_video) return 0;
    if (g4_detokenize(t, &vid, 1, 0, ph, sizeof ph, &ptl) != G4_OK || ptl == 0) {
        fprintf(stderr, "gemma4: the tokenizer has no string for the video placeholder id %d\n", (int)vid);
        return 1;
    }
    cap = *n + 64; /* grown below as each expansion needs */
    if (!(out = (int32_t *)malloc(sizeof(int32_t) * cap))) { fprintf(stderr, "gemma4: out of memory\n"); return 1; }
    used = 0;
    for (i = 0, k = 0; i < *n; i++) {
        g4_video_item item;
        size_t need = 0, got = 0;
        if ((*ids)[i] != vid) { out[used++] = (*ids)[i]; continue; }
        while (mm->f[k].kind != G4_MM_VIDEO) k++; /* the next video, in the flags' order */
        memset(&item, 0, sizeof item);
        item.n_frames = mm->f[k].n_frames;
        item.n_soft = mm->f[k].per_frame;
        item.fps = fps;
        err[0] = 0;
        if (g4_mm_expand_videos(t, c, ph, ptl, &item, 1, NULL, 0, &need, err) != G4_OK && need == 0) {
            fprintf(stderr, "gemma4: --video %s: %s\n", mm->f[k].path, err);
            goto done;
        }
        free(text);
        if (!(text = (char *)malloc(need + 1)) || g4_mm_expand_videos(t, c, ph, ptl, &item, 1, text, need + 1, &len, err) != G4_OK) {
            fprintf(stderr, "gemma4: --video %s: %s\n", mm->f[k].path, text ? err : "out of memory");
            goto done;
        }
        if (cap - used < g4_tokenize_max(t, len) + (*n - i)) { /* room for these ids and the rest of the prompt */
            int32_t *grown;
            cap = used + g4_tokenize_max(t, len) + (*n - i) + cap;
            if (!(grown = (int32_t *)realloc(out, sizeof(int32_t) * cap))) { fprintf(stderr, "gemma4: out of memory\n"); goto done; }
            out = grown;
        }
        if (g4_tokenize(t, text, len, 0, out + used, cap - used, &got) != G4_OK) {
            fprintf(stderr, "gemma4: --video %s: tokenizing its expansion failed\n", mm->f[k].path);
            goto done;
        }
        used += got;
        k++;
    }
    free(*ids);
    *ids = out;
    *n = used;
    out = NULL;
    rc = 0;
done:
    free(out);
    free(text);
    return rc;
}

/* The prompt's ids (one placeholder per file) -> the expanded ids (malloc'd;
   g4_mm_expand, the processor's expansion), and mm->f put in prompt order. A
   placeholder count that differs from the files of its kind is an error naming
   both; 1 after a message. */
static int g4mm_expand(g4mm *mm, const g4_config *c, const int32_t *ids, int n, int32_t **out, int *n_out) {
    int t, k, n_img = 0, n_aud = 0, n_runs = 0, want_runs = 0, next_img = 0, next_aud = 0, at = 0, *counts = NULL, rc = 1;
    int lone = 0;
    size_t need = 0;
    g4mm_file *order = NULL;
    char err[G4_ERROR_MAX];
    *out = NULL;
    *n_out = 0;
    for (t = 0; t < n; t++) {
        int ty = g4_mm_type(c, ids[t]);
        n_img += ty == G4_MM_IMAGE;
        n_aud += ty == G4_MM_AUDIO;
        n_runs += ty == G4_MM_VIDEO && (t == 0 || ids[t - 1] != ids[t]);
    }
    for (k = 0; k < mm->n; k++) want_runs += mm->f[k].kind == G4_MM_VIDEO ? mm->f[k].n_frames : 0;
    for (t = 0; t < n; t++) lone += ids[t] == c->video_token_id && (t == 0 || ids[t - 1] != ids[t]) &&
                                    (t + 1 == n || ids[t + 1] != ids[t]);
    if (n_runs != want_runs || (mm->n_video && lone == n_runs && n_runs != mm->n_video)) {
        if (mm->n_video && lone == n_runs) /* placeholders not expanded (g4mm_expand_video_ids: one per video) */
            fprintf(stderr, "gemma4: the prompt has %d video placeholder%s (id %d) but %d video%s given (%s)\n", n_runs,
                    n_runs == 1 ? "" : "s", c->video_token_id, mm->n_video, mm->n_video == 1 ? " was" : "s were",
                    g4mm_word(mm, G4MM_VIDEO));
        else if (mm->n_video)
            fprintf(stderr, "gemma4: the prompt has %d video frame run%s (id %d) but the %s files have %d frames\n", n_runs,
                    n_runs == 1 ? "" : "s", c->video_token_id, g4mm_word(mm, G4MM_VIDEO), want_runs);
        else
            fprintf(stderr, "gemma4: the prompt has a video placeholder (id %d) but no --video was given\n", c->video_token_id);
        return 1;
    }
    if (n_img != mm->n_image || n_aud != mm->n_audio) {
        if (n_img != mm->n_image)
            fprintf(stderr, "gemma4: the prompt has %d image placeholder%s (id %d) but %d %s file%s given\n", n_img,
                    n_img == 1 ? "" : "s", c->image_token_id, mm->n_image, g4mm_word(mm, G4MM_IMAGE),
                    mm->n_image == 1 ? " was" : "s were");
        if (n_aud != mm->n_audio)
            fprintf(stderr, "gemma4: the prompt has %d audio placeholder%s (id %d) but %d %s file%s given\n", n_aud,
                    n_aud == 1 ? "" : "s", c->audio_token_id, mm->n_audio, g4mm_word(mm, G4MM_AUDIO),
                    mm->n_audio == 1 ? " was" : "s were");
        return 1;
    }
    order = (g4mm_file *)malloc(sizeof *order * (size_t)(mm->n > 0 ? mm->n : 1));
    counts = (int *)malloc(sizeof(int) * (size_t)(mm->n > 0 ? mm->n : 1)); /* images' counts, then the clips' */
    if (!order || !counts) { fprintf(stderr, "gemma4: out of memory\n"); goto done; }
    for (k = 0; k < mm->n; k++) /* each kind's files in the flags' order */
        if (mm->f[k].kind == G4_MM_IMAGE) counts[next_img++] = mm->f[k].n_soft;
        else if (mm->f[k].kind == G4_MM_AUDIO) counts[mm->n_image + next_aud++] = mm->f[k].n_soft;
    next_img = next_aud = 0;
    {
        int next_vid = 0, frame = 0, run_len = 0;
        const g4mm_file *vid = NULL;
        for (t = 0; t < n; t++) { /* the k-th placeholder of a kind takes the k-th file of that kind */
            int ty = g4_mm_type(c, ids[t]), *next = ty == G4_MM_IMAGE ? &next_img : ty == G4_MM_AUDIO ? &next_aud : &next_vid, seen = 0;
            if (ty == G4_MM_VIDEO) { /* a video: its frames' runs, in turn; the file at its first */
                run_len++;
                if (t + 1 < n && ids[t + 1] == ids[t]) continue;
                if (!vid || frame == vid->n_frames) {
                    for (k = 0; k < mm->n; k++)
                        if (mm->f[k].kind == G4_MM_VIDEO && seen++ == next_vid) break;
                    next_vid++;
                    vid = &mm->f[k];
                    order[at++] = mm->f[k];
                    frame = 0;
                }
                if (run_len != vid->per_frame) {
                    fprintf(stderr, "gemma4: --video %s: a frame's run of %d ids, the processor counts %d soft tokens a frame\n",
                            vid->path, run_len, vid->per_frame);
                    goto done;
                }
                frame++;
                run_len = 0;
                continue;
            }
            if (ty == G4_MM_TEXT) continue;
            for (k = 0; k < mm->n; k++)
                if (mm->f[k].kind == ty && seen++ == *next) break;
            (*next)++;
            order[at++] = mm->f[k];
        }
    }
    err[0] = 0;
    g4_mm_expand(c, ids, n, counts, mm->n_image, counts + mm->n_image, mm->n_audio, NULL, 0, &need, err); /* the length */
    if (need == 0 || need > (size_t)INT_MAX || !(*out = (int32_t *)malloc(sizeof(int32_t) * need)) ||
        g4_mm_expand(c, ids, n, counts, mm->n_image, counts + mm->n_image, mm->n_audio, *out, need, &need, err) != G4_OK) {
        fprintf(stderr, "gemma4: %s\n", err[0] && need == 0 ? err : "out of memory for the expanded ids");
        free(*out);
        *out = NULL;
        goto done;
    }
    memcpy(mm->f, order, sizeof *order * (size_t)mm->n);
    *n_out = (int)need;
    rc = 0;
done:
    free(order);
    free(counts);
    return rc;
}

/* The files' soft tokens, in mm->f's order, through m's towers: *soft
   (malloc'd) [mm->total_soft][H]. The vision session (one image at a time,
   max_patches) and the audio arena (the longest clip) are made once. 1 after
   a message (a tower's count that differs from the processor's included). */
static int g4mm_encode(g4mm *mm, const g4_model *m, const char *dir, g4_pool *pool, float **soft) {
    int H = m->config.hidden_size, k, used = 0, rc = 1, max_audio = 0; /* max_audio: the most rows one tower call asks room for */
    g4_vision_session vs;
    void *varena = NULL, *aarena = NULL;
    size_t abytes = 0;
    float *buf = NULL;
    *soft = NULL;
    memset(&vs, 0, sizeof vs);
    for (k = 0; k < mm->n; k++)
        if (mm->f[k].kind == G4_MM_AUDIO && g4_audio_tokens_max(mm->f[k].nf) > max_audio) max_audio = g4_audio_tokens_max(mm->f[k].nf);
    if (mm->n_image && mm->ic.max_soft_tokens > max_audio) max_audio = mm->ic.max_soft_tokens;
    if (mm->n_video && mm->vc.max_soft_tokens > max_audio) max_audio = mm->vc.max_soft_tokens;
    /* the last file's room: a tower asks for its most rows (tokens_max, max_soft_tokens), not its count */
    if (!(buf = (float *)malloc(sizeof(float) * ((size_t)mm->total_soft + (size_t)max_audio) * (size_t)H))) {
        fprintf(stderr, "gemma4: out of memory for %d soft tokens\n", mm->total_soft);
        return 1;
    }
    if (m->config.unified) { /* the 12B: the encoder-free embedders */
        if (g4mm_unified_encode(mm, m, pool, buf)) { free(buf); return 1; }
        *soft = buf;
        return 0;
    }
    if (mm->n_image || mm->n_video) {
        g4_vision_session_config vc;
        size_t vbytes;
        if (!m->vision.loaded) { fprintf(stderr, "gemma4: %s: no vision tower: %s\n", dir, m->vision.error); goto done; }
        memset(&vc, 0, sizeof vc);
        vc.max_patches = mm->max_patches > mm->vmax_patches ? mm->max_patches : mm->vmax_patches;
        vc.pool = pool;
        vc.bf16 = mm->bf16;
        if (g4_vision_session_size(m, &vc, &vbytes) != G4_OK || !(varena = malloc(vbytes)) ||
            g4_vision_session_init(&vs, m, &vc, varena, vbytes) != G4_OK) {
            fprintf(stderr, "gemma4: %s: vision session: %s\n", dir, vs.error[0] ? vs.error : "out of memory");
            goto done;
        }
    }
    if (mm->n_audio) {
        if (g4mm_audio_ready(m, dir, &mm->fe)) goto done;
        if (g4_audio_size_pool(m, mm->max_nf, pool, &abytes) != G4_OK || posix_memalign(&aarena, 64, abytes) != 0) {
            aarena = NULL;
            fprintf(stderr, "gemma4: out of memory for the audio tower's arena\n");
            goto done;
        }
    }
    for (k = 0; k < mm->n; k++) {
        g4mm_file *f = &mm->f[k];
        int got = 0;
        if (f->kind == G4_MM_IMAGE) {
            if (g4_vision_encode(&vs, f->pv, f->pos, mm->max_patches, buf + (size_t)used * H, &got) != G4_OK) {
                fprintf(stderr, "gemma4: %s: %s\n", f->path, vs.error);
                goto done;
            }
        } else if (f->kind == G4_MM_VIDEO) {
            if (g4_video_encode(&vs, f->pv, f->pos, f->n_frames, mm->vmax_patches, buf + (size_t)used * H, &got) != G4_OK) {
                fprintf(stderr, "gemma4: --video %s: %s\n", f->path, vs.error);
                goto done;
            }
        } else if (g4mm_audio_encode(m, f->path, f->feat, f->mask, f->nf, pool, mm->bf16, aarena, abytes, buf + (size_t)used * H,
                                     &got)) {
            goto done;
        }
        if (got != f->n_soft) {
            fprintf(stderr, "gemma4: %s: the tower gave %d soft tokens, the processor counts %d\n", f->path, got, f->n_soft);
            goto done;
        }
        used += got;
    }
    *soft = buf;
    buf = NULL;
    rc = 0;
done:
    free(buf);
    free(varena);
    free(aarena);
    return rc;
}

#endif
