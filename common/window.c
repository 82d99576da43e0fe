/* SPDX-License-Identifier: Apache-2.0 */
/* window.c - recent windows of counters (hs_window.h): a ring of samples
 * from which the status lines take rates over the last 30 s. */
#include "hs_window.h"

#include <stddef.h>

bool hs_window_take(hs_window_t *w, const hs_window_sample_t *now, hs_window_sample_t *base)
{
    bool found = false;
    for (uint32_t i = 0; i < w->n; i++) {
        const hs_window_sample_t *x = &w->s[(w->head + i) % HS_WINDOW_SAMPLES];
        if (x->t >= now->t) break;
        /* the oldest, then each newer one still a whole span old */
        if (found && now->t - x->t < HS_WINDOW_SPAN_S) break;
        *base = *x;
        found = true;
    }
    const hs_window_sample_t *newest =
        w->n ? &w->s[(w->head + w->n - 1) % HS_WINDOW_SAMPLES] : NULL;
    if (!newest || now->t - newest->t >= HS_WINDOW_EVERY_S) {
        if (w->n == HS_WINDOW_SAMPLES) {
            w->head = (w->head + 1) % HS_WINDOW_SAMPLES;
            w->n--;
        }
        w->s[(w->head + w->n) % HS_WINDOW_SAMPLES] = *now;
        w->n++;
    }
    return found;
}
