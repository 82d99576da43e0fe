/* SPDX-License-Identifier: Apache-2.0 */
/* util.c - clocks, aligned memory and the parsers behind every CLI flag. */
#include "hsflow.h"
#include "hs_time.h"
#include "hs_shuffle.h"
#include "hs_memory.h"
#include "hs_parse.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t hs_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double hs_now_s(void) { return (double)hs_now_ns() * 1e-9; }

void *hs_aligned_alloc(size_t alignment, size_t size)
{
    void *p = NULL;
    if (size == 0) size = alignment;
    if (posix_memalign(&p, alignment, size) != 0) return NULL;
    return p;
}

void hs_aligned_free(void *p) { free(p); }

hs_status_t hs_parse_u64(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-' || isspace((unsigned char)*s)) return HS_ERR_INVALID;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return HS_ERR_INVALID;
    *out = v;
    return HS_OK;
}

hs_status_t hs_parse_i64(const char *s, int64_t *out)
{
    if (!s || !*s || isspace((unsigned char)*s)) return HS_ERR_INVALID;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end) return HS_ERR_INVALID;
    *out = v;
    return HS_OK;
}

hs_status_t hs_parse_double(const char *s, double *out)
{
    if (!s || !*s || isspace((unsigned char)*s)) return HS_ERR_INVALID;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end) return HS_ERR_INVALID;
    *out = v;
    return HS_OK;
}

hs_status_t hs_parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-' || !isdigit((unsigned char)*s)) return HS_ERR_INVALID;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno) return HS_ERR_INVALID;
    int shift = 0;
    switch (toupper((unsigned char)*end)) {
    case 0:
        break;
    case 'K':
        shift = 10;
        end++;
        break;
    case 'M':
        shift = 20;
        end++;
        break;
    case 'G':
        shift = 30;
        end++;
        break;
    case 'T':
        shift = 40;
        end++;
        break;
    default:
        return HS_ERR_INVALID;
    }
    if (shift && (!strcasecmp(end, "iB") || !strcasecmp(end, "B"))) end += strlen(end);
    if (*end) return HS_ERR_INVALID;
    if (shift && v > (ULLONG_MAX >> shift)) return HS_ERR_INVALID;
    *out = (uint64_t)v << shift;
    return HS_OK;
}

hs_status_t hs_parse_int_list(const char *s, int *out, int cap, int *n)
{
    if (!s || !*s) return HS_ERR_INVALID;
    int count = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < INT_MIN || v > INT_MAX) return HS_ERR_INVALID;
        if (count == cap) return HS_ERR_INVALID;
        out[count++] = (int)v;
        if (*end == ',') {
            p = end + 1;
            if (!*p) return HS_ERR_INVALID;
        } else if (*end) {
            return HS_ERR_INVALID;
        } else {
            p = end;
        }
    }
    *n = count;
    return HS_OK;
}

hs_status_t hs_parse_hostport(const char *s, char *host, size_t hostcap, uint16_t *port)
{
    if (!s) return HS_ERR_INVALID;
    const char *colon;
    const char *hbeg = s;
    size_t hlen;
    if (*s == '[') {
        const char *rb = strchr(s, ']');
        if (!rb || rb[1] != ':') return HS_ERR_INVALID;
        hbeg = s + 1;
        hlen = (size_t)(rb - hbeg);
        colon = rb + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon) return HS_ERR_INVALID;
        hlen = (size_t)(colon - s);
    }
    uint64_t p;
    if (hlen == 0 || hlen >= hostcap || hs_parse_u64(colon + 1, &p) != HS_OK || p > 65535)
        return HS_ERR_INVALID;
    memcpy(host, hbeg, hlen);
    host[hlen] = 0;
    *port = (uint16_t)p;
    return HS_OK;
}

void hs_permutation(uint64_t seed, uint32_t epoch, uint32_t n, uint32_t *out)
{
    uint64_t st = seed ^ (0xD1B54A32D192ED03ull * ((uint64_t)epoch + 1));
    for (uint32_t i = 0; i < n; i++)
        out[i] = i;
    for (uint32_t i = n; i > 1; i--) {
        /* unbiased enough for n << 2^64: multiply-shift range reduction */
        uint32_t j = (uint32_t)(((unsigned __int128)hs_splitmix64(&st) * i) >> 64);
        uint32_t t = out[i - 1];
        out[i - 1] = out[j];
        out[j] = t;
    }
}
