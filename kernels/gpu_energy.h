/* SPDX-License-Identifier: Apache-2.0 */
/* gpu_energy.h - a GPU's energy counter and power-cap time, read through
 * NVML (loaded at run time: a machine without the driver's libnvidia-ml
 * gets NULL, not a link error).
 *
 * Why: at the power cap a GPU lowers its clocks until it draws no more than
 * the cap, so a forward that holds the cap runs as fast as its energy per
 * token allows, not its kernels' speed at full clocks. The preflight reports
 * the joules a token took, the average power against the cap and the share of
 * the time the driver held the clocks down for power, so a reader can tell
 * which of the two a figure measures.
 *
 * Ownership: the meter owns its NVML session. Threads: one meter per thread. */
#ifndef HS_GPU_ENERGY_H
#define HS_GPU_ENERGY_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hs_gpu_energy hs_gpu_energy_t;

/* One reading: the device's energy counter (mJ since the driver loaded), the
 * time it spent with clocks lowered for power (ns, cumulative) and when the
 * counter took that value (hs_now_s). */
typedef struct {
    uint64_t energy_mj;
    uint64_t power_capped_ns;
    double at_s;
} hs_gpu_energy_mark_t;

/* What happened between two marks. */
typedef struct {
    double joules;
    double watts;        /* joules / seconds */
    double limit_watts;  /* the enforced power limit, 0 when NVML does not say */
    double capped_share; /* power_capped_ns / seconds, 0..1 */
} hs_gpu_energy_span_t;

/* Busy time a span needs before its figures mean much: the driver updates
 * the energy counter every 100 ms (H200), so a shorter run reads mostly the
 * idle wait for the update after it. */
#define HS_GPU_ENERGY_MIN_BUSY_S 0.5

/* Opens the meter for the GPU at pci_bus_id ("0000:19:00.0", as
 * cudaDeviceGetPCIBusId writes it). NULL, with a debug log saying why, when
 * NVML, the device or its energy counter is not there. */
hs_gpu_energy_t *hs_gpu_energy_open(const char *pci_bus_id);
/* Reads the counters as they tick: the driver updates the energy counter
 * every 100 ms (H200), so a plain read can be that stale, which on a
 * one-second span is several percent at 700 W. This waits (up to 0.25 s)
 * for the next update and stamps the reading with its time; a span between
 * two such marks is exact to the counter, plus the idle power of the wait
 * after a run. false when the counters could not be read (the mark is then
 * zero). */
bool hs_gpu_energy_mark(hs_gpu_energy_t *e, hs_gpu_energy_mark_t *out);
/* The span from mark a to a later mark b; zero where b is not later. */
hs_gpu_energy_span_t hs_gpu_energy_span(const hs_gpu_energy_t *e, hs_gpu_energy_mark_t a,
                                        hs_gpu_energy_mark_t b);
void hs_gpu_energy_close(hs_gpu_energy_t *e); /* NULL is fine */

#ifdef __cplusplus
}
#endif

#endif
