/* image.h - the CLI's images: PNG and JPEG files decoded by libpng and
   libjpeg(-turbo) (the decoders PIL uses), then the image processor, the
   vision tower, and the placeholder expansion of gemma4.h. Included by
   examples/gemma4.c after gemma4.h; link with -lpng -ljpeg.

   Decoded as PIL's Image.open + transformers' convert_to_rgb see the file:
   8-bit RGB and RGBA as stored; palette, gray and gray+alpha expanded (a tRNS
   chunk becomes alpha); 16-bit samples keep their high byte (PIL's "RGB;16B");
   no gamma or colour management; JPEG through libjpeg with its defaults (islow
   DCT, fancy upsampling) to RGB, CMYK refused. No EXIF rotation (transformers'
   processor does none on an opened image). */
#ifndef G4_IMAGE_H
#define G4_IMAGE_H

#include <png.h>
#include <jpeglib.h>
#include <jerror.h> /* JWRN_JPEG_EOF */
#include <errno.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- PNG */
typedef struct { const char *path; char msg[200]; } g4img__png_err;

static void g4img__png_error(png_structp png, png_const_charp msg) {
    g4img__png_err *e = (g4img__png_err *)png_get_error_ptr(png);
    if (e) snprintf(e->msg, sizeof e->msg, "%s", msg);
    png_longjmp(png, 1);
}
static void g4img__png_warning(png_structp png, png_const_charp msg) { (void)png; (void)msg; }

static int g4img__read_png(FILE *f, const char *path, uint8_t **pixels, int *h, int *w, int *channels) {
    g4img__png_err err;
    png_structp png;
    png_infop info;
    png_bytep *volatile rows = NULL;
    uint8_t *volatile buf = NULL;
    png_uint_32 width, height;
    int depth, type, ch, y;
    memset(&err, 0, sizeof err);
    err.path = path;
    png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &err, g4img__png_error, g4img__png_warning);
    if (!png) { fprintf(stderr, "gemma4: %s: out of memory\n", path); return 1; }
    info = png_create_info_struct(png);
    if (!info || setjmp(png_jmpbuf(png))) {
        fprintf(stderr, "gemma4: %s: not a readable PNG (%s)\n", path, err.msg[0] ? err.msg : "libpng failed");
        free(rows);
        free(buf);
        png_destroy_read_struct(&png, info ? &info : NULL, NULL);
        return 1;
    }
    png_init_io(png, f);
    png_set_user_limits(png, 32768, 32768);
    png_read_info(png, info);
    png_get_IHDR(png, info, &width, &height, &depth, &type, NULL, NULL, NULL);
    if ((uint64_t)width * height > ((uint64_t)1 << 28)) png_error(png, "more than 2^28 pixels");
    if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
    if (depth == 16) png_set_strip_16(png);
    if (type == PNG_COLOR_TYPE_GRAY || type == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    ch = png_get_channels(png, info);
    if ((ch != 3 && ch != 4) || png_get_bit_depth(png, info) != 8) png_error(png, "unexpected layout after expansion");
    buf = (uint8_t *)malloc((size_t)width * height * ch);
    rows = (png_bytep *)malloc(sizeof(png_bytep) * height);
    if (!buf || !rows) png_error(png, "out of memory");
    for (y = 0; y < (int)height; y++) rows[y] = buf + (size_t)y * width * ch;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    png_destroy_read_struct(&png, &info, NULL);
    free(rows);
    *pixels = buf; *h = (int)height; *w = (int)width; *channels = ch;
    return 0;
}

/* --------------------------------------------------------------- JPEG */
typedef struct { struct jpeg_error_mgr pub; jmp_buf jb; char msg[JMSG_LENGTH_MAX]; int truncated; } g4img__jpg_err;

/* a warning: a file that ends early is an error (PIL raises "image file is truncated") */
static void g4img__jpg_emit(j_common_ptr cinfo, int level) {
    g4img__jpg_err *e = (g4img__jpg_err *)(void *)cinfo->err;
    if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) e->truncated = 1;
}

