/* manifest.c — parsing and applying ie-convert's quantization manifest
 * (ie_manifest.h, docs/CONVERT.md). */
#include "ie_manifest.h"
#include "ie_kernels.h"
#include "ie_mmap.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *ie_qtarget_name(ie_qtarget_t t)
{
    switch (t) {
    case IE_QT_KEEP: return "keep";
    case IE_QT_F32: return "f32";
    case IE_QT_F16: return "f16";
    case IE_QT_BF16: return "bf16";
    case IE_QT_INT8W: return "int8w";
    case IE_QT_INT4W: return "int4w";
    case IE_QT_MXFP4: return "mxfp4";
    case IE_QT_BSR: return "bsr";
    case IE_QT_INT8W_ROW: return "int8w-row";
    case IE_QT_GGML: return "ggml";
    case IE_QT_AUTO: return "auto";
    }
    return "invalid";
}

/* The ggml block types a rule may ask for (besides mxfp4, its own target). */
static const ie_dtype_t k_ggml_targets[] = {IE_DTYPE_Q8_0, IE_DTYPE_Q4_0,   IE_DTYPE_Q4_1, IE_DTYPE_Q5_0,
                                            IE_DTYPE_Q5_1, IE_DTYPE_IQ4_NL, IE_DTYPE_Q2_K, IE_DTYPE_Q3_K,
                                            IE_DTYPE_Q4_K, IE_DTYPE_Q5_K,   IE_DTYPE_Q6_K, IE_DTYPE_IQ4_XS};

/* The ggml type named s (ie_dtype_name, case-insensitive: q4_K or q4_k), or
 * IE_DTYPE_INVALID. */
static ie_dtype_t parse_ggml(const char *s)
{
    for (size_t i = 0; i < sizeof k_ggml_targets / sizeof k_ggml_targets[0]; i++)
        if (!strcasecmp(s, ie_dtype_name(k_ggml_targets[i]))) return k_ggml_targets[i];
    return IE_DTYPE_INVALID;
}

/* 1 if ie_quantize_row can write type t here (probed on one zero block:
 * a quantizer not built into this build answers -1). */
static int can_quantize(ie_dtype_t t)
{
    float zeros[IE_QK_K] = {0};
    uint8_t out[2 * sizeof(ie_block_q8_k_t)];
    int n = ie_dtype_block_elems(t);
    return n > 0 && n <= IE_QK_K && ie_dtype_block_bytes(t) <= sizeof out && ie_quantize_row(t, zeros, out, n) == 0;
}

ie_dtype_t ie_manifest_auto_fallback(ie_dtype_t t)
{
    switch (t) {
    case IE_DTYPE_Q2_K:
    case IE_DTYPE_Q3_K: return IE_DTYPE_Q4_0;
    case IE_DTYPE_IQ4_XS: return IE_DTYPE_IQ4_NL;
    case IE_DTYPE_Q4_K: return IE_DTYPE_Q5_0;
    case IE_DTYPE_Q5_K: return IE_DTYPE_Q5_1;
    case IE_DTYPE_Q6_K: return IE_DTYPE_Q8_0;
    default: return IE_DTYPE_INVALID;
    }
}

static int parse_target(const char *s, ie_qtarget_t *out)
{
    static const struct {
        const char *n;
        ie_qtarget_t t;
    } tab[] = {{"keep", IE_QT_KEEP},   {"f32", IE_QT_F32},     {"f16", IE_QT_F16},     {"bf16", IE_QT_BF16},
               {"int8w", IE_QT_INT8W}, {"int4w", IE_QT_INT4W}, {"mxfp4", IE_QT_MXFP4}, {"bsr", IE_QT_BSR}};
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(s, tab[i].n)) {
            *out = tab[i].t;
            return 0;
        }
    return -1;
}

static int is_int_target(ie_qtarget_t t) { return t == IE_QT_INT8W || t == IE_QT_INT4W || t == IE_QT_INT8W_ROW; }

