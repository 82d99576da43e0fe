/* SPDX-License-Identifier: Apache-2.0 */
/* hs_window.h - recent windows of counters, for rates over the last
 * seconds beside a run's averages.
 *
 * A window is a plain value the caller owns (zero-initialised is empty);
 * nothing here allocates or locks. */
#ifndef HS_WINDOW_H
#define HS_WINDOW_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The status lines show rates and shares over the last HS_WINDOW_SPAN_S
 * seconds beside the run's averages: a window keeps samples of up to
 * HS_WINDOW_VALUES counters (time-ordered, at least HS_WINDOW_EVERY_S
 * apart), and the figures over the window are (now - base) / (t_now -
 * t_base). Zero-initialised is empty. Not thread-safe: the caller locks. */
#define HS_WINDOW_SPAN_S 30.0
#define HS_WINDOW_EVERY_S 1.0
#define HS_WINDOW_VALUES 6
#define HS_WINDOW_SAMPLES 40 /* > HS_WINDOW_SPAN_S / HS_WINDOW_EVERY_S */
typedef struct {
    double t;
    double v[HS_WINDOW_VALUES];
} hs_window_sample_t;
typedef struct {
    hs_window_sample_t s[HS_WINDOW_SAMPLES];
    uint32_t head, n; /* oldest sample, count */
} hs_window_t;
/* Sets *base to the window's baseline for the counters `now`: the newest
 * sample at least HS_WINDOW_SPAN_S older than now, else the oldest; false
 * (base untouched) when no sample is older than now. Then records now as a
 * sample when the newest is HS_WINDOW_EVERY_S old or there is none. */
bool hs_window_take(hs_window_t *w, const hs_window_sample_t *now, hs_window_sample_t *base);

#ifdef __cplusplus
}
#endif

#endif /* HS_WINDOW_H */
