/* SPDX-License-Identifier: Apache-2.0 */
/* hs_version.h - the release and build, for --version and the logs.
 *
 * Both return or print static text; nothing allocates. */
#ifndef HS_VERSION_H
#define HS_VERSION_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* "0.1.0 (git f08d450)": the release and, when built from a checkout, its
 * git describe. Static. */
const char *hs_version_line(void);
/* "PROGRAM VERSION-LINE\nbuild: OPTIONS\n" to out, for --version. */
void hs_version_print(FILE *out, const char *program);

#ifdef __cplusplus
}
#endif

#endif /* HS_VERSION_H */
