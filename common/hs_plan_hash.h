/* SPDX-License-Identifier: Apache-2.0 */
/* hs_plan_hash.h - the hash a run's batch plan is pinned by. */
#ifndef HS_PLAN_HASH_H
#define HS_PLAN_HASH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The plan hash a run is pinned by (--expect-plan) and every producer
 * proves: BLAKE2b of "HSPLAN02", the plan's basis (XXH3-64 of what defines
 * it: the dataset fingerprint, the planning flags and the samples of every
 * batch; hs_plan_basis()), n, then n_seqs[n] and n_tokens[n] as u32
 * little-endian, cut to 64 bits. A consumer, which has no dataset, checks
 * the batch shapes a producer sends (PLAN pages) or a store holds against
 * it: no other shapes give a pinned hash short of breaking BLAKE2b. */
uint64_t hs_plan_hash_of(uint64_t basis, uint32_t n, const uint32_t *n_seqs,
                         const uint32_t *n_tokens);

#ifdef __cplusplus
}
#endif

#endif /* HS_PLAN_HASH_H */
