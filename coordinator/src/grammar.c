/* grammar.c — JSON Schema -> byte matcher -> token mask (ie_grammar.h).
 *
 * Compilation turns the schema into nodes (indices into one array, so $ref
 * recursion is just an index that points back). A node is one of
 *   ALT  alternatives (anyOf, oneOf, type lists, enum, booleans, any value)
 *   OBJ  an object: declared properties in order, or free keys
 *   ARR  an array: prefix items, then items; a count range
 *   STR  a string with a length range (code points)
 *   NUM  a JSON number;  INT  an integer with an optional range
 *   LIT  one literal JSON text (const, enum members, true, false, null)
 * then a fixpoint finds, per node, how many container levels its shallowest
 * finite instance nests ("need"; NEED_NONE: no finite instance). The
 * matcher never enters an alternative, optional property, key or item
 * whose need does not fit under IE_GRAMMAR_MAX_DEPTH at that point, so
 * every prefix it accepts can be completed: there are no dead ends.
 *
 * The matcher state is a set of stacks of frames (gstate_t, packed so that
 * copying one costs its used frames only). A frame is a value in progress;
 * F_VAL is a value not started yet, which the first byte resolves (an ALT
 * forks the stack, one copy per alternative that fits). A number has no
 * closing byte: a byte that cannot extend a complete number pops it and
 * goes to the container. Identical stacks are merged after each byte.
 *
 * The mask walks a preorder byte trie of the vocabulary: node i at depth d
 * feeds its byte to the state of depth d-1; a rejected byte skips the whole
 * subtree (nskip). So a step costs one feed per trie node whose prefix is
 * still in the language, not one per token byte.
 */
#include "ie_grammar.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ nodes */

enum { G_ALT, G_OBJ, G_ARR, G_STR, G_NUM, G_INT, G_LIT };

typedef struct gprop {
    char *name; /* the key as it appears between the quotes (JSON-escaped) */
    size_t len;
    int node;
    int req;
} gprop_t;

typedef struct gnode {
    int kind;
    int need;  /* container levels of the shallowest instance; NEED_NONE */
    int *kids; /* ALT */
    int n_kids;
    gprop_t *props; /* OBJ: declared properties, in schema order      */
    int n_props;
    int addl;    /* OBJ without properties: value node of any key, -1 none */
    int *prefix; /* ARR */
    int n_prefix;
    int items;      /* ARR: node of the items after the prefix, -1 none   */
    int64_t lo, hi; /* ARR item count, STR length, INT value bounds   */
    char *text;     /* LIT */
    size_t len;
} gnode_t;

struct ie_grammar {
    gnode_t *nodes;
    int n, cap;
    int root;
    int keystr; /* any string: the free keys of objects */
};

#define I64_LO (-INT64_MAX)
#define I64_HI INT64_MAX

static int node_new(ie_grammar_t *g, int kind)
{
    if (g->n == g->cap) {
        int c = g->cap ? g->cap * 2 : 32;
        gnode_t *p = realloc(g->nodes, (size_t)c * sizeof *p);
        if (!p) return -1;
        g->nodes = p;
        g->cap = c;
    }
    gnode_t *n = &g->nodes[g->n];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->addl = n->items = -1;
    n->lo = kind == G_INT ? I64_LO : 0;
    n->hi = I64_HI;
    return g->n++;
}

void ie_grammar_destroy(ie_grammar_t **self_p)
{
    if (!self_p || !*self_p) return;
    ie_grammar_t *g = *self_p;
    for (int i = 0; i < g->n; i++) {
        gnode_t *n = &g->nodes[i];
        free(n->kids);
        for (int k = 0; k < n->n_props; k++) free(n->props[k].name);
        free(n->props);
        free(n->prefix);
        free(n->text);
    }
    free(g->nodes);
    free(g);
    *self_p = NULL;
}

/* ------------------------------------------------------------ compile */

typedef struct memo {
    const cJSON *js;
    int node;
} memo_t;

typedef struct cctx {
    ie_grammar_t *g;
    const cJSON *doc;
    memo_t *memo;
    int n_memo, cap_memo;
    int any; /* the any-value node, -1 until needed */
    int depth;
} cctx_t;

static int compile(cctx_t *c, const cJSON *js);

static int alt_add(ie_grammar_t *g, int alt, int kid)
{
    gnode_t *a = &g->nodes[alt];
    int *p = realloc(a->kids, (size_t)(a->n_kids + 1) * sizeof *p);
    if (!p) return -1;
    p[a->n_kids++] = kid;
    a->kids = p;
    return 0;
}

static _Thread_local int g_oom; /* set by oom(): the compile failed for memory */

static int oom(void)
{
    g_oom = 1;
    ie_error_set(IE_ERR_NOMEM, "out of memory");
    return -1;
}

static int lit_new(ie_grammar_t *g, const char *text)
{
    int i = node_new(g, G_LIT);
    if (i < 0) return oom();
    if (!(g->nodes[i].text = strdup(text))) return oom();
    g->nodes[i].len = strlen(text);
    return i;
}

/* Any JSON value: ALT of a free object of any values, an array of any
 * values, a string, a number, true, false, null. */
static int any_node(cctx_t *c)
{
    if (c->any >= 0) return c->any;
    ie_grammar_t *g = c->g;
    int a = node_new(g, G_ALT);
    if (a < 0) return oom();
    c->any = a;
    int o = node_new(g, G_OBJ), r = node_new(g, G_ARR), s = node_new(g, G_STR), n = node_new(g, G_NUM);
    if (o < 0 || r < 0 || s < 0 || n < 0) return oom();
    g->nodes[o].addl = a;
    g->nodes[r].items = a;
    int t = lit_new(g, "true"), f = lit_new(g, "false"), z = lit_new(g, "null");
    if (t < 0 || f < 0 || z < 0) return -1;
    const int kids[] = {o, r, s, n, t, f, z};
    for (size_t k = 0; k < sizeof kids / sizeof *kids; k++)
        if (alt_add(g, a, kids[k]) != 0) return oom();
    return a;
}

static int is_annotation(const char *k)
{
    static const char *const ann[] = {"title",       "description", "default",  "examples",
                                      "$schema",     "$id",         "$comment", "$defs",
                                      "definitions", "deprecated",  "readOnly", "writeOnly"};
    for (size_t i = 0; i < sizeof ann / sizeof *ann; i++)
        if (!strcmp(k, ann[i])) return 1;
    return 0;
}

static int is_known(const char *k)
{
    static const char *const kw[] = {"type",
                                     "properties",
                                     "required",
                                     "additionalProperties",
                                     "items",
                                     "prefixItems",
                                     "minItems",
                                     "maxItems",
                                     "minLength",
                                     "maxLength",
                                     "minimum",
                                     "maximum",
                                     "exclusiveMinimum",
                                     "exclusiveMaximum",
                                     "enum",
                                     "const",
                                     "anyOf",
                                     "oneOf",
                                     "$ref"};
    for (size_t i = 0; i < sizeof kw / sizeof *kw; i++)
        if (!strcmp(k, kw[i])) return 1;
    return is_annotation(k);
}

