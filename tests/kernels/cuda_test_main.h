/* SPDX-License-Identifier: Apache-2.0 */
/* cuda_test_main.h - what every CUDA test's main does: skip (exit 77) where
 * the machine has no CUDA device, and run its Check suite in this process. */
#ifndef HS_CUDA_TEST_MAIN_H
#define HS_CUDA_TEST_MAIN_H

#include <check.h>
#include <stdio.h>
#include <string.h>
#include <cuda_runtime_api.h>

/* The device the test runs on, or 0 (after saying so) where this machine has
 * none: main then returns 77, which CTest counts as skipped. */
static inline int cuda_test_device(const char *test, struct cudaDeviceProp *prop)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("%s: no CUDA device: skipped\n", test);
        return 0;
    }
    if (cudaGetDeviceProperties(prop, 0) != cudaSuccess) memset(prop, 0, sizeof *prop);
    printf("device: %s (sm_%d%d)\n", prop->name, prop->major, prop->minor);
    return 1;
}

/* Runs suite s in this process (the CUDA context does not survive fork())
 * and frees it; main's exit status: 0 when every test passed, else 1. */
static inline int cuda_test_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

#endif /* HS_CUDA_TEST_MAIN_H */
