/* ie_array.h — growing a malloc'd array by doubling. */
#ifndef IE_ARRAY_H
#define IE_ARRAY_H

#include <stddef.h>

/* Make *p (capacity *cap elements of elem bytes) hold at least `need`
 * elements, doubling from 64. Returns 0, or -1 on overflow or allocation
 * failure (then *p and *cap are unchanged and still valid). */
int ie_array_grow(void **p, size_t *cap, size_t need, size_t elem);

#endif
