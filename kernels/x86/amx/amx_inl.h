/* amx_inl.h — tile configuration and tile loads as inline asm, for the
 * files built with the AMX flags (pack_amx.c, bench/bench_amx.c). */
#ifndef IE_AMX_INL_H
#define IE_AMX_INL_H

#include <stdint.h>

/* ldtilecfg and tileloadd with the memory they read declared: GCC 12's
 * _tile_loadconfig tells the compiler it reads 8 of the config's 64 bytes
 * and _tile_loadd that it reads no memory at all, so stores into a local
 * buffer that only a tile load reads (the I4W unpack, the packed planes,
 * the config) could legally be dropped or sunk below the load. Here the
 * whole config is an input, and a load's pointer (escaping into the asm)
 * with a "memory" clobber orders every store before it. The extra macro
 * level expands tile names (AMX_B) to digits before #t pastes them. */
typedef struct {
    uint8_t b[64];
} amx_cfg_t;
#define AMX_LDTILECFG(cfg) __asm__ volatile("ldtilecfg %0" ::"m"(*(const amx_cfg_t *)(cfg)) : "memory")
#define AMX_TILELOADD_(t, p, s) \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"((const void *)(p)), "r"((long)(s)) : "memory")
#define AMX_TILELOADD(t, p, s) AMX_TILELOADD_(t, p, s)

#endif