/* ------------------------------------------------------------------ parse */

static int key_in(const char *k, const char *const *allowed)
{
    for (; *allowed; allowed++)
        if (!strcmp(k, *allowed)) return 1;
    return 0;
}

/* Every key of object o must be in allowed; else an error naming `where`. */
static ie_status_t check_keys(const cJSON *o, const char *const *allowed, const char *what, const char *where)
{
    for (const cJSON *it = o->child; it; it = it->next)
        if (!it->string || !key_in(it->string, allowed))
            return ie_error_set(IE_ERR_FORMAT, "manifest %s: unknown key \"%s\" in %s", what,
                                it->string ? it->string : "?", where);
    return IE_OK;
}

static ie_status_t parse_gate(const cJSON *g, const char *what, ie_manifest_gate_t *gate)
{
    static const char *const keys[] = {"min_layer_cosine", "max_kl", "max_ppl_increase_pct", "comment", NULL};
    ie_status_t st;
    if (!cJSON_IsObject(g)) return ie_error_set(IE_ERR_FORMAT, "manifest %s: \"gate\" must be an object", what);
    if ((st = check_keys(g, keys, what, "\"gate\"")) != IE_OK) return st;
    struct {
        const char *k;
        int *has;
        double *v;
    } f[] = {{"min_layer_cosine", &gate->has_min_layer_cosine, &gate->min_layer_cosine},
             {"max_kl", &gate->has_max_kl, &gate->max_kl},
             {"max_ppl_increase_pct", &gate->has_max_ppl_increase_pct, &gate->max_ppl_increase_pct}};
    for (size_t i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(g, f[i].k);
        if (!v) continue;
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
            return ie_error_set(IE_ERR_FORMAT, "manifest %s: gate \"%s\" must be a number", what, f[i].k);
        *f[i].has = 1;
        *f[i].v = v->valuedouble;
    }
    return IE_OK;
}

