/* SPDX-License-Identifier: Apache-2.0 */
/* hs_consumer_loopback_int.h - the local producers of hs-consumer
 * --loopback N (hs_consumer_loopback.c). Main's thread only. */
#ifndef HS_CONSUMER_LOOPBACK_INT_H
#define HS_CONSUMER_LOOPBACK_INT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The hs-producer to run into out[cap]: HS_PRODUCER_BIN, else the one next
 * to this binary, else the one on PATH. */
void hs__cli_producer_path(char *out, size_t cap);
/* Starts `bin` --to 127.0.0.1:port --name loopback-<index> args[nargs]...;
 * its pid, or -1 when it could not be forked (a failed exec exits 127). */
pid_t hs__cli_spawn_producer(const char *bin, uint16_t port, int index, int nargs, char **args);

#endif /* HS_CONSUMER_LOOPBACK_INT_H */
