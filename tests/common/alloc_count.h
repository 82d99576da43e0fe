/* SPDX-License-Identifier: Apache-2.0 */
/* alloc_count.h - a counting allocator for tests that prove a path
 * allocates nothing: included by exactly one file of a test program, it
 * puts malloc, calloc, realloc and posix_memalign of the whole process
 * (libraries included) through glibc's own allocator and counts the calls
 * made while counting is on, in every thread.
 *
 *   alloc_count_start(lo, hi);     only requests of lo..hi bytes count
 *   ... the path under test ...
 *   n = alloc_count_stop();        calls counted since start
 *
 * Sanitizer builds bring their own allocator and are not interposed:
 * ALLOC_COUNT_WORKS is 0 there and a test skips its count. */
#ifndef HS_TEST_ALLOC_COUNT_H
#define HS_TEST_ALLOC_COUNT_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr */
#endif
#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ALLOC_COUNT_WORKS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) ||                         \
    __has_feature(memory_sanitizer)
#define ALLOC_COUNT_WORKS 0
#endif
#endif
#ifndef ALLOC_COUNT_WORKS
#define ALLOC_COUNT_WORKS 1
#endif

static _Atomic int alloc_count_on;
static _Atomic size_t alloc_count_lo, alloc_count_hi;
static _Atomic uint64_t alloc_count_calls;
/* The first distinct callers of counted calls, with a size and a count
 * each, to name them in a failure (addr2line -f -e FILE OFFSET). */
#define ALLOC_COUNT_CALLERS 16
static void *_Atomic alloc_count_caller[ALLOC_COUNT_CALLERS];
static size_t alloc_count_size[ALLOC_COUNT_CALLERS];
static _Atomic uint64_t alloc_count_times[ALLOC_COUNT_CALLERS];

static inline void alloc_count_start(size_t lo, size_t hi)
{
    atomic_store(&alloc_count_lo, lo);
    atomic_store(&alloc_count_hi, hi);
    atomic_store(&alloc_count_calls, 0);
    for (int i = 0; i < ALLOC_COUNT_CALLERS; i++) {
        atomic_store(&alloc_count_caller[i], NULL);
        atomic_store(&alloc_count_times[i], 0);
    }
    atomic_store(&alloc_count_on, 1);
}

static inline uint64_t alloc_count_stop(void)
{
    atomic_store(&alloc_count_on, 0);
    return atomic_load(&alloc_count_calls);
}

#if ALLOC_COUNT_WORKS
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static inline void alloc_count_note(size_t n, void *caller)
{
    if (atomic_load_explicit(&alloc_count_on, memory_order_relaxed) &&
        n >= atomic_load_explicit(&alloc_count_lo, memory_order_relaxed) &&
        n <= atomic_load_explicit(&alloc_count_hi, memory_order_relaxed)) {
        atomic_fetch_add(&alloc_count_calls, 1);
        for (int i = 0; i < ALLOC_COUNT_CALLERS; i++) {
            void *expect = NULL;
            if (atomic_load(&alloc_count_caller[i]) == caller ||
                atomic_compare_exchange_strong(&alloc_count_caller[i], &expect, caller)) {
                alloc_count_size[i] = n;
                atomic_fetch_add(&alloc_count_times[i], 1);
                break;
            }
        }
    }
}

/* Prints the callers noted since start (at most ALLOC_COUNT_CALLERS). */
static inline void alloc_count_print(FILE *f)
{
    for (int i = 0; i < ALLOC_COUNT_CALLERS; i++) {
        void *a = atomic_load(&alloc_count_caller[i]);
        if (!a) break;
        Dl_info d = {0};
        dladdr(a, &d);
        fprintf(f, "%llu allocation(s), the last of %zu bytes, from %s+%#lx (%s)\n",
                (unsigned long long)atomic_load(&alloc_count_times[i]), alloc_count_size[i],
                d.dli_fname ? d.dli_fname : "?", (unsigned long)((char *)a - (char *)d.dli_fbase),
                d.dli_sname ? d.dli_sname : "?");
    }
}

void *malloc(size_t n)
{
    alloc_count_note(n, __builtin_return_address(0));
    return __libc_malloc(n);
}
void *calloc(size_t k, size_t n)
{
    alloc_count_note(k * n, __builtin_return_address(0));
    return __libc_calloc(k, n);
}
void *realloc(void *p, size_t n)
{
    alloc_count_note(n, __builtin_return_address(0));
    return __libc_realloc(p, n);
}
int posix_memalign(void **out, size_t align, size_t n)
{
    alloc_count_note(n, __builtin_return_address(0));
    void *p = __libc_memalign(align, n);
    if (!p) return 12; /* ENOMEM */
    *out = p;
    return 0;
}
#else
static inline void alloc_count_print(FILE *f) { (void)f; }
#endif

#endif /* HS_TEST_ALLOC_COUNT_H */