static ie_status_t parse_rule(const cJSON *r, size_t idx, const char *what, ie_manifest_rule_t *rule)
{
    static const char *const keys[] = {"pattern", "dtype",     "group",    "zero",    "scale", "method",
                                       "block",   "threshold", "fallback", "comment", NULL};
    char where[48];
    snprintf(where, sizeof where, "rule %zu", idx);
    ie_status_t st;
    if (!cJSON_IsObject(r)) return ie_error_set(IE_ERR_FORMAT, "manifest %s: %s must be an object", what, where);
    if ((st = check_keys(r, keys, what, where)) != IE_OK) return st;

    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(r, "pattern");
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(r, "dtype");
    const cJSON *grp = cJSON_GetObjectItemCaseSensitive(r, "group");
    const cJSON *zero = cJSON_GetObjectItemCaseSensitive(r, "zero");
    const cJSON *scale = cJSON_GetObjectItemCaseSensitive(r, "scale");
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(r, "method");
    const cJSON *block = cJSON_GetObjectItemCaseSensitive(r, "block");
    const cJSON *thr = cJSON_GetObjectItemCaseSensitive(r, "threshold");
    const cJSON *fb = cJSON_GetObjectItemCaseSensitive(r, "fallback");
    const cJSON *cm = cJSON_GetObjectItemCaseSensitive(r, "comment");

    if (!cJSON_IsString(pat) || !pat->valuestring[0])
        return ie_error_set(IE_ERR_FORMAT, "manifest %s: %s needs a \"pattern\" string", what, where);
    if (!cJSON_IsString(dt))
        return ie_error_set(IE_ERR_FORMAT, "manifest %s: %s needs a \"dtype\" string", what, where);
    rule->gtype = IE_DTYPE_INVALID;
    if (parse_target(dt->valuestring, &rule->target) != 0) {
        rule->gtype = parse_ggml(dt->valuestring);
        if (rule->gtype == IE_DTYPE_INVALID)
            return ie_error_set(
                IE_ERR_FORMAT,
                "manifest %s: %s: unknown dtype \"%s\" (int4w, int8w, bf16, f16, f32, mxfp4, keep, "
                "bsr, or a ggml type: q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_K, q3_K, q4_K, q5_K, "
                "q6_K, iq4_xs)",
                what, where, dt->valuestring);
        if (!can_quantize(rule->gtype))
            return ie_error_set(IE_ERR_FORMAT, "manifest %s: %s: dtype \"%s\": this build has no %s quantizer",
                                what, where, dt->valuestring, ie_dtype_name(rule->gtype));
        rule->target = IE_QT_GGML;
    }
    if (cm && !cJSON_IsString(cm))
        return ie_error_set(IE_ERR_FORMAT, "manifest %s: %s: \"comment\" must be a string", what, where);

    rule->pattern = strdup(pat->valuestring);
    if (!rule->pattern) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    int errcode;
    PCRE2_SIZE erroff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat->valuestring, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &errcode,
                                   &erroff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(errcode, msg, sizeof msg);
        return ie_error_set(IE_ERR_FORMAT, "manifest %s: %s: bad pattern \"%s\" at offset %zu: %s", what, where,
                            pat->valuestring, (size_t)erroff, (const char *)msg);
    }
    rule->re = re;

    int is_int = is_int_target(rule->target);
    /* group */
    rule->group = 32;
    if (grp) {
        if (!is_int)
            return ie_error_set(IE_ERR_FORMAT, "manifest %s: %s: \"group\" applies to int8w/int4w only", what,
                                where);
        if (cJSON_IsString(grp) && !strcmp(grp->valuestring, "row")) {
            rule->group = IE_GROUP_ROW;
        } else if (cJSON_IsNumber(grp) && grp->valuedouble >= 32 && grp->valuedouble <= (1 << 20) &&
                   grp->valuedouble == (double)(int)grp->valuedouble && (int)grp->valuedouble % 32 == 0) {
            /* range first: casting an out-of-range double to int is undefined */
            rule->group = (int)grp->valuedouble;
        } else {
            return ie_error_set(IE_ERR_FORMAT,
                                "manifest %s: %s: bad \"group\" (a positive multiple of 32, or \"row\")", what,
                                where);
        }
    }
    /* zero: the engine's words and the seed README's (docs/CONVERT.md) */
    rule->affine = 0;
    if (zero) {
        static const struct {
            const char *n;
            int affine;
        } zs[] = {{"symmetric", 0},  {"none", 0},      {"per-tensor", 0},  {"affine", 1},
                  {"asymmetric", 1}, {"per-group", 1}, {"per-channel", 1}, {"per-row", 1}};
        int k = -1;
        for (int i = 0; cJSON_IsString(zero) && i < (int)(sizeof zs / sizeof zs[0]) && k < 0; i++)
            if (!strcmp(zero->valuestring, zs[i].n)) k = i;
        if (k < 0)
            return ie_error_set(IE_ERR_FORMAT,
                                "manifest %s: %s: \"zero\" must be \"symmetric\" (or \"none\", \"per-tensor\") or "
                                "\"affine\" (or \"asymmetric\", \"per-group\", \"per-channel\", \"per-row\")",
                                what, where);
        if (!is_int)
            return ie_error_set(IE_ERR_FORMAT, "manifest %s: %s: \"zero\" applies to int8w/int4w only", what,
                                where);
        rule->affine = zs[k].affine;
        if (rule->affine && rule->target != IE_QT_INT4W)
            return ie_error_set(IE_ERR_FORMAT,
                                "manifest %s: %s: int8w is symmetric only (\"zero\": \"%s\" asks for a zero point)",
                                what, where, zero->valuestring);
    }
    /* scale: a method (absmax, mse) or a granularity (per-channel / per-row,
     * per-group, per-tensor); "method" names the method beside a granularity */
    rule->scale = IE_QSCALE_ABSMAX;
    int scale_method = 0;
    if (scale) {
        const char *v = cJSON_IsString(scale) ? scale->valuestring : "";
        if (!strcmp(v, "absmax") || !strcmp(v, "mse")) {
            rule->scale = !strcmp(v, "mse") ? IE_QSCALE_MSE : IE_QSCALE_ABSMAX;
            scale_method = 1;
        } else if (!strcmp(v, "per-channel") || !strcmp(v, "per-row")) {
            /* one scale per output channel (row), or per group of "group"
             * inputs within each channel when a group is given */
            if (!grp) rule->group = IE_GROUP_ROW;
        } else if (!strcmp(v, "per-group")) {
            /* the group: "group", else the default 32 */
        } else if (!strcmp(v, "per-tensor")) {
            return ie_error_set(
                IE_ERR_FORMAT,
                "manifest %s: %s: \"scale\": \"per-tensor\" cannot be honoured: int8w/int4w keep one "
                "scale per row (\"per-channel\") or per group of a row (\"per-group\")",
                what, where);
        } else {
            return ie_error_set(IE_ERR_FORMAT,
                                "manifest %s: %s: \"scale\" must be \"absmax\", \"mse\", \"per-channel\", "
                                "\"per-row\" or \"per-group\"",
                                what, where);
        }
        if (!is_int)
            return ie_error_set(IE_ERR_FORMAT, "manifest %s: %s: \"scale\" applies to int8w/int4w only", what,
                                where);
    }
    if (method) {
        if (!cJSON_IsString(method) ||
            (strcmp(method->valuestring, "absmax") && strcmp(method->valuestring, "mse")))
            return ie_error_set(IE_ERR_FORMAT, "manifest %s: %s: \"method\" must be \"absmax\" or \"mse\"", what,
                                where);
        if (!is_int)
            return ie_error_set(IE_ERR_FORMAT, "manifest %s: %s: \"method\" applies to int8w/int4w only", what,
                                where);
        if (scale_method)
            return ie_error_set(
                IE_ERR_FORMAT,
                "manifest %s: %s: \"scale\" already names the method; give \"method\" only beside a "
                "granularity (\"per-channel\", \"per-group\")",
                what, where);
        rule->scale = !strcmp(method->valuestring, "mse") ? IE_QSCALE_MSE : IE_QSCALE_ABSMAX;
    }
    /* bsr */
    rule->br = 16;
    rule->bc = 16;
    rule->threshold = 0.0f;
    if ((block || thr) && rule->target != IE_QT_BSR)
        return ie_error_set(IE_ERR_FORMAT, "manifest %s: %s: \"block\" and \"threshold\" apply to bsr only", what,
                            where);
    if (block) {
        const cJSON *b0 = cJSON_IsArray(block) && cJSON_GetArraySize(block) == 2 ? cJSON_GetArrayItem(block, 0)
                                                                                 : NULL;
        const cJSON *b1 = b0 ? cJSON_GetArrayItem(block, 1) : NULL;
        if (!b0 || !cJSON_IsNumber(b0) || !cJSON_IsNumber(b1) || b0->valuedouble != (double)b0->valueint ||
            b1->valuedouble != (double)b1->valueint || b0->valueint < 1 || b0->valueint > 64 || b1->valueint < 1 ||
            b1->valueint > 64)
            return ie_error_set(IE_ERR_FORMAT, "manifest %s: %s: \"block\" must be [br, bc], each 1..64", what,
                                where);
        rule->br = b0->valueint;
        rule->bc = b1->valueint;
    }
    if (thr) {
        if (!cJSON_IsNumber(thr) || !isfinite(thr->valuedouble) || thr->valuedouble < 0)
            return ie_error_set(IE_ERR_FORMAT, "manifest %s: %s: \"threshold\" must be a number >= 0", what, where);
        rule->threshold = (float)thr->valuedouble;
    }
    /* fallback */
    rule->has_fallback = 0;
    rule->fb_gtype = IE_DTYPE_INVALID;
    if (fb) {
        ie_qtarget_t t = IE_QT_KEEP;
        ie_dtype_t g = IE_DTYPE_INVALID;
        int ok = cJSON_IsString(fb);
        if (ok && !strcmp(fb->valuestring, "auto")) t = IE_QT_AUTO;
        else if (ok && parse_target(fb->valuestring, &t) != 0) {
            g = parse_ggml(fb->valuestring);
            t = IE_QT_GGML;
            ok = g != IE_DTYPE_INVALID;
        }
        if (!ok || !(t == IE_QT_KEEP || t == IE_QT_F32 || t == IE_QT_F16 || t == IE_QT_BF16 || t == IE_QT_INT8W ||
                     t == IE_QT_GGML || t == IE_QT_AUTO))
            return ie_error_set(IE_ERR_FORMAT,
                                "manifest %s: %s: \"fallback\" must be \"keep\", \"f32\", \"f16\", \"bf16\", "
                                "\"int8w\", a ggml type (q8_0, q5_0, ...) or \"auto\"",
                                what, where);
        if (t == IE_QT_AUTO) {
            if (rule->target != IE_QT_GGML)
                return ie_error_set(IE_ERR_FORMAT,
                                    "manifest %s: %s: \"fallback\": \"auto\" applies to ggml dtypes (q4_K, ...)",
                                    what, where);
            g = ie_manifest_auto_fallback(rule->gtype);
        }
        if (g != IE_DTYPE_INVALID && !can_quantize(g))
            return ie_error_set(IE_ERR_FORMAT,
                                "manifest %s: %s: \"fallback\" needs %s, which this build cannot write", what,
                                where, ie_dtype_name(g));
        rule->has_fallback = 1;
        rule->fallback = t == IE_QT_INT8W ? IE_QT_INT8W_ROW : t;
        rule->fb_gtype = g;
    }
    return IE_OK;
}