/* Type bits. */
enum { T_OBJ = 1, T_ARR = 2, T_STR = 4, T_NUM = 8, T_INT = 16, T_BOOL = 32, T_NULL = 64 };

static int type_bit(const char *s)
{
    static const char *const names[] = {"object", "array", "string", "number", "integer", "boolean", "null"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(s, names[i])) return 1 << i;
    return 0;
}

/* The type bits a JSON value is an instance of. */
static int value_types(const cJSON *v)
{
    if (cJSON_IsObject(v)) return T_OBJ;
    if (cJSON_IsArray(v)) return T_ARR;
    if (cJSON_IsString(v)) return T_STR;
    if (cJSON_IsBool(v)) return T_BOOL;
    if (cJSON_IsNull(v)) return T_NULL;
    if (cJSON_IsNumber(v)) return T_NUM | (v->valuedouble == floor(v->valuedouble) ? T_INT : 0);
    return 0;
}

/* A non-negative integer keyword; -1 absent. */
static int get_count(const cJSON *js, const char *k, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(js, k);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble) ||
        v->valuedouble > 1e15) {
        ie_error_set(IE_ERR_INVAL, "JSON Schema: '%s' must be a non-negative integer", k);
        return -1;
    }
    *out = (int64_t)v->valuedouble;
    return 0;
}

/* Walk a "#/a/b" JSON pointer from the document root. */
static const cJSON *resolve_ref(const cJSON *doc, const char *ref)
{
    if (ref[0] != '#') return NULL;
    const char *p = ref + 1;
    const cJSON *cur = doc;
    char tok[256];
    while (*p) {
        if (*p != '/') return NULL;
        p++;
        size_t n = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '~') {
                if (*p == '0') ch = '~';
                else if (*p == '1') ch = '/';
                else return NULL;
                p++;
            }
            if (n + 1 >= sizeof tok) return NULL;
            tok[n++] = ch;
        }
        tok[n] = '\0';
        if (cJSON_IsObject(cur)) {
            cur = cJSON_GetObjectItemCaseSensitive(cur, tok);
        } else if (cJSON_IsArray(cur)) {
            char *end;
            long i = strtol(tok, &end, 10);
            if (!n || *end || i < 0) return NULL;
            cur = cJSON_GetArrayItem(cur, (int)i);
        } else {
            return NULL;
        }
        if (!cur) return NULL;
    }
    return cur;
}

/* Integer bound keyword -> lo/hi of node i. */
static int int_bound(const cJSON *js, const char *k, int is_lo, int excl, gnode_t *n)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(js, k);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || fabs(v->valuedouble) > 1e18) {
        ie_error_set(IE_ERR_INVAL, "JSON Schema: '%s' must be a number within +-1e18", k);
        return -1;
    }
    double x = v->valuedouble;
    int64_t b = is_lo ? (int64_t)ceil(x) : (int64_t)floor(x);
    if (excl && (double)b == x) b += is_lo ? 1 : -1;
    if (is_lo && b > n->lo) n->lo = b;
    if (!is_lo && b < n->hi) n->hi = b;
    return 0;
}

