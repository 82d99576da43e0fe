/* SPDX-License-Identifier: Apache-2.0 */
/* test_gpu_energy.c - the GPU energy meter (kernels/gpu_energy.h): refuses a
 * device NVML does not have (on any machine, NVML or not) and, on a GPU with
 * NVML, counts the joules of a busy stretch at a power within the card's
 * range. */
#include <check.h>
#include <stdio.h>
#include <cuda_runtime_api.h>

#include "cuda_test_main.h"
#include "gpu_energy.h"
#include "hs_time.h"

START_TEST(a_meter_for_no_such_device_is_null_and_reads_nothing)
{
    hs_gpu_energy_t *e = hs_gpu_energy_open("0000:ff:1f.7");
    ck_assert_ptr_null(e);
    hs_gpu_energy_mark_t m = {.energy_mj = 5};
    ck_assert(!hs_gpu_energy_mark(NULL, &m));
    ck_assert_uint_eq(m.energy_mj, 0);
    hs_gpu_energy_span_t s = hs_gpu_energy_span(NULL, m, m);
    ck_assert(s.joules == 0 && s.watts == 0 && s.capped_share == 0);
    hs_gpu_energy_close(NULL);
}
END_TEST

START_TEST(the_meter_counts_the_joules_of_a_busy_gpu)
{
    int n = 0;
    char bus[32];
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0 ||
        cudaDeviceGetPCIBusId(bus, (int)sizeof(bus), 0) != cudaSuccess) {
        printf("no CUDA device: skipped\n");
        return;
    }
    hs_gpu_energy_t *e = hs_gpu_energy_open(bus);
    if (!e) {
        printf("no NVML energy counter for %s: skipped\n", bus);
        return;
    }
    const size_t bytes = (size_t)1 << 30;
    void *buf = NULL;
    ck_assert_int_eq(cudaMalloc(&buf, bytes), cudaSuccess);
    hs_gpu_energy_mark_t a, b;
    ck_assert(hs_gpu_energy_mark(e, &a));
    const double t0 = hs_now_s();
    while (hs_now_s() - t0 < 0.5) { /* half a second of 1 GiB memsets */
        for (int i = 0; i < 16; i++)
            ck_assert_int_eq(cudaMemsetAsync(buf, i, bytes, 0), cudaSuccess);
        ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    }
    ck_assert(hs_gpu_energy_mark(e, &b));
    hs_gpu_energy_span_t s = hs_gpu_energy_span(e, a, b);
    /* how often the counter updates: the gaps between five fresh marks */
    hs_gpu_energy_mark_t m[6];
    m[0] = b;
    for (int i = 1; i < 6; i++)
        ck_assert(hs_gpu_energy_mark(e, &m[i]));
    printf("counter updates every %.1f ms (mean of 5)\n", (m[5].at_s - m[0].at_s) / 5 * 1e3);
    printf("busy GPU: %.1f J, %.0f W of %.0f, power-capped %.0f%%\n", s.joules, s.watts,
           s.limit_watts, s.capped_share * 100);
    ck_assert(s.joules > 0);
    ck_assert(s.watts > 20 && s.watts < 3000);
    ck_assert(s.capped_share >= 0 && s.capped_share <= 1);
    /* a span the wrong way round is no span */
    ck_assert(hs_gpu_energy_span(e, b, a).joules == 0);
    cudaFree(buf);
    hs_gpu_energy_close(e);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gpu_energy");
    TCase *tc = tcase_create("all");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, a_meter_for_no_such_device_is_null_and_reads_nothing);
    tcase_add_test(tc, the_meter_counts_the_joules_of_a_busy_gpu);
    suite_add_tcase(s, tc);
    return cuda_test_run(s);
}