ie_status_t ie_manifest_parse(const char *text, size_t len, const char *what, ie_manifest_t **out)
{
    static const char *const keys[] = {"version", "rules", "gate", "comment", NULL};
    ie_status_t st = IE_OK;
    ie_manifest_t *m = NULL;
    cJSON *root = NULL;
    *out = NULL;
    if (!what) what = "(text)";

    root = cJSON_ParseWithLength(text, len);
    if (!root) {
        const char *e = cJSON_GetErrorPtr();
        long off = e && e >= text && e <= text + len ? (long)(e - text) : -1;
        st = ie_error_set(IE_ERR_FORMAT, "manifest %s: invalid JSON near byte %ld", what, off);
        goto done;
    }
    if (!cJSON_IsObject(root)) {
        st = ie_error_set(IE_ERR_FORMAT, "manifest %s: must be a JSON object", what);
        goto done;
    }
    if ((st = check_keys(root, keys, what, "the manifest")) != IE_OK) goto done;
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "version");
    const cJSON *rules = cJSON_GetObjectItemCaseSensitive(root, "rules");
    const cJSON *gate = cJSON_GetObjectItemCaseSensitive(root, "gate");
    const cJSON *cm = cJSON_GetObjectItemCaseSensitive(root, "comment");
    if (!cJSON_IsNumber(ver) || ver->valuedouble != 1.0) {
        st = ie_error_set(IE_ERR_FORMAT, "manifest %s: \"version\" must be 1", what);
        goto done;
    }
    if (!cJSON_IsArray(rules)) {
        st = ie_error_set(IE_ERR_FORMAT, "manifest %s: \"rules\" must be an array", what);
        goto done;
    }
    if (cm && !cJSON_IsString(cm)) {
        st = ie_error_set(IE_ERR_FORMAT, "manifest %s: \"comment\" must be a string", what);
        goto done;
    }
    m = calloc(1, sizeof *m);
    if (!m) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto done;
    }
    m->version = 1;
    int n = cJSON_GetArraySize(rules);
    if (n > 0) {
        m->rules = calloc((size_t)n, sizeof *m->rules);
        if (!m->rules) {
            st = ie_error_set(IE_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    for (const cJSON *r = rules->child; r; r = r->next) {
        st = parse_rule(r, m->n_rules, what, &m->rules[m->n_rules]);
        m->n_rules++; /* counted even when half-filled, so destroy frees it */
        if (st != IE_OK) goto done;
    }
    if (gate && (st = parse_gate(gate, what, &m->gate)) != IE_OK) goto done;
    m->json = cJSON_PrintUnformatted(root);
    if (!m->json) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto done;
    }

done:
    cJSON_Delete(root);
    if (st != IE_OK) ie_manifest_destroy(&m);
    *out = m;
    return st;
}

ie_status_t ie_manifest_load(const char *path, ie_manifest_t **out)
{
    char *buf = NULL;
    size_t len = 0;
    *out = NULL;
    ie_status_t st = ie_file_read("manifest", path, (size_t)64 << 20, &buf, &len);
    if (st == IE_OK) st = ie_manifest_parse(buf, len, path, out);
    free(buf);
    return st;
}

void ie_manifest_destroy(ie_manifest_t **self_p)
{
    if (!self_p || !*self_p) return;
    ie_manifest_t *m = *self_p;
    for (size_t i = 0; i < m->n_rules; i++) {
        free(m->rules[i].pattern);
        pcre2_code_free((pcre2_code *)m->rules[i].re);
    }
    free(m->rules);
    cJSON_free(m->json);
    free(m);
    *self_p = NULL;
}

int ie_manifest_match(const ie_manifest_t *m, const char *name)
{
    int found = -1;
    for (size_t i = 0; i < m->n_rules && found < 0; i++) {
        pcre2_code *re = m->rules[i].re;
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
        if (!md) return -1;
        int rc = pcre2_match(re, (PCRE2_SPTR)name, PCRE2_ZERO_TERMINATED, 0, 0, md, NULL);
        pcre2_match_data_free(md);
        if (rc >= 0) found = (int)i;
    }
    return found;
}

/* ----------------------------------------------------------- pretranspose */

ie_status_t ie_pretranspose_parse(const char *s, ie_pretranspose_t *out)
{
    static const char *const names[] = {"none", "woh", "wxh", "all"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i])) {
            *out = (ie_pretranspose_t)i;
            return IE_OK;
        }
    return ie_error_set(IE_ERR_INVAL, "bad --pretranspose '%s' (none, woh, wxh or all)", s);
}

