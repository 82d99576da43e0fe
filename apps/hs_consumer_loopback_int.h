/* SPDX-License-Identifier: Apache-2.0 */
/* hs_consumer_loopback_int.h - the local producers of hs-consumer
 * --loopback N (hs_consumer_loopback.c). Main's thread only.
 *
 * The arguments after -- are either hs-producer's options (they start with
 * a flag) or a whole producer command (they start with a word:
 * `hsflow-produce --model M ...`, `python3 -m hsflow.produce ...`, a
 * script); either way --loopback adds --to and --name. */
#ifndef HS_CONSUMER_LOOPBACK_INT_H
#define HS_CONSUMER_LOOPBACK_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* True when args (those after --) start with a command, not a flag. */
bool hs__cli_loopback_has_command(int nargs, char **args);
/* The program to run into out[cap]. command NULL: hs-producer, from
 * HS_PRODUCER_BIN, else the one next to this binary, else the one on PATH.
 * Otherwise that command: a bare name next to this binary when it is there
 * (build/bin/hsflow-produce), else as given (looked up on PATH). */
void hs__cli_producer_path(const char *command, char *out, size_t cap);
/* Starts `bin` with args[nargs] (without args[0] when it is the command)
 * and --to 127.0.0.1:port --name loopback-<index>; its pid, or -1 when it
 * could not be forked (a failed exec exits 127). */
pid_t hs__cli_spawn_producer(const char *bin, uint16_t port, int index, int nargs, char **args);

#endif /* HS_CONSUMER_LOOPBACK_INT_H */
