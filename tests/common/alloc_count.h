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

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

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

static inline void alloc_count_start(size_t lo, size_t hi)
{
    atomic_store(&alloc_count_lo, lo);
    atomic_store(&alloc_count_hi, hi);
    atomic_store(&alloc_count_calls, 0);
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

static inline void alloc_count_note(size_t n)
{
    if (atomic_load_explicit(&alloc_count_on, memory_order_relaxed) &&
        n >= atomic_load_explicit(&alloc_count_lo, memory_order_relaxed) &&
        n <= atomic_load_explicit(&alloc_count_hi, memory_order_relaxed))
        atomic_fetch_add(&alloc_count_calls, 1);
}

void *malloc(size_t n)
{
    alloc_count_note(n);
    return __libc_malloc(n);
}
void *calloc(size_t k, size_t n)
{
    alloc_count_note(k * n);
    return __libc_calloc(k, n);
}
void *realloc(void *p, size_t n)
{
    alloc_count_note(n);
    return __libc_realloc(p, n);
}
int posix_memalign(void **out, size_t align, size_t n)
{
    alloc_count_note(n);
    void *p = __libc_memalign(align, n);
    if (!p) return 12; /* ENOMEM */
    *out = p;
    return 0;
}
#endif

#endif /* HS_TEST_ALLOC_COUNT_H */