static void g4img__jpg_exit(j_common_ptr cinfo) {
    g4img__jpg_err *e = (g4img__jpg_err *)(void *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, e->msg);
    longjmp(e->jb, 1);
}
static void g4img__jpg_output(j_common_ptr cinfo) { (void)cinfo; }

static int g4img__read_jpeg(FILE *f, const char *path, uint8_t **pixels, int *h, int *w, int *channels) {
    struct jpeg_decompress_struct cinfo;
    g4img__jpg_err err;
    uint8_t *volatile buf = NULL;
    memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = g4img__jpg_exit;
    err.pub.output_message = g4img__jpg_output;
    err.pub.emit_message = g4img__jpg_emit;
    err.msg[0] = 0;
    err.truncated = 0;
    if (setjmp(err.jb)) {
        fprintf(stderr, "gemma4: %s: not a readable JPEG (%s)\n", path, err.msg);
        jpeg_destroy_decompress(&cinfo);
        free(buf);
        return 1;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_stdio_src(&cinfo, f);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
        snprintf(err.msg, sizeof err.msg, "CMYK JPEGs are not supported");
        longjmp(err.jb, 1);
    }
    if (cinfo.image_width > 32768 || cinfo.image_height > 32768 ||
        (uint64_t)cinfo.image_width * cinfo.image_height > ((uint64_t)1 << 28)) {
        snprintf(err.msg, sizeof err.msg, "%u x %u pixels is too large", cinfo.image_width, cinfo.image_height);
        longjmp(err.jb, 1);
    }
    cinfo.out_color_space = JCS_RGB;
    jpeg_start_decompress(&cinfo);
    if (cinfo.output_components != 3) {
        snprintf(err.msg, sizeof err.msg, "%d components after decoding", cinfo.output_components);
        longjmp(err.jb, 1);
    }
    buf = (uint8_t *)malloc((size_t)cinfo.output_width * cinfo.output_height * 3);
    if (!buf) { snprintf(err.msg, sizeof err.msg, "out of memory"); longjmp(err.jb, 1); }
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = buf + (size_t)cinfo.output_scanline * cinfo.output_width * 3;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    if (err.truncated) { snprintf(err.msg, sizeof err.msg, "the file ends early (truncated)"); longjmp(err.jb, 1); }
    jpeg_finish_decompress(&cinfo);
    *pixels = buf; *h = (int)cinfo.output_height; *w = (int)cinfo.output_width; *channels = 3;
    jpeg_destroy_decompress(&cinfo);
    return 0;
}

/* A PNG or JPEG file (told apart by its first bytes) -> pixels [h][w][channels]
   (3 or 4), malloc'ed. 0, or 1 after a message naming the file. */
static int g4img_read(const char *path, uint8_t **pixels, int *h, int *w, int *channels) {
    unsigned char sig[8];
    FILE *f = fopen(path, "rb");
    int rc;
    *pixels = NULL;
    if (!f) { fprintf(stderr, "gemma4: %s: cannot open (%s)\n", path, strerror(errno)); return 1; }
    if (fread(sig, 1, 8, f) != 8) { fprintf(stderr, "gemma4: %s: too short for an image\n", path); fclose(f); return 1; }
    rewind(f);
    if (png_sig_cmp(sig, 0, 8) == 0) rc = g4img__read_png(f, path, pixels, h, w, channels);
    else if (sig[0] == 0xFF && sig[1] == 0xD8) rc = g4img__read_jpeg(f, path, pixels, h, w, channels);
    else { fprintf(stderr, "gemma4: %s: neither PNG nor JPEG\n", path); rc = 1; }
    fclose(f);
    return rc;
}

/* The vision side of a model directory: the processor's settings (checked
   against the model) and a tower session for one image at a time (bf16: in
   the bf16-faithful mode). */
typedef struct {
    g4_image_config ic;
    g4_vision_session vs;
    void *arena;
    int max_patches;
} g4img_ctx;

