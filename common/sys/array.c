/* array.c — growing a malloc'd array by doubling. */
#include "ie_array.h"

#include <stdint.h>
#include <stdlib.h>

int ie_array_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) {
        if (c > SIZE_MAX / 2) return -1;
        c *= 2;
    }
    if (elem && c > SIZE_MAX / elem) return -1;
    void *n = realloc(*p, c * elem);
    if (!n) return -1;
    *p = n;
    *cap = c;
    return 0;
}
