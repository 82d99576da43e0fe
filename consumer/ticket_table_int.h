/* SPDX-License-Identifier: Apache-2.0 */
/* ticket_table_int.h - the scheduler's map of live tickets to record
 * indices (ticket_table.c): open addressing with linear probing over a
 * power-of-two table kept at most half full, backward-shift deletion.
 * Ticket 0 is never a key (it marks an empty entry). Single-threaded: the
 * scheduler's caller. */
#ifndef HS_TICKET_TABLE_INT_H
#define HS_TICKET_TABLE_INT_H

#include <stdint.h>

#include "hsflow.h"

#define HS__TICKET_NONE UINT32_MAX /* what find answers for a ticket not in the table */

typedef struct {
    uint64_t *key;   /* [cap] tickets, 0 = empty */
    uint32_t *val;   /* [cap] record indices */
    uint32_t cap, n; /* cap a power of two */
} hs__ticket_table_t;

/* An empty table of `cap` entries (a power of two). HS_ERR_NOMEM; the
 * table is then safe to fini. */
HS_MUST_CHECK hs_status_t hs__ticket_table_init(hs__ticket_table_t *t, uint32_t cap);
void hs__ticket_table_fini(hs__ticket_table_t *t);
/* Room for `more` keys besides those in the table, growing it now if need
 * be: puts after it never allocate. HS_ERR_NOMEM (logged). */
HS_MUST_CHECK hs_status_t hs__ticket_table_reserve(hs__ticket_table_t *t, uint32_t more);
/* The value of `key`, or HS__TICKET_NONE. */
uint32_t hs__ticket_table_find(const hs__ticket_table_t *t, uint64_t key);
/* Adds `key` (> 0, not present) into room made by reserve. */
void hs__ticket_table_put(hs__ticket_table_t *t, uint64_t key, uint32_t val);
/* Removes `key`, which is present. */
void hs__ticket_table_del(hs__ticket_table_t *t, uint64_t key);

#endif /* HS_TICKET_TABLE_INT_H */