G4__MAYBE_UNUSED static int g4img_open(g4img_ctx *c, const g4_model *m, const char *dir, g4_pool *pool, int bf16) {
    g4_vision_session_config vc;
    size_t bytes;
    memset(c, 0, sizeof *c);
    if (!m->vision.loaded) { fprintf(stderr, "gemma4: %s: no vision tower: %s\n", dir, m->vision.error); return 1; }
    if (g4_image_config_load(&c->ic, dir) != G4_OK || g4_image_config_check(&c->ic, &m->config) != G4_OK) {
        fprintf(stderr, "gemma4: %s: %s\n", dir, c->ic.error);
        return 1;
    }
    memset(&vc, 0, sizeof vc);
    c->max_patches = vc.max_patches = c->ic.max_soft_tokens * c->ic.pooling_kernel_size * c->ic.pooling_kernel_size;
    vc.pool = pool;
    vc.bf16 = bf16;
    if (g4_vision_session_size(m, &vc, &bytes) != G4_OK || !(c->arena = malloc(bytes)) ||
        g4_vision_session_init(&c->vs, m, &vc, c->arena, bytes) != G4_OK) {
        fprintf(stderr, "gemma4: %s: vision session: %s\n", dir, c->vs.error[0] ? c->vs.error : "out of memory");
        free(c->arena);
        c->arena = NULL;
        return 1;
    }
    return 0;
}

G4__MAYBE_UNUSED static void g4img_close(g4img_ctx *c) { free(c->arena); c->arena = NULL; }

/* One image file -> its soft tokens, appended at soft + *n_soft * H (room for
   max_soft_tokens more rows); *n_soft grows by their count. 0, or 1 after a message. */
static int g4img_encode_file(g4img_ctx *c, const char *path, float *soft, int *n_soft, int H) {
    uint8_t *px = NULL;
    void *scratch = NULL;
    float *pv = NULL;
    int32_t *pos = NULL;
    int h, w, ch, n = 0, got = 0, rc = 1;
    size_t bytes;
    if (g4img_read(path, &px, &h, &w, &ch)) return 1;
    bytes = g4_image_scratch_size(&c->ic, h, w);
    pv = (float *)malloc(sizeof(float) * (size_t)c->max_patches * 3 * c->ic.patch_size * c->ic.patch_size);
    pos = (int32_t *)malloc(sizeof(int32_t) * 2 * (size_t)c->max_patches);
    scratch = bytes ? malloc(bytes) : NULL;
    if (!bytes) {
        g4_image_target_size(&c->ic, h, w, &n, &n); /* for its message */
        fprintf(stderr, "gemma4: %s: %s\n", path, c->ic.error);
    } else if (!pv || !pos || !scratch) {
        fprintf(stderr, "gemma4: %s: out of memory\n", path);
    } else if (g4_image_preprocess(&c->ic, px, h, w, ch, scratch, bytes, pv, pos, &n) != G4_OK) {
        fprintf(stderr, "gemma4: %s: %s\n", path, c->ic.error);
    } else if (g4_vision_encode(&c->vs, pv, pos, c->max_patches, soft + (size_t)*n_soft * H, &got) != G4_OK) {
        fprintf(stderr, "gemma4: %s: %s\n", path, c->vs.error);
    } else if (got != n) {
        fprintf(stderr, "gemma4: %s: the tower gave %d soft tokens, the processor %d\n", path, got, n);
    } else {
        *n_soft += got;
        rc = 0;
    }
    free(px); free(scratch); free(pv); free(pos);
    return rc;
}

/* A prompt with images: ids holding one image_token_id per image (as the text
   "<|image|>" tokenizes), the image files in order -> the expanded ids
   (boi, n x image, eoi per image: Gemma4Processor's) and the soft tokens for
   g4_forward_mm, both malloc'ed. 0, or 1 after a message. */