/* Fill node i as type bit t from schema js. */
static int compile_type(cctx_t *c, const cJSON *js, int t, int i)
{
    ie_grammar_t *g = c->g;
    if (t == T_OBJ) {
        g->nodes[i].kind = G_OBJ;
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(js, "properties");
        const cJSON *req = cJSON_GetObjectItemCaseSensitive(js, "required");
        const cJSON *ad = cJSON_GetObjectItemCaseSensitive(js, "additionalProperties");
        if (props && !cJSON_IsObject(props))
            return ie_error_set(IE_ERR_INVAL, "JSON Schema: 'properties' must be an object"), -1;
        if (req && !cJSON_IsArray(req))
            return ie_error_set(IE_ERR_INVAL, "JSON Schema: 'required' must be an array of strings"), -1;
        int np = props ? cJSON_GetArraySize(props) : 0;
        if (np > IE_GRAMMAR_MAX_PROPS)
            return ie_error_set(IE_ERR_INVAL, "JSON Schema: 'properties' has %d entries; at most %d are supported",
                                np, IE_GRAMMAR_MAX_PROPS),
                   -1;
        if (np) {
            gprop_t *ps = calloc((size_t)np, sizeof *ps);
            if (!ps) return oom();
            g->nodes[i].props = ps;
            const cJSON *p;
            int k = 0;
            cJSON_ArrayForEach(p, props)
            {
                cJSON *s = cJSON_CreateString(p->string);
                char *q = s ? cJSON_PrintUnformatted(s) : NULL;
                cJSON_Delete(s);
                if (!q) return oom();
                size_t ql = strlen(q);
                memmove(q, q + 1, ql - 2); /* drop the quotes */
                q[ql - 2] = '\0';
                g->nodes[i].props[k].name = q;
                g->nodes[i].props[k].len = ql - 2;
                g->nodes[i].n_props = ++k;
                int kid = compile(c, p);
                if (kid < 0) return -1;
                g->nodes[i].props[k - 1].node = kid;
            }
        }
        const cJSON *r;
        cJSON_ArrayForEach(r, req)
        {
            if (!cJSON_IsString(r))
                return ie_error_set(IE_ERR_INVAL, "JSON Schema: 'required' must be an array of strings"), -1;
            int k = 0;
            const cJSON *p = props ? props->child : NULL;
            for (; p && strcmp(p->string, r->valuestring); p = p->next) k++;
            if (!p)
                return ie_error_set(IE_ERR_INVAL,
                                    "JSON Schema: 'required' names '%.100s', which is not in 'properties'",
                                    r->valuestring),
                       -1;
            g->nodes[i].props[k].req = 1;
        }
        if (!np) {
            int a = -1;
            if (!ad || cJSON_IsTrue(ad)) a = any_node(c);
            else if (cJSON_IsObject(ad)) a = compile(c, ad);
            else if (!cJSON_IsFalse(ad))
                return ie_error_set(IE_ERR_INVAL,
                                    "JSON Schema: 'additionalProperties' must be a boolean or a schema"),
                       -1;
            else a = -2;
            if (a == -1) return -1;
            g->nodes[i].addl = a < 0 ? -1 : a;
        } else if (ad && !cJSON_IsBool(ad) && !cJSON_IsObject(ad)) {
            return ie_error_set(IE_ERR_INVAL, "JSON Schema: 'additionalProperties' must be a boolean or a schema"),
                   -1;
        }
    } else if (t == T_ARR) {
        g->nodes[i].kind = G_ARR;
        const cJSON *pre = cJSON_GetObjectItemCaseSensitive(js, "prefixItems");
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(js, "items");
        int64_t lo = 0, hi = I64_HI;
        if (get_count(js, "minItems", &lo) || get_count(js, "maxItems", &hi)) return -1;
        g->nodes[i].lo = lo;
        g->nodes[i].hi = hi;
        if (pre) {
            if (!cJSON_IsArray(pre))
                return ie_error_set(IE_ERR_INVAL, "JSON Schema: 'prefixItems' must be an array of schemas"), -1;
            int np = cJSON_GetArraySize(pre);
            if (np && !(g->nodes[i].prefix = calloc((size_t)np, sizeof(int)))) return oom();
            const cJSON *p;
            cJSON_ArrayForEach(p, pre)
            {
                int kid = compile(c, p);
                if (kid < 0) return -1;
                g->nodes[i].prefix[g->nodes[i].n_prefix++] = kid;
            }
        }
        int kid = -2;
        if (!it || cJSON_IsTrue(it)) kid = any_node(c);
        else if (cJSON_IsObject(it)) kid = compile(c, it);
        else if (!cJSON_IsFalse(it))
            return ie_error_set(IE_ERR_INVAL, "JSON Schema: 'items' must be a schema or a boolean"), -1;
        if (kid == -1) return -1;
        g->nodes[i].items = kid < 0 ? -1 : kid;
    } else if (t == T_STR) {
        g->nodes[i].kind = G_STR;
        int64_t lo = 0, hi = I64_HI;
        if (get_count(js, "minLength", &lo) || get_count(js, "maxLength", &hi)) return -1;
        g->nodes[i].lo = lo;
        g->nodes[i].hi = hi;
    } else if (t == T_NUM) {
        g->nodes[i].kind = G_NUM;
        static const char *const bounds[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
        for (int k = 0; k < 4; k++)
            if (cJSON_GetObjectItemCaseSensitive(js, bounds[k]))
                return ie_error_set(IE_ERR_INVAL,
                                    "JSON Schema: '%s' is supported for type \"integer\" only, not \"number\"",
                                    bounds[k]),
                       -1;
    } else if (t == T_INT) {
        g->nodes[i].kind = G_INT;
        g->nodes[i].lo = I64_LO;
        if (int_bound(js, "minimum", 1, 0, &g->nodes[i]) || int_bound(js, "maximum", 0, 0, &g->nodes[i]) ||
            int_bound(js, "exclusiveMinimum", 1, 1, &g->nodes[i]) ||
            int_bound(js, "exclusiveMaximum", 0, 1, &g->nodes[i]))
            return -1;
    } else { /* boolean, null: literals */
        g->nodes[i].kind = G_ALT;
        const char *const lits[] = {t == T_BOOL ? "true" : "null", t == T_BOOL ? "false" : NULL};
        for (int k = 0; k < 2 && lits[k]; k++) {
            int l = lit_new(g, lits[k]);
            if (l < 0 || alt_add(g, i, l) != 0) return -1;
        }
    }
    return 0;
}

static int compile_obj(cctx_t *c, const cJSON *js, int i);

/* Compile schema js into a node; returns its index or -1 (error set). */
static int compile(cctx_t *c, const cJSON *js)
{
    ie_grammar_t *g = c->g;
    if (cJSON_IsTrue(js)) return any_node(c);
    if (cJSON_IsFalse(js)) { /* no instance: an empty ALT */
        int i = node_new(g, G_ALT);
        return i < 0 ? oom() : i;
    }
    if (!cJSON_IsObject(js))
        return ie_error_set(IE_ERR_INVAL, "JSON Schema: a schema must be an object or a boolean"), -1;
    for (int k = 0; k < c->n_memo; k++)
        if (c->memo[k].js == js) return c->memo[k].node;
    if (++c->depth > 200) return ie_error_set(IE_ERR_INVAL, "JSON Schema: nested too deeply"), -1;
    int i = node_new(g, G_ALT);
    if (i < 0) return oom();
    if (c->n_memo == c->cap_memo) {
        int cap = c->cap_memo ? 2 * c->cap_memo : 16;
        memo_t *p = realloc(c->memo, (size_t)cap * sizeof *p);
        if (!p) return oom();
        c->memo = p;
        c->cap_memo = cap;
    }
    c->memo[c->n_memo++] = (memo_t){js, i};
    int r = compile_obj(c, js, i);
    c->depth--;
    return r < 0 ? -1 : i;
}

static int compile_obj(cctx_t *c, const cJSON *js, int i)
{
    ie_grammar_t *g = c->g;
    const cJSON *k;
    cJSON_ArrayForEach(k, js)
    {
        if (!is_known(k->string))
            return ie_error_set(IE_ERR_INVAL, "JSON Schema: keyword '%.100s' is not supported", k->string), -1;
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(js, "$ref");
    const cJSON *any_of = cJSON_GetObjectItemCaseSensitive(js, "anyOf");
    if (!any_of) any_of = cJSON_GetObjectItemCaseSensitive(js, "oneOf");
    if (ref || any_of) {
        const char *kw = ref ? "$ref" : any_of->string;
        cJSON_ArrayForEach(k, js)
        {
            if (strcmp(k->string, kw) && !is_annotation(k->string))
                return ie_error_set(IE_ERR_INVAL, "JSON Schema: '%s' next to '%.100s' is not supported", kw,
                                    k->string),
                       -1;
        }
        if (ref) {
            const cJSON *target = cJSON_IsString(ref) ? resolve_ref(c->doc, ref->valuestring) : NULL;
            if (!target)
                return ie_error_set(IE_ERR_INVAL, "JSON Schema: '$ref' %.200s does not resolve in this document",
                                    cJSON_IsString(ref) ? ref->valuestring : "(not a string)"),
                       -1;
            int t = compile(c, target);
            return t < 0 || alt_add(g, i, t) != 0 ? -1 : 0;
        }
        if (!cJSON_IsArray(any_of) || !any_of->child)
            return ie_error_set(IE_ERR_INVAL, "JSON Schema: '%s' must be a non-empty array of schemas", kw), -1;
        const cJSON *a;
        cJSON_ArrayForEach(a, any_of)
        {
            int t = compile(c, a);
            if (t < 0 || alt_add(g, i, t) != 0) return -1;
        }
        return 0;
    }

    /* the types asked for */
    int types = 0;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(js, "type");
    if (cJSON_IsString(ty)) {
        types = type_bit(ty->valuestring);
    } else if (cJSON_IsArray(ty)) {
        const cJSON *t;
        cJSON_ArrayForEach(t, ty)
        {
            int b = cJSON_IsString(t) ? type_bit(t->valuestring) : 0;
            if (!b) {
                types = 0;
                break;
            }
            types |= b;
        }
    } else if (!ty) {
        static const char *const okw[] = {"properties", "required", "additionalProperties"};
        static const char *const akw[] = {"items", "prefixItems", "minItems", "maxItems"};
        for (int q = 0; q < 3; q++) types |= cJSON_GetObjectItemCaseSensitive(js, okw[q]) ? T_OBJ : 0;
        for (int q = 0; q < 4; q++) types |= cJSON_GetObjectItemCaseSensitive(js, akw[q]) ? T_ARR : 0;
        if (cJSON_GetObjectItemCaseSensitive(js, "minLength") || cJSON_GetObjectItemCaseSensitive(js, "maxLength"))
            types |= T_STR;
        if (!types) types = T_OBJ | T_ARR | T_STR | T_NUM | T_BOOL | T_NULL; /* any value */
    }
    if (!types)
        return ie_error_set(IE_ERR_INVAL, "JSON Schema: 'type' must be a type name or a list of type names"), -1;
    if ((types & T_NUM) && (types & T_INT)) types &= ~T_INT; /* number covers integer */

    const cJSON *cst = cJSON_GetObjectItemCaseSensitive(js, "const");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(js, "enum");
    if (cst || en) { /* the literals, of the types asked for */
        if (en && (!cJSON_IsArray(en) || !en->child))
            return ie_error_set(IE_ERR_INVAL, "JSON Schema: 'enum' must be a non-empty array"), -1;
        const cJSON *v = cst ? cst : en->child;
        for (; v; v = cst ? NULL : v->next) {
            int vt = value_types(v);
            if (!(vt & (types | ((types & T_NUM) ? T_INT : 0)))) continue;
            char *text = cJSON_PrintUnformatted(v);
            if (!text) return oom();
            int l = lit_new(g, text);
            free(text);
            if (l < 0 || alt_add(g, i, l) != 0) return -1;
        }
        return 0; /* no member of the right type: an empty ALT (unsatisfiable) */
    }
    int n_types = 0;
    for (int b = 1; b <= T_NULL; b <<= 1) n_types += (types & b) != 0;
    for (int b = 1; b <= T_NULL; b <<= 1) {
        if (!(types & b)) continue;
        int t = i;
        if (n_types > 1) {
            if ((t = node_new(g, G_ALT)) < 0 || alt_add(g, i, t) != 0) return oom();
        }
        if (compile_type(c, js, b, t) != 0) return -1;
    }
    return 0;
}

static int item_at(const gnode_t *n, int64_t k) { return k < n->n_prefix ? n->prefix[k] : n->items; }

#define NEED_NONE (1 << 20) /* no finite instance */

static int need_max(int a, int b) { return a > b ? a : b; }

/* need[] by fixpoint: a scalar or an empty container needs 0 levels below
 * its own frame; a container needs 1 + the most its required members
 * need; an ALT the least of its kids. Values only go down, from NEED_NONE. */
static void mark_need(ie_grammar_t *g)
{
    for (int i = 0; i < g->n; i++) g->nodes[i].need = NEED_NONE;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < g->n; i++) {
            gnode_t *n = &g->nodes[i];
            int v = NEED_NONE;
            switch (n->kind) {
            case G_LIT:
            case G_NUM: v = 0; break;
            case G_STR:
            case G_INT: v = n->lo <= n->hi ? 0 : NEED_NONE; break;
            case G_ALT:
                for (int k = 0; k < n->n_kids; k++)
                    if (g->nodes[n->kids[k]].need < v) v = g->nodes[n->kids[k]].need;
                break;
            case G_OBJ:
                v = 0;
                for (int k = 0; k < n->n_props; k++)
                    if (n->props[k].req) v = need_max(v, 1 + g->nodes[n->props[k].node].need);
                break;
            case G_ARR:
                v = n->lo <= n->hi ? 0 : NEED_NONE;
                for (int64_t k = 0; v < NEED_NONE && k < n->lo; k++) {
                    int it = item_at(n, k);
                    v = it < 0 ? NEED_NONE : need_max(v, 1 + g->nodes[it].need);
                    if (k >= n->n_prefix) break; /* the rest are the same node */
                }
                break;
            }
            if (v > NEED_NONE) v = NEED_NONE;
            if (v < n->need) n->need = v, changed = 1;
        }
    }
}

