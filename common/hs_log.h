/* SPDX-License-Identifier: Apache-2.0 */
/* hs_log.h - the one logger: levels, a tag per process, file:line.
 *
 * Lines go to stderr as "[time tag LEVEL] message"; nothing here
 * allocates. */
#ifndef HS_LOG_H
#define HS_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

/* Level from HS_LOG_LEVEL (error, warn, info, debug, trace; default info). */
typedef enum { HS_LOG_ERROR, HS_LOG_WARN, HS_LOG_INFO, HS_LOG_DEBUG, HS_LOG_TRACE } hs_log_level_t;

void hs_log_set_level(hs_log_level_t level);
hs_log_level_t hs_log_get_level(void);
/* Tag printed in front of every line, e.g. "consumer" or "producer[2]". */
void hs_log_set_tag(const char *tag);
void hs_log_write(hs_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define hs_log(level, ...)                                                                         \
    do {                                                                                           \
        if ((level) <= hs_log_get_level()) hs_log_write((level), __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
#define hs_error(...) hs_log(HS_LOG_ERROR, __VA_ARGS__)
#define hs_warn(...) hs_log(HS_LOG_WARN, __VA_ARGS__)
#define hs_info(...) hs_log(HS_LOG_INFO, __VA_ARGS__)
#define hs_debug(...) hs_log(HS_LOG_DEBUG, __VA_ARGS__)
#define hs_trace(...) hs_log(HS_LOG_TRACE, __VA_ARGS__)

#ifdef __cplusplus
}
#endif

#endif /* HS_LOG_H */