G4__MAYBE_UNUSED static int g4img_prompt(g4img_ctx *c, const g4_model *m, const int32_t *ids, int n, const char *const *files, int n_files,
                        int32_t **out_ids, int *n_out, float **soft, int *n_soft) {
    int H = m->config.hidden_size, k, *counts = NULL, rc = 1;
    size_t need = 0;
    char err[G4_ERROR_MAX];
    *out_ids = NULL; *soft = NULL; *n_out = *n_soft = 0;
    counts = (int *)malloc(sizeof(int) * (size_t)(n_files > 0 ? n_files : 1));
    *soft = (float *)malloc(sizeof(float) * (size_t)(n_files > 0 ? n_files : 1) * c->ic.max_soft_tokens * H);
    if (!counts || !*soft) { fprintf(stderr, "gemma4: out of memory\n"); goto done; }
    for (k = 0; k < n_files; k++) {
        int before = *n_soft;
        if (g4img_encode_file(c, files[k], *soft, n_soft, H)) goto done;
        counts[k] = *n_soft - before;
    }
    err[0] = 0;
    g4_mm_expand_images(&m->config, ids, n, counts, n_files, NULL, 0, &need, err); /* the length (or why not) */
    if (need == 0) { fprintf(stderr, "gemma4: %s\n", n > 0 ? err : "the prompt has no ids"); goto done; }
    if (!(*out_ids = (int32_t *)malloc(sizeof(int32_t) * need)) ||
        g4_mm_expand_images(&m->config, ids, n, counts, n_files, *out_ids, need, &need, err) != G4_OK) {
        fprintf(stderr, "gemma4: %s\n", *out_ids ? err : "out of memory");
        goto done;
    }
    *n_out = (int)need;
    rc = 0;
done:
    free(counts);
    if (rc) { free(*out_ids); free(*soft); *out_ids = NULL; *soft = NULL; *n_out = *n_soft = 0; }
    return rc;
}

/* gemma4 image DIR IMG --out F [--processor PDIR]: one image's soft tokens as
   they enter the decoder (embed_vision's output), float32 [n][H], to F. The
   processor's settings come from PDIR (default DIR)/processor_config.json.
   Needs load_model (examples/gemma4.c); G4_IMAGE_NO_CLI leaves it out. */
#ifndef G4_IMAGE_NO_CLI
static int load_model(g4_model *m, const char *dir);
static int g4mm_unified_image_cmd(const g4_model *m, const char *dir, const char *pdir, const char *path, const char *out,
                                  g4_pool *pool, int bf16);

static int g4img_cmd_image(int argc, char **argv) {
    const char *dir, *img, *out = NULL, *pdir = NULL, *pos[2];
    g4_model m;
    g4img_ctx c;
    float *soft = NULL;
    int n = 0, H, rc = 1, bf16 = 0;
    FILE *f;
    g4_pool *pool;
    rc = parse_soft_cmd(argc, argv, "image", "DIR IMAGE.png|jpg",
                        "One image's soft tokens as they enter the decoder (embed_vision's output): the file decoded as\n"
                        "PIL opens it, the image processor, the vision tower.",
                        "where the soft tokens go, float32 [n][hidden_size]",
                        "the directory of processor_config.json (default: the model's)", pos, &out, &pdir, &bf16);
    if (rc != G4A_RESULT_OK) return rc == G4A_RESULT_HELP ? 0 : 1;
    rc = 1;
    dir = pos[0];
    img = pos[1];
    if (load_model(&m, dir)) return 1;
    if (m.config.unified) { /* the 12B: no tower, its encoder-free embedder (mm.h) */
        rc = get_pool(&pool) ? 1 : g4mm_unified_image_cmd(&m, dir, pdir, img, out, pool, bf16);
        g4_model_free(&m);
        return rc;
    }
    if (get_pool(&pool) || g4img_open(&c, &m, pdir ? pdir : dir, pool, bf16)) { g4_model_free(&m); return 1; }
    H = m.config.hidden_size;
    if (!(soft = (float *)malloc(sizeof(float) * (size_t)c.ic.max_soft_tokens * H))) fprintf(stderr, "gemma4: out of memory\n");
    else if (!g4img_encode_file(&c, img, soft, &n, H)) {
        if (!(f = fopen(out, "wb"))) fprintf(stderr, "gemma4: %s: cannot write (%s)\n", out, strerror(errno));
        else {
            int ok = fwrite(soft, sizeof(float), (size_t)n * H, f) == (size_t)n * H;
            if (fclose(f) != 0) ok = 0;
            if (!ok) fprintf(stderr, "gemma4: %s: short write\n", out);
            else {
                printf("wrote %d x %d float32 soft tokens to %s\n", n, H, out);
                rc = 0;
            }
        }
    }
    free(soft);
    g4img_close(&c);
    g4_model_free(&m);
    return rc;
}
#endif

#endif
