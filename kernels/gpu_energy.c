/* SPDX-License-Identifier: Apache-2.0 */
/* gpu_energy.c - NVML's energy counter and power-violation time, by dlopen.
 * The few entry points are declared here with NVML's stable C ABI (every one
 * returns an int status, 0 for success; a device is an opaque pointer), so
 * the build needs no NVML headers and the binary no libnvidia-ml at link
 * time. */
#include "gpu_energy.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

#include "hs_log.h"
#include "hs_time.h"

typedef void *nvml_device_t;
typedef struct {
    unsigned long long reference_time; /* µs timestamp of the reading */
    unsigned long long violation_ns;   /* cumulative time under the policy */
} nvml_violation_t;
enum { NVML_SUCCESS = 0, NVML_PERF_POLICY_POWER = 0 };

struct hs_gpu_energy {
    void *lib;
    nvml_device_t dev;
    int (*shutdown)(void);
    int (*energy)(nvml_device_t, unsigned long long *mj);
    int (*violation)(nvml_device_t, int policy, nvml_violation_t *);
    unsigned limit_mw;
};

hs_gpu_energy_t *hs_gpu_energy_open(const char *pci_bus_id)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        hs_debug("gpu energy: no libnvidia-ml.so.1 (%s): power is not reported", dlerror());
        return NULL;
    }
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*by_bus)(const char *, nvml_device_t *) =
        (int (*)(const char *, nvml_device_t *))dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    int (*limit)(nvml_device_t, unsigned *) =
        (int (*)(nvml_device_t, unsigned *))dlsym(lib, "nvmlDeviceGetEnforcedPowerLimit");
    hs_gpu_energy_t *e = calloc(1, sizeof(*e));
    if (!e) {
        dlclose(lib);
        return NULL;
    }
    e->lib = lib;
    e->shutdown = (int (*)(void))dlsym(lib, "nvmlShutdown");
    e->energy = (int (*)(nvml_device_t, unsigned long long *))dlsym(
        lib, "nvmlDeviceGetTotalEnergyConsumption");
    e->violation =
        (int (*)(nvml_device_t, int, nvml_violation_t *))dlsym(lib, "nvmlDeviceGetViolationStatus");
    unsigned long long mj = 0;
    if (!init || !by_bus || !e->shutdown || !e->energy || init() != NVML_SUCCESS) {
        hs_debug("gpu energy: NVML did not start: power is not reported");
        dlclose(lib);
        free(e);
        return NULL;
    }
    if (by_bus(pci_bus_id, &e->dev) != NVML_SUCCESS || e->energy(e->dev, &mj) != NVML_SUCCESS) {
        hs_debug("gpu energy: NVML has no energy counter for %s: power is not reported",
                 pci_bus_id);
        hs_gpu_energy_close(e);
        return NULL;
    }
    if (!limit || limit(e->dev, &e->limit_mw) != NVML_SUCCESS) e->limit_mw = 0;
    return e;
}

bool hs_gpu_energy_mark(hs_gpu_energy_t *e, hs_gpu_energy_mark_t *out)
{
    *out = (hs_gpu_energy_mark_t){0};
    unsigned long long first = 0, mj = 0;
    if (!e || e->energy(e->dev, &first) != NVML_SUCCESS) return false;
    const double t0 = hs_now_s();
    double at = t0;
    mj = first;
    /* poll (every 0.2 ms) for the counter's next update */
    while (mj == first && at - t0 < 0.25) {
        const struct timespec pause = {0, 200000};
        nanosleep(&pause, NULL);
        if (e->energy(e->dev, &mj) != NVML_SUCCESS) return false;
        at = hs_now_s();
    }
    out->energy_mj = mj;
    out->at_s = at;
    nvml_violation_t v = {0};
    if (e->violation && e->violation(e->dev, NVML_PERF_POLICY_POWER, &v) == NVML_SUCCESS)
        out->power_capped_ns = v.violation_ns;
    return true;
}

hs_gpu_energy_span_t hs_gpu_energy_span(const hs_gpu_energy_t *e, hs_gpu_energy_mark_t a,
                                        hs_gpu_energy_mark_t b)
{
    hs_gpu_energy_span_t s = {0};
    const double seconds = b.at_s - a.at_s;
    if (!e || !(seconds > 0) || b.energy_mj < a.energy_mj) return s;
    s.joules = (double)(b.energy_mj - a.energy_mj) / 1e3;
    s.watts = s.joules / seconds;
    s.limit_watts = e->limit_mw / 1e3;
    if (b.power_capped_ns >= a.power_capped_ns) {
        double share = (double)(b.power_capped_ns - a.power_capped_ns) / 1e9 / seconds;
        s.capped_share = share > 1 ? 1 : share;
    }
    return s;
}

void hs_gpu_energy_close(hs_gpu_energy_t *e)
{
    if (!e) return;
    e->shutdown();
    dlclose(e->lib);
    free(e);
}
