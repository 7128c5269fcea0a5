/* fuzz_manifest.c — libFuzzer target for ie-convert's quantization manifest.
 *
 * Parses arbitrary bytes as a manifest (JSON rules with PCRE2 patterns);
 * when accepted, asks it to decide a handful of canonical tensor names and
 * shapes under every --pretranspose mode, so rule matching, group checks
 * and fallbacks run on whatever the parser let through. Run via
 * scripts/fuzz.sh.
 */
#include "ie_manifest.h"

#include <stdint.h>

static volatile int g_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const names[] = {"token_embd.weight",          "output.weight",
                                        "blk.0.attn_q.weight",        "blk.11.ffn_down.weight",
                                        "blk.3.ffn_gate_exps.weight", "blk.0.attn_norm.weight"};
    static const int64_t shapes[][4] = {{576, 49152, 1, 1}, {2048, 32000, 1, 1}, {64, 64, 1, 1},
                                        {1536, 576, 1, 1},  {2880, 2880, 32, 1}, {576, 1, 1, 1}};
    static const int dims[] = {2, 2, 2, 2, 3, 1};
    ie_manifest_t *m = NULL;
    if (ie_manifest_parse((const char *)data, size, "fuzz", &m) != IE_OK) return 0;
    for (int pt = IE_PT_NONE; pt <= IE_PT_ALL; pt++)
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            ie_qdecision_t d;
            if (ie_manifest_decide(m, (ie_pretranspose_t)pt, (int)(i & 1), names[i], IE_DTYPE_F16, IE_LAYOUT_ROWS,
                                   0, dims[i], shapes[i], &d) == IE_OK)
                g_sink ^= d.rule + (int)d.dtype + d.group;
        }
    ie_manifest_destroy(&m);
    return 0;
}
