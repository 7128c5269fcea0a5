/* convert_main.c — `ie-convert`: convert a GGUF / Hugging Face / IEBIN model
 * into an IEBIN model with per-tensor quantization from a manifest, with an
 * optional calibration gate. See docs/CONVERT.md and ie_convert.h.
 *
 * Exit codes: 0 ok, 1 runtime failure, 2 bad usage or input (flags,
 * manifest, calibration text), 3 model missing/unreadable/invalid,
 * 4 calibration gate failed (nothing written), 6 out of memory.
 */
#include "ie_convert.h"

int main(int argc, char **argv) { return ie_convert_main(argc, argv); }
