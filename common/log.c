/* SPDX-License-Identifier: Apache-2.0 */
/* log.c - one logger for every module: "[time tag LEVEL] message" on stderr.
 * The level comes from HS_LOG_LEVEL once, at first use. */
#include "hs_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <pthread.h>
#include <time.h>

static int g_level = -1;
static char g_tag[32] = "hsflow";
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static int level_from_env(void)
{
    const char *s = getenv("HS_LOG_LEVEL");
    static const char *names[] = {"error", "warn", "info", "debug", "trace"};
    if (s)
        for (int i = 0; i < 5; i++)
            if (!strcasecmp(s, names[i])) return i;
    return HS_LOG_INFO;
}

void hs_log_set_level(hs_log_level_t level) { g_level = (int)level; }

hs_log_level_t hs_log_get_level(void)
{
    if (g_level < 0) g_level = level_from_env();
    return (hs_log_level_t)g_level;
}

void hs_log_set_tag(const char *tag) { snprintf(g_tag, sizeof(g_tag), "%s", tag); }

void hs_log_write(hs_log_level_t level, const char *file, int line, const char *fmt, ...)
{
    static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG", "TRACE"};
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;

    pthread_mutex_lock(&g_lock);
    if (level >= HS_LOG_DEBUG)
        fprintf(stderr, "[%02d:%02d:%02d.%03ld %s %s %s:%d] %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
                ts.tv_nsec / 1000000, g_tag, names[level], base, line, msg);
    else
        fprintf(stderr, "[%02d:%02d:%02d.%03ld %s %s] %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
                ts.tv_nsec / 1000000, g_tag, names[level], msg);
    pthread_mutex_unlock(&g_lock);
}