const char *ie_pretranspose_name(ie_pretranspose_t p)
{
    switch (p) {
    case IE_PT_NONE: return "none";
    case IE_PT_WOH: return "woh";
    case IE_PT_WXH: return "wxh";
    case IE_PT_ALL: return "all";
    }
    return "invalid";
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

int ie_pretranspose_selects(ie_pretranspose_t p, const char *name, int tied)
{
    int is_embd = !strcmp(name, "token_embd.weight");
    if (is_embd && !tied) return 0;
    int woh = is_embd || !strcmp(name, "output.weight") ||
              (!strncmp(name, "blk.", 4) && ends_with(name, ".attn_output.weight"));
    switch (p) {
    case IE_PT_NONE: return 0;
    case IE_PT_WOH: return woh;
    case IE_PT_WXH: return !woh && !strncmp(name, "blk.", 4);
    case IE_PT_ALL: return 1;
    }
    return 0;
}

/* ----------------------------------------------------------------- decide */

static ie_dtype_t float_dtype(ie_qtarget_t t)
{
    switch (t) {
    case IE_QT_F32: return IE_DTYPE_F32;
    case IE_QT_F16: return IE_DTYPE_F16;
    case IE_QT_BF16: return IE_DTYPE_BF16;
    case IE_QT_MXFP4: return IE_DTYPE_MXFP4;
    default: return IE_DTYPE_INVALID;
    }
}

/* Fill d for target t (group g: IE_GROUP_ROW or G) or return a reason the
 * shape does not fit (static string), NULL if it fits. */
static const char *try_target(ie_qtarget_t t, ie_dtype_t gt, int g, int affine, const ie_manifest_rule_t *r,
                              ie_pretranspose_t pt, int tied, const char *name, ie_dtype_t src_dtype,
                              ie_layout_t src_layout, int src_group, int n_dims, const int64_t ne[4],
                              ie_qdecision_t *d, char *why, size_t why_cap)
{
    int64_t n_in = ne[0];
    d->target = t;
    d->group = 0;
    d->layout = IE_LAYOUT_ROWS;
    d->lossless = 0;
    d->br = d->bc = 0;
    d->threshold = 0;
    d->scale = r ? r->scale : IE_QSCALE_ABSMAX;
    switch (t) {
    case IE_QT_KEEP:
        d->dtype = src_dtype;
        d->layout = src_layout;
        d->group = src_group;
        d->lossless = 1;
        return NULL;
    case IE_QT_F32:
    case IE_QT_F16:
    case IE_QT_BF16:
    case IE_QT_MXFP4:
        d->dtype = float_dtype(t);
        if (t == IE_QT_MXFP4 && n_in % 32 != 0) {
            snprintf(why, why_cap, "row length %lld is not a multiple of 32 (mxfp4 blocks)", (long long)n_in);
            return why;
        }
        d->lossless = src_dtype == d->dtype && src_layout == IE_LAYOUT_ROWS;
        return NULL;
    case IE_QT_INT8W:
    case IE_QT_INT4W:
    case IE_QT_INT8W_ROW: {
        int G = (t == IE_QT_INT8W_ROW || g == IE_GROUP_ROW) ? (n_in > (1 << 30) ? 0 : (int)n_in) : g;
        d->dtype = t == IE_QT_INT4W ? (affine ? IE_DTYPE_I4WA : IE_DTYPE_I4W) : IE_DTYPE_I8W;
        d->target = t == IE_QT_INT8W_ROW ? IE_QT_INT8W : t;
        if (G <= 0 || ie_pack_check(d->dtype, G, n_in) != 0) {
            if (g == IE_GROUP_ROW || t == IE_QT_INT8W_ROW)
                snprintf(why, why_cap, "group \"row\" needs a row length that is a multiple of 32, not %lld",
                         (long long)n_in);
            else snprintf(why, why_cap, "group %d does not divide the row length %lld", G, (long long)n_in);
            return why;
        }
        d->group = G;
        d->layout = ie_pretranspose_selects(pt, name, tied) ? IE_LAYOUT_PANEL16 : IE_LAYOUT_ROWS;
        if (src_layout == IE_LAYOUT_ROWS && G == 32 && ie_pack_target(src_dtype) == d->dtype) d->lossless = 1;
        if (src_layout == IE_LAYOUT_ROWS && src_dtype == d->dtype && src_group == G) d->lossless = 1;
        if (src_layout == IE_LAYOUT_PANEL16 && d->layout == IE_LAYOUT_PANEL16 && src_dtype == d->dtype &&
            src_group == G)
            d->lossless = 1;
        return NULL;
    }
    case IE_QT_GGML: {
        /* ggml blocks along each row: ROWS, or PANEL16 (group = block size)
         * where --pretranspose selects the tensor and this build packs it */
        int qk = ie_dtype_block_elems(gt);
        d->dtype = gt;
        if (qk <= 0 || n_in % qk != 0) {
            snprintf(why, why_cap, "row length %lld is not a multiple of %s's block of %d", (long long)n_in,
                     ie_dtype_name(gt), qk);
            return why;
        }
        if (ie_pretranspose_selects(pt, name, tied) && ie_pack_check(gt, qk, n_in) == 0) {
            d->layout = IE_LAYOUT_PANEL16;
            d->group = qk;
        }
        d->lossless = src_dtype == gt && (src_layout == IE_LAYOUT_ROWS || src_layout == d->layout);
        return NULL;
    }
    case IE_QT_AUTO: break; /* resolved by ie_manifest_decide */
    case IE_QT_BSR:
        d->dtype = IE_DTYPE_F32;
        d->layout = IE_LAYOUT_BSR;
        d->br = r->br;
        d->bc = r->bc;
        d->threshold = r->threshold;
        if (n_dims > 2 && (ne[2] > 1 || (n_dims > 3 && ne[3] > 1))) {
            snprintf(why, why_cap, "bsr is for 2-D matrices, not a %d-D tensor", n_dims);
            return why;
        }
        if (n_in % r->bc != 0 || ne[1] % r->br != 0) {
            snprintf(why, why_cap, "block [%d, %d] does not divide the shape %lld x %lld", r->br, r->bc,
                     (long long)ne[1], (long long)n_in);
            return why;
        }
        return NULL;
    }
    snprintf(why, why_cap, "internal: bad target");
    return why;
}

/* The name a rule's target goes by in messages ("q4_K" for a ggml one). */
static const char *target_name(ie_qtarget_t t, ie_dtype_t gt)
{
    return t == IE_QT_GGML ? ie_dtype_name(gt) : ie_qtarget_name(t);
}

ie_status_t ie_manifest_decide(const ie_manifest_t *m, ie_pretranspose_t pt, int tied, const char *name,
                               ie_dtype_t src_dtype, ie_layout_t src_layout, int src_group, int n_dims,
                               const int64_t ne[4], ie_qdecision_t *out)
{
    char why[160];
    memset(out, 0, sizeof *out);
    out->rule = -1;
    int is_matrix = n_dims >= 2 && ne[1] > 1;
    int ri = is_matrix ? ie_manifest_match(m, name) : -1;
    if (ri < 0) {
        try_target(IE_QT_KEEP, IE_DTYPE_INVALID, 0, 0, NULL, pt, tied, name, src_dtype, src_layout, src_group,
                   n_dims, ne, out, why, sizeof why);
        return IE_OK;
    }
    const ie_manifest_rule_t *r = &m->rules[ri];
    out->rule = ri;
    const char *bad = try_target(r->target, r->gtype, r->group, r->affine, r, pt, tied, name, src_dtype, src_layout,
                                 src_group, n_dims, ne, out, why, sizeof why);
    if (!bad) return IE_OK;
    if (r->has_fallback) {
        char why2[160];
        ie_qtarget_t ft = r->fallback;
        ie_dtype_t fg = r->fb_gtype;
        /* "auto": llama-quantize's substitute type, else f16 */
        if (ft == IE_QT_AUTO) {
            ft = IE_QT_GGML;
            if (fg == IE_DTYPE_INVALID || ne[0] % ie_dtype_block_elems(fg) != 0) ft = IE_QT_F16;
        }
        const char *bad2 = try_target(ft, fg, IE_GROUP_ROW, 0, r, pt, tied, name, src_dtype, src_layout, src_group,
                                      n_dims, ne, out, why2, sizeof why2);
        out->rule = ri;
        out->fell_back = 1;
        if (!bad2) return IE_OK;
        return ie_error_set(IE_ERR_FORMAT,
                            "manifest rule %d (\"%s\", %s) and its fallback %s do not fit tensor %s: %s", ri,
                            r->pattern, target_name(r->target, r->gtype), target_name(ft, fg), name, bad2);
    }
    return ie_error_set(IE_ERR_FORMAT, "manifest rule %d (\"%s\", %s) does not fit tensor %s: %s%s", ri, r->pattern,
                        target_name(r->target, r->gtype), name, bad,
                        r->target == IE_QT_GGML ? " (a \"fallback\" such as \"auto\" picks a type that fits)" : "");
}
