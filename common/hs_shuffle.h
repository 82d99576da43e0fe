/* SPDX-License-Identifier: Apache-2.0 */
/* hs_shuffle.h - the project's PRNG and the batch order of an epoch.
 *
 * Deterministic: the same seed gives the same numbers on every host.
 * hs_permutation() writes the caller's out[n]; nothing allocates. */
#ifndef HS_SHUFFLE_H
#define HS_SHUFFLE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* splitmix64 step: the project's one PRNG for plans and synthetic data. */
static inline uint64_t hs_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* The batch order of `epoch`: a Fisher-Yates permutation of 0..n-1 seeded by
 * (seed, epoch). Producers and consumer call it to agree on the plan. */
void hs_permutation(uint64_t seed, uint32_t epoch, uint32_t n, uint32_t *out);

#ifdef __cplusplus
}
#endif

#endif /* HS_SHUFFLE_H */
