/* SPDX-License-Identifier: Apache-2.0 */
/* hs_memory.h - aligned heap memory.
 *
 * Ownership: memory from hs_aligned_alloc() is the caller's, freed with
 * hs_aligned_free() (NULL ok). */
#ifndef HS_MEMORY_H
#define HS_MEMORY_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

void *hs_aligned_alloc(size_t alignment, size_t size); /* NULL on failure */
void hs_aligned_free(void *p);
static inline size_t hs_align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

#ifdef __cplusplus
}
#endif

#endif /* HS_MEMORY_H */
