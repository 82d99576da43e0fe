/* SPDX-License-Identifier: Apache-2.0 */
/* ticket_table.c - live tickets to scheduler records; see ticket_table_int.h. */
#include "ticket_table_int.h"
#include "hs_log.h"

#include <stdbool.h>
#include <stdlib.h>

static uint32_t table_home(const hs__ticket_table_t *t, uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return (uint32_t)key & (t->cap - 1);
}

hs_status_t hs__ticket_table_init(hs__ticket_table_t *t, uint32_t cap)
{
    t->key = calloc(cap, sizeof *t->key);
    t->val = calloc(cap, sizeof *t->val);
    t->cap = cap;
    t->n = 0;
    return t->key && t->val ? HS_OK : HS_ERR_NOMEM;
}

void hs__ticket_table_fini(hs__ticket_table_t *t)
{
    free(t->key);
    free(t->val);
    t->key = NULL;
    t->val = NULL;
    t->cap = t->n = 0;
}

uint32_t hs__ticket_table_find(const hs__ticket_table_t *t, uint64_t key)
{
    if (key == 0) return HS__TICKET_NONE;
    for (uint32_t i = table_home(t, key);; i = (i + 1) & (t->cap - 1)) {
        if (t->key[i] == key) return t->val[i];
        if (t->key[i] == 0) return HS__TICKET_NONE;
    }
}

void hs__ticket_table_put(hs__ticket_table_t *t, uint64_t key, uint32_t val)
{
    uint32_t i = table_home(t, key);
    while (t->key[i] != 0)
        i = (i + 1) & (t->cap - 1);
    t->key[i] = key;
    t->val[i] = val;
    t->n++;
}

hs_status_t hs__ticket_table_reserve(hs__ticket_table_t *t, uint32_t more)
{
    uint64_t need = (uint64_t)t->n + more;
    if (need * 2 <= t->cap) return HS_OK; /* load kept <= 1/2 */
    uint64_t ncap = t->cap;
    while (ncap < need * 2)
        ncap *= 2;
    if (ncap > (1ull << 31)) {
        hs_error("sched: the ticket table cannot hold %llu tickets", (unsigned long long)need);
        return HS_ERR_NOMEM;
    }
    hs__ticket_table_t grown;
    if (hs__ticket_table_init(&grown, (uint32_t)ncap) != HS_OK) {
        hs__ticket_table_fini(&grown);
        hs_error("sched: out of memory growing the ticket table to %llu entries",
                 (unsigned long long)ncap);
        return HS_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < t->cap; i++)
        if (t->key[i]) hs__ticket_table_put(&grown, t->key[i], t->val[i]);
    hs__ticket_table_fini(t);
    *t = grown;
    return HS_OK;
}

void hs__ticket_table_del(hs__ticket_table_t *t, uint64_t key)
{
    uint32_t mask = t->cap - 1, i = table_home(t, key);
    while (t->key[i] != key)
        i = (i + 1) & mask;
    for (uint32_t j = i;;) {
        j = (j + 1) & mask;
        if (t->key[j] == 0) break;
        uint32_t k = table_home(t, t->key[j]);
        /* the entry at j may move to the hole at i unless its home lies in (i, j] */
        bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            t->key[i] = t->key[j];
            t->val[i] = t->val[j];
            i = j;
        }
    }
    t->key[i] = 0;
    t->n--;
}