ie_status_t ie_grammar_compile(const char *schema, ie_grammar_t **out)
{
    ie_status_t st = IE_OK;
    cJSON *doc = NULL;
    cctx_t c = {0};
    c.any = -1;
    g_oom = 0;
    if (out) *out = NULL;
    if (!schema || !out) return ie_error_set(IE_ERR_INVAL, "grammar: bad arguments");
    if (!(c.g = calloc(1, sizeof *c.g))) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    ie_grammar_t *g = c.g;
    if (!schema[0]) { /* json_object: any object */
        int o = node_new(g, G_OBJ);
        if (o < 0 || any_node(&c) < 0) {
            st = ie_error_set(IE_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        g->nodes[o].addl = c.any;
        g->root = o;
    } else {
        if (!(doc = cJSON_Parse(schema))) {
            st = ie_error_set(IE_ERR_INVAL, "JSON Schema: not valid JSON");
            goto cleanup;
        }
        c.doc = doc;
        if ((g->root = compile(&c, doc)) < 0) {
            st = g_oom ? IE_ERR_NOMEM : IE_ERR_INVAL;
            goto cleanup;
        }
    }
    if ((g->keystr = node_new(g, G_STR)) < 0) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    mark_need(g);
    if (g->nodes[g->root].need >= NEED_NONE) {
        st = ie_error_set(IE_ERR_INVAL, "JSON Schema: no finite JSON value satisfies this schema");
        goto cleanup;
    }
    if (1 + g->nodes[g->root].need > IE_GRAMMAR_MAX_DEPTH) {
        st = ie_error_set(IE_ERR_INVAL, "JSON Schema: every instance nests deeper than %d levels",
                          IE_GRAMMAR_MAX_DEPTH - 1);
        goto cleanup;
    }
    *out = g;
    g = NULL;
cleanup:
    ie_grammar_destroy(&g);
    cJSON_Delete(doc);
    free(c.memo);
    return st;
}

ie_status_t ie_grammar_compile_choice(const char *const *choices, size_t n, ie_grammar_t **out)
{
    ie_status_t st = IE_OK;
    g_oom = 0;
    if (out) *out = NULL;
    if (!choices || !out) return ie_error_set(IE_ERR_INVAL, "grammar: bad arguments");
    if (n < 1 || n > IE_GRAMMAR_MAX_ALTS)
        return ie_error_set(IE_ERR_INVAL, "choice: 1 to %d strings (got %zu)", IE_GRAMMAR_MAX_ALTS, n);
    for (size_t i = 0; i < n; i++)
        if (!choices[i] || !choices[i][0]) return ie_error_set(IE_ERR_INVAL, "choice %zu is empty", i);
    ie_grammar_t *g = calloc(1, sizeof *g);
    if (!g) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    /* the raw texts as literals under one ALT: the matcher keeps every
     * choice that the bytes so far begin */
    if ((g->root = node_new(g, G_ALT)) < 0) goto nomem;
    for (size_t i = 0; i < n; i++) {
        int l = lit_new(g, choices[i]);
        if (l < 0 || alt_add(g, g->root, l) != 0) goto nomem;
    }
    if ((g->keystr = node_new(g, G_STR)) < 0) goto nomem;
    mark_need(g);
    *out = g;
    return IE_OK;
nomem:
    st = ie_error_set(IE_ERR_NOMEM, "out of memory");
    ie_grammar_destroy(&g);
    return st;
}

/* ------------------------------------------------------------ matcher */

enum { F_VAL, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT };
enum { O_OPEN, O_KEY, O_COLON, O_AFTER, O_COMMA };
enum { A_OPEN, A_AFTER };
enum { S_CHAR, S_ESC, S_HEX, S_U8 };
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

/* One value in progress. Field use by kind:
 *   OBJ: st, ws, nx = next property index, cnt = key byte, cur = the
 *        property whose value comes, val = candidate keys (bit mask)
 *   ARR: st, ws, cnt = items so far
 *   STR: st, cnt = code points, nx = UTF-8 bytes still due, lo/hi = range
 *        of the next one, aux = \u digits read, val = their value
 *   NUM: st, cnt = bytes, aux = 1 negative / exponent digits, val = magnitude
 *   LIT: cnt = bytes matched
 *   VAL: ws */
typedef struct frame {
    int32_t node;
    uint8_t kind, st, ws, nx;
    uint8_t lo, hi, aux, neg;
    int32_t cur;
    uint32_t cnt;
    int64_t val;
} frame_t;

/* frames of all stacks of one state: room for every stack at full depth,
 * so a stack is only ever dropped for the IE_GRAMMAR_MAX_ALTS limit */
#define MAXF (IE_GRAMMAR_MAX_ALTS * IE_GRAMMAR_MAX_DEPTH)

typedef struct gstate {
    int n;                            /* stacks */
    int nf;                           /* frames used in f */
    int off[IE_GRAMMAR_MAX_ALTS + 1]; /* stack k is f[off[k] .. off[k+1]) */
    frame_t f[MAXF];
} gstate_t;

struct ie_gmatch {
    const ie_grammar_t *g;
    gstate_t s[3]; /* the current state and two to feed into */
    int cur;
};

static void state_copy(gstate_t *dst, const gstate_t *src)
{
    dst->n = src->n;
    dst->nf = src->nf;
    memcpy(dst->off, src->off, (size_t)(src->n + 1) * sizeof *dst->off);
    memcpy(dst->f, src->f, (size_t)src->nf * sizeof *dst->f);
}

static void state_init(const ie_grammar_t *g, gstate_t *s)
{
    memset(s, 0, offsetof(gstate_t, f));
    memset(&s->f[0], 0, sizeof s->f[0]);
    s->f[0].node = g->root;
    s->f[0].kind = F_VAL;
    s->n = 1;
    s->nf = 1;
    s->off[1] = 1;
}

/* Add stack fr[0..d) to out unless an equal one is there. */
static void emit(gstate_t *out, const frame_t *fr, int d)
{
    for (int k = 0; k < out->n; k++)
        if (out->off[k + 1] - out->off[k] == d && !memcmp(&out->f[out->off[k]], fr, (size_t)d * sizeof *fr)) return;
    if (out->n == IE_GRAMMAR_MAX_ALTS || out->nf + d > MAXF) return; /* dropped: see ie_grammar.h */
    memcpy(&out->f[out->nf], fr, (size_t)d * sizeof *fr);
    out->nf += d;
    out->off[++out->n] = out->nf;
}

static int is_ws(int b) { return b == ' ' || b == '\n' || b == '\t'; }

static void frame_set(frame_t *f, int kind, int node)
{
    memset(f, 0, sizeof *f);
    f->kind = (uint8_t)kind;
    f->node = node;
}

/* Does a value of node fit in a frame at stack depth d (1-based)? */
static int fits(const ie_grammar_t *g, int node, int d)
{
    return node >= 0 && d + g->nodes[node].need <= IE_GRAMMAR_MAX_DEPTH;
}

/* Candidate keys of an object frame at depth d from property index nx on:
 * up to and including the first required one, each whose value fits. */
static uint64_t key_candidates(const ie_grammar_t *g, const gnode_t *n, int nx, int d)
{
    uint64_t m = 0;
    for (int k = nx; k < n->n_props; k++) {
        if (fits(g, n->props[k].node, d + 1)) m |= 1ull << k;
        if (n->props[k].req) break;
    }
    return m;
}

static int obj_can_close(const gnode_t *n, int nx)
{
    for (int k = nx; k < n->n_props; k++)
        if (n->props[k].req) return 0;
    return 1;
}

/* Can an integer whose digits so far are v (negative if neg; `closed`: no
 * more digits may follow) still land in [lo, hi]? */
static int int_viable(const gnode_t *n, int neg, int64_t v, int closed)
{
    if (n->lo == I64_LO && n->hi == I64_HI) return 1;
    __int128 span = 1, base = v;
    for (int j = 0; j <= 19; j++) {
        __int128 a = base, b = base + span - 1; /* magnitudes reachable with j more digits */
        __int128 lo = neg ? -b : a, hi = neg ? -a : b;
        if (hi >= n->lo && lo <= n->hi) return 1;
        if (closed || v == 0) break; /* "0" takes no more digits */
        base *= 10;
        span *= 10;
    }
    return 0;
}

static int num_terminal(const ie_grammar_t *g, const frame_t *f)
{
    if (f->st != N_ZERO && f->st != N_INT && f->st != N_FRAC && f->st != N_EXP) return 0;
    const gnode_t *n = &g->nodes[f->node];
    if (n->kind == G_INT) {
        if (f->neg > 1) return 0; /* overflowed */
        __int128 x = f->aux ? -(__int128)f->val : (__int128)f->val;
        return x >= n->lo && x <= n->hi;
    }
    return 1;
}

/* Feed byte b to the stack fr[0..d) (fr is scratch, MAXD frames), adding
 * every resulting stack to out. */
static void step(const ie_grammar_t *g, frame_t *fr, int d, int b, gstate_t *out, int alts)
{
    for (;;) {
        if (d == 0) return; /* complete: nothing may follow */
        frame_t *f = &fr[d - 1];
        const gnode_t *n = &g->nodes[f->node];
        switch (f->kind) {
        case F_VAL:
            if (is_ws(b)) {
                if (d == 1 || f->ws >= IE_GRAMMAR_MAX_WS) return;
                f->ws++;
                emit(out, fr, d);
                return;
            }
            switch (n->kind) {
            case G_ALT: {
                /* ALTs nest without consuming a byte ($ref chains,
                 * anyOf inside anyOf, even anyOf naming itself): bounded */
                frame_t tmp[IE_GRAMMAR_MAX_DEPTH];
                if (alts >= 32) return;
                for (int k = 0; k < n->n_kids; k++) {
                    if (!fits(g, n->kids[k], d)) continue;
                    memcpy(tmp, fr, (size_t)d * sizeof *fr);
                    tmp[d - 1].node = n->kids[k];
                    step(g, tmp, d, b, out, alts + 1);
                }
                return;
            }
            case G_OBJ:
                if (b != '{') return;
                frame_set(f, F_OBJ, f->node);
                emit(out, fr, d);
                return;
            case G_ARR:
                if (b != '[') return;
                frame_set(f, F_ARR, f->node);
                emit(out, fr, d);
                return;
            case G_STR:
                if (b != '"') return;
                frame_set(f, F_STR, f->node);
                emit(out, fr, d);
                return;
            case G_NUM:
            case G_INT: {
                int node = f->node;
                if (b == '-') {
                    frame_set(f, F_NUM, node);
                    f->st = N_MINUS;
                    f->aux = 1;
                    f->cnt = 1;
                } else if (b >= '0' && b <= '9') {
                    frame_set(f, F_NUM, node);
                    f->st = b == '0' ? N_ZERO : N_INT;
                    f->val = b - '0';
                    f->cnt = 1;
                    if (n->kind == G_INT && !int_viable(n, 0, f->val, f->st == N_ZERO)) return;
                } else {
                    return;
                }
                if (n->kind == G_INT && f->aux) { /* some digit must follow the minus */
                    int any = 0;
                    for (int dg = 0; dg <= 9 && !any; dg++) any = int_viable(n, 1, dg, dg == 0);
                    if (!any) return;
                }
                emit(out, fr, d);
                return;
            }
            case G_LIT:
                if (n->len == 0 || (unsigned char)n->text[0] != b) return;
                frame_set(f, F_LIT, f->node);
                f->cnt = 1;
                if (n->len == 1) d--;
                emit(out, fr, d);
                return;
            }
            return;
        case F_OBJ: {
            if (f->st != O_KEY && is_ws(b)) {
                if (f->ws >= IE_GRAMMAR_MAX_WS) return;
                f->ws++;
                emit(out, fr, d);
                return;
            }
            f->ws = 0;
            switch (f->st) {
            case O_OPEN:
            case O_COMMA:
                if (b == '}' && f->st == O_OPEN) {
                    if (!obj_can_close(n, f->nx)) return;
                    emit(out, fr, d - 1);
                    return;
                }
                if (b != '"') return;
                if (n->n_props == 0) { /* free key */
                    if (!fits(g, n->addl, d + 1)) return;
                    f->st = O_COLON;
                    frame_set(&fr[d], F_STR, g->keystr);
                    emit(out, fr, d + 1);
                    return;
                }
                f->val = (int64_t)key_candidates(g, n, f->nx, d);
                if (!f->val) return;
                f->st = O_KEY;
                f->cnt = 0;
                emit(out, fr, d);
                return;
            case O_KEY: {
                uint64_t m = (uint64_t)f->val, keep = 0;
                int done = -1;
                for (int k = 0; k < n->n_props; k++) {
                    if (!(m >> k & 1)) continue;
                    const gprop_t *p = &n->props[k];
                    if (f->cnt < p->len && (unsigned char)p->name[f->cnt] == b) keep |= 1ull << k;
                    if (f->cnt == p->len && b == '"') done = k;
                }
                if (keep) {
                    f->val = (int64_t)keep;
                    f->cnt++;
                } else if (done >= 0) {
                    f->cur = done;
                    f->st = O_COLON;
                } else {
                    return;
                }
                emit(out, fr, d);
                return;
            }
            case O_COLON: {
                if (b != ':' || d >= IE_GRAMMAR_MAX_DEPTH) return;
                int vn = n->n_props ? n->props[f->cur].node : n->addl;
                if (n->n_props) f->nx = (uint8_t)(f->cur + 1);
                f->st = O_AFTER;
                frame_set(&fr[d], F_VAL, vn);
                emit(out, fr, d + 1);
                return;
            }
            case O_AFTER:
                if (b == '}') {
                    if (!obj_can_close(n, f->nx)) return;
                    emit(out, fr, d - 1);
                    return;
                }
                if (b != ',') return;
                if (n->n_props ? !key_candidates(g, n, f->nx, d) : !fits(g, n->addl, d + 1)) return;
                f->st = O_COMMA;
                emit(out, fr, d);
                return;
            }
            return;
        }
        case F_ARR: {
            if (is_ws(b)) {
                if (f->ws >= IE_GRAMMAR_MAX_WS) return;
                f->ws++;
                emit(out, fr, d);
                return;
            }
            f->ws = 0;
            if (b == ']') {
                if ((int64_t)f->cnt < n->lo) return;
                emit(out, fr, d - 1);
                return;
            }
            int it = item_at(n, f->cnt);
            if (f->st == A_AFTER) {
                if (b != ',') return;
            }
            if ((int64_t)f->cnt >= n->hi || !fits(g, it, d + 1)) return;
            f->cnt++;
            frame_set(&fr[d], F_VAL, it);
            if (f->st == A_AFTER) { /* the comma: the item starts at the next byte */
                emit(out, fr, d + 1);
                return;
            }
            f->st = A_AFTER;
            d++; /* the first item starts with this byte */
            continue;
        }
        case F_STR:
            switch (f->st) {
            case S_CHAR:
                if (b == '"') {
                    if ((int64_t)f->cnt < n->lo) return;
                    emit(out, fr, d - 1);
                    return;
                }
                if ((int64_t)f->cnt >= n->hi || b < 0x20) return;
                if (b == '\\') {
                    f->st = S_ESC;
                } else if (b < 0x80) {
                    f->cnt++;
                } else {
                    if (b >= 0xC2 && b <= 0xDF) f->nx = 1, f->lo = 0x80, f->hi = 0xBF;
                    else if (b == 0xE0) f->nx = 2, f->lo = 0xA0, f->hi = 0xBF;
                    else if (b == 0xED) f->nx = 2, f->lo = 0x80, f->hi = 0x9F;
                    else if (b >= 0xE1 && b <= 0xEF) f->nx = 2, f->lo = 0x80, f->hi = 0xBF;
                    else if (b == 0xF0) f->nx = 3, f->lo = 0x90, f->hi = 0xBF;
                    else if (b >= 0xF1 && b <= 0xF3) f->nx = 3, f->lo = 0x80, f->hi = 0xBF;
                    else if (b == 0xF4) f->nx = 3, f->lo = 0x80, f->hi = 0x8F;
                    else return;
                    f->cnt++;
                    f->st = S_U8;
                }
                emit(out, fr, d);
                return;
            case S_U8:
                if (b < f->lo || b > f->hi) return;
                f->lo = 0x80;
                f->hi = 0xBF;
                if (--f->nx == 0) f->st = S_CHAR;
                emit(out, fr, d);
                return;
            case S_ESC:
                if (b == 'u') {
                    f->st = S_HEX;
                    f->aux = 0;
                    f->val = 0;
                } else if (strchr("\"\\/bfnrt", b) && b) {
                    f->cnt++;
                    f->st = S_CHAR;
                } else {
                    return;
                }
                emit(out, fr, d);
                return;
            case S_HEX: {
                int h = b >= '0' && b <= '9'   ? b - '0'
                        : b >= 'a' && b <= 'f' ? b - 'a' + 10
                        : b >= 'A' && b <= 'F' ? b - 'A' + 10
                                               : -1;
                if (h < 0) return;
                f->val = f->val * 16 + h;
                f->aux++;
                if (f->aux == 2 && f->val >= 0xD8 && f->val <= 0xDF) return; /* a surrogate */
                if (f->aux == 4) {
                    f->cnt++;
                    f->st = S_CHAR;
                }
                emit(out, fr, d);
                return;
            }
            }
            return;
        case F_NUM: {
            const int isint = n->kind == G_INT, dig = b >= '0' && b <= '9';
            int ok = 0;
            if (f->cnt < IE_GRAMMAR_MAX_NUM) {
                switch (f->st) {
                case N_MINUS:
                    if (dig) {
                        f->st = b == '0' ? N_ZERO : N_INT;
                        f->val = b - '0';
                        ok = !isint || int_viable(n, 1, f->val, f->st == N_ZERO);
                    }
                    break;
                case N_ZERO:
                case N_INT:
                    if (dig && f->st == N_INT) {
                        if (f->val > (INT64_MAX - 9) / 10) f->neg = 2; /* overflow: no longer an int64 */
                        else f->val = f->val * 10 + (b - '0');
                        ok = !isint || (f->neg < 2 && int_viable(n, f->aux, f->val, 0));
                    } else if (!isint && b == '.') {
                        f->st = N_DOT, ok = 1;
                    } else if (!isint && (b == 'e' || b == 'E')) {
                        f->st = N_E, ok = 1;
                    }
                    break;
                case N_DOT:
                    if (dig) f->st = N_FRAC, ok = 1;
                    break;
                case N_FRAC:
                    if (dig) ok = 1;
                    else if (b == 'e' || b == 'E') f->st = N_E, ok = 1;
                    break;
                case N_E:
                    if (b == '+' || b == '-') f->st = N_ESIGN, ok = 1;
                    /* fall through */
                case N_ESIGN:
                    if (dig) f->st = N_EXP, f->lo = 1, ok = 1;
                    break;
                case N_EXP:
                    if (dig && f->lo < 2) f->lo++, ok = 1;
                    break;
                }
            }
            if (ok) {
                f->cnt++;
                emit(out, fr, d);
                return;
            }
            /* not part of the number: it ends here, the byte goes on */
            if (d == 1 || !num_terminal(g, f)) return;
            d--;
            continue;
        }
        case F_LIT:
            if (f->cnt >= n->len || (unsigned char)n->text[f->cnt] != b) return;
            f->cnt++;
            emit(out, fr, f->cnt == n->len ? d - 1 : d);
            return;
        }
        return;
    }
}

/* out = in after byte b; 1 if any stack survived. */
static int state_feed(const ie_grammar_t *g, const gstate_t *in, int b, gstate_t *out)
{
    frame_t tmp[IE_GRAMMAR_MAX_DEPTH];
    out->n = 0;
    out->nf = 0;
    out->off[0] = 0;
    for (int k = 0; k < in->n; k++) {
        int d = in->off[k + 1] - in->off[k];
        memcpy(tmp, &in->f[in->off[k]], (size_t)d * sizeof *tmp);
        step(g, tmp, d, b, out, 0);
    }
    return out->n > 0;
}

static int state_done(const ie_grammar_t *g, const gstate_t *s)
{
    for (int k = 0; k < s->n; k++) {
        int d = s->off[k + 1] - s->off[k];
        if (d == 0) return 1;
        const frame_t *f = &s->f[s->off[k]];
        if (d == 1 && f->kind == F_NUM && num_terminal(g, f)) return 1;
    }
    return 0;
}

ie_status_t ie_gmatch_new(const ie_grammar_t *g, ie_gmatch_t **out)
{
    if (!out || !g) return ie_error_set(IE_ERR_INVAL, "grammar: bad arguments");
    ie_gmatch_t *m = malloc(sizeof *m);
    if (!(*out = m)) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    m->g = g;
    m->cur = 0;
    state_init(g, &m->s[0]);
    return IE_OK;
}

void ie_gmatch_destroy(ie_gmatch_t **self_p)
{
    if (!self_p || !*self_p) return;
    free(*self_p);
    *self_p = NULL;
}

int ie_gmatch_feed(ie_gmatch_t *m, const char *bytes, size_t n)
{
    if (!m) return 0;
    /* ping-pong between the two spare states, so the current one survives
     * a rejection */
    int src = m->cur, a = (m->cur + 1) % 3, b = (m->cur + 2) % 3;
    for (size_t i = 0; i < n; i++) {
        if (!state_feed(m->g, &m->s[src], (unsigned char)bytes[i], &m->s[a])) return 0;
        src = a;
        a = b;
        b = src;
    }
    m->cur = src;
    return 1;
}

int ie_gmatch_done(const ie_gmatch_t *m) { return m && state_done(m->g, &m->s[m->cur]); }

/* ------------------------------------------------------------ vocabulary */

#define IE_GVOCAB_MAX_TOKEN 256 /* longer tokens are never allowed */

struct ie_gvocab {
    int32_t n_vocab;
    int32_t n_nodes;
    uint8_t *nbyte;   /* (n_nodes) the edge byte into trie node i     */
    uint16_t *ndepth; /* (n_nodes) 1 + its depth                      */
    int32_t *nskip;   /* (n_nodes) the node after i's subtree         */
    int32_t *ntok;    /* (n_nodes + 1) tokens ending at i: toks[ntok[i] .. ntok[i+1]) */
    int32_t *toks;
    uint8_t *kind; /* (n_vocab) */
    char **bytes;  /* (n_vocab) for accept */
    size_t *lens;
    int maxlen;
    gstate_t *scratch; /* (maxlen + 1) */
    uint8_t *allow;    /* (n_vocab) for apply */
};

void ie_gvocab_destroy(ie_gvocab_t **self_p)
{
    if (!self_p || !*self_p) return;
    ie_gvocab_t *v = *self_p;
    if (v->bytes)
        for (int32_t i = 0; i < v->n_vocab; i++) free(v->bytes[i]);
    free(v->bytes);
    free(v->lens);
    free(v->kind);
    free(v->nbyte);
    free(v->ndepth);
    free(v->nskip);
    free(v->ntok);
    free(v->toks);
    free(v->scratch);
    free(v->allow);
    free(v);
    *self_p = NULL;
}

static const ie_gvocab_t *g_sort_vocab; /* qsort has no context argument */

static int cmp_tok(const void *pa, const void *pb)
{
    const ie_gvocab_t *v = g_sort_vocab;
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    size_t la = v->lens[a], lb = v->lens[b], l = la < lb ? la : lb;
    int c = memcmp(v->bytes[a], v->bytes[b], l);
    if (c) return c;
    if (la != lb) return la < lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

static pthread_mutex_t g_sort_mu = PTHREAD_MUTEX_INITIALIZER;

ie_status_t ie_gvocab_new(int32_t n_vocab, const char *const *bytes, const size_t *lens, const uint8_t *kind,
                          ie_gvocab_t **out)
{
    ie_status_t st = IE_OK;
    ie_gvocab_t *v = NULL;
    int32_t *order = NULL;
    if (!out || n_vocab <= 0 || !bytes || !lens || !kind)
        return ie_error_set(IE_ERR_INVAL, "gvocab: bad arguments");
    *out = NULL;
    if (!(v = calloc(1, sizeof *v))) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    v->n_vocab = n_vocab;
    v->bytes = calloc((size_t)n_vocab, sizeof *v->bytes);
    v->lens = calloc((size_t)n_vocab, sizeof *v->lens);
    v->kind = malloc((size_t)n_vocab);
    v->allow = malloc((size_t)n_vocab);
    order = malloc((size_t)n_vocab * sizeof *order);
    if (!v->bytes || !v->lens || !v->kind || !v->allow || !order) goto nomem;
    int32_t n_ord = 0;
    size_t total = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        v->kind[i] = kind[i];
        if (kind[i] == 0 && (lens[i] == 0 || lens[i] > IE_GVOCAB_MAX_TOKEN)) v->kind[i] = 1;
        if (v->kind[i] != 0) continue;
        if (!(v->bytes[i] = malloc(lens[i]))) goto nomem;
        memcpy(v->bytes[i], bytes[i], lens[i]);
        v->lens[i] = lens[i];
        if ((int)lens[i] > v->maxlen) v->maxlen = (int)lens[i];
        total += lens[i];
        order[n_ord++] = i;
    }
    pthread_mutex_lock(&g_sort_mu);
    g_sort_vocab = v;
    qsort(order, (size_t)n_ord, sizeof *order, cmp_tok);
    pthread_mutex_unlock(&g_sort_mu);
    /* preorder trie: each token adds the nodes past its common prefix with
     * the previous one (at most total nodes) */
    v->nbyte = malloc(total + 1);
    v->ndepth = malloc((total + 1) * sizeof *v->ndepth);
    v->nskip = malloc((total + 1) * sizeof *v->nskip);
    v->ntok = calloc(total + 2, sizeof *v->ntok);
    v->toks = malloc(((size_t)n_ord + 1) * sizeof *v->toks);
    v->scratch = malloc((size_t)(v->maxlen + 1) * sizeof *v->scratch);
    if (!v->nbyte || !v->ndepth || !v->nskip || !v->ntok || !v->toks || !v->scratch) goto nomem;
    int32_t path[IE_GVOCAB_MAX_TOKEN + 1], nn = 0;
    int pd = 0; /* depth of the current path */
    const char *prev = NULL;
    size_t prev_len = 0;
    for (int32_t k = 0; k < n_ord; k++) {
        int32_t id = order[k];
        const char *b = v->bytes[id];
        size_t l = v->lens[id], c = 0;
        while (prev && c < l && c < prev_len && b[c] == prev[c]) c++;
        while (pd > (int)c) v->nskip[path[--pd]] = nn; /* close the nodes past the common prefix */
        for (size_t j = c; j < l; j++) {
            v->nbyte[nn] = (uint8_t)b[j];
            v->ndepth[nn] = (uint16_t)(j + 1);
            path[pd++] = nn++;
        }
        /* the token ends at path[l-1]; in sorted order the end nodes never
         * decrease (a prefix sorts before its extensions, and its node
         * comes first in preorder), so order[] grouped by end node is
         * order[] itself: remember the end node in nskip's spare slot */
        v->toks[k] = path[l - 1];
        prev = b;
        prev_len = l;
    }
    while (pd > 0) v->nskip[path[--pd]] = nn;
    v->n_nodes = nn;
    /* toks[k] held token k's end node: turn it into ntok ranges + ids */
    for (int32_t i = 0, k = 0; i <= nn; i++) {
        v->ntok[i] = k;
        while (k < n_ord && v->toks[k] == i) k++;
    }
    for (int32_t k = 0; k < n_ord; k++) v->toks[k] = order[k];
    *out = v;
    v = NULL;
    goto cleanup;
nomem:
    st = ie_error_set(IE_ERR_NOMEM, "out of memory");
cleanup:
    free(order);
    ie_gvocab_destroy(&v);
    return st;
}

int32_t ie_gvocab_n(const ie_gvocab_t *v) { return v ? v->n_vocab : 0; }

int32_t ie_gvocab_mask(ie_gvocab_t *v, const ie_gmatch_t *m, uint8_t *allow)
{
    const ie_grammar_t *g = m->g;
    int32_t count = 0;
    memset(allow, 0, (size_t)v->n_vocab);
    state_copy(&v->scratch[0], &m->s[m->cur]);
    for (int32_t i = 0; i < v->n_nodes;) {
        int d = v->ndepth[i];
        if (!state_feed(g, &v->scratch[d - 1], v->nbyte[i], &v->scratch[d])) {
            i = v->nskip[i]; /* no token below i can be right */
            continue;
        }
        for (int32_t k = v->ntok[i]; k < v->ntok[i + 1]; k++) {
            allow[v->toks[k]] = 1;
            count++;
        }
        i++;
    }
    if (state_done(g, &m->s[m->cur]))
        for (int32_t i = 0; i < v->n_vocab; i++)
            if (v->kind[i] == 2) allow[i] = 1, count++;
    return count;
}

ie_status_t ie_gvocab_apply(ie_gvocab_t *v, const ie_gmatch_t *m, float *logits)
{
    if (ie_gvocab_mask(v, m, v->allow) == 0)
        return ie_error_set(IE_ERR_INTERNAL, "structured output: no token can continue the JSON");
    for (int32_t i = 0; i < v->n_vocab; i++)
        if (!v->allow[i]) logits[i] = -INFINITY;
    return IE_OK;
}

ie_status_t ie_gvocab_accept(const ie_gvocab_t *v, ie_gmatch_t *m, int32_t id)
{
    if (id < 0 || id >= v->n_vocab)
        return ie_error_set(IE_ERR_INVAL, "structured output: token %d out of range", id);
    if (v->kind[id] == 2) {
        if (!ie_gmatch_done(m))
            return ie_error_set(IE_ERR_INVAL, "structured output: end token before the JSON is complete");
        return IE_OK;
    }
    if (v->kind[id] != 0 || !ie_gmatch_feed(m, v->bytes[id], v->lens[id]))
        return ie_error_set(IE_ERR_INVAL, "structured output: token %d leaves the schema's language", id);
    return IE_OK;
}

ie_status_t ie_gvocab_from_tokenizer(const ie_tokenizer_t *tok, const int32_t *end_ids, size_t n_end,
                                     ie_gvocab_t **out)
{
    ie_status_t st = IE_OK;
    int32_t n = ie_tokenizer_n_vocab(tok);
    char **bytes = calloc((size_t)(n > 0 ? n : 1), sizeof *bytes);
    size_t *lens = calloc((size_t)(n > 0 ? n : 1), sizeof *lens);
    uint8_t *kind = calloc((size_t)(n > 0 ? n : 1), 1);
    char buf[IE_GVOCAB_MAX_TOKEN + 1];
    if (out) *out = NULL;
    if (!bytes || !lens || !kind) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    for (int32_t i = 0; i < n; i++) {
        int eog = ie_tokenizer_is_eog(tok, i);
        for (size_t k = 0; k < n_end && !eog; k++) eog = end_ids[k] == i;
        if (eog) {
            kind[i] = 2;
            continue;
        }
        int l = ie_tokenizer_is_special(tok, i) ? 0 : ie_tokenizer_token_bytes(tok, i, 0, buf, sizeof buf);
        if (l <= 0 || l > IE_GVOCAB_MAX_TOKEN) {
            kind[i] = 1;
            continue;
        }
        if (!(bytes[i] = malloc((size_t)l))) {
            st = ie_error_set(IE_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        memcpy(bytes[i], buf, (size_t)l);
        lens[i] = (size_t)l;
    }
    st = ie_gvocab_new(n, (const char *const *)bytes, lens, kind, out);
cleanup:
    if (bytes)
        for (int32_t i = 0; i < n; i++) free(bytes[i]);
    free(bytes);
    free(lens);
    free(kind);
    return st;
}
