/* SPDX-License-Identifier: Apache-2.0 */
/* hs_status.h - the text of a status code.
 *
 * hs_status_t and its values live in the public header, hsflow.h. */
#ifndef HS_STATUS_H
#define HS_STATUS_H

#include "hsflow.h"

#ifdef __cplusplus
extern "C" {
#endif

const char *hs_status_str(hs_status_t status);

#ifdef __cplusplus
}
#endif

#endif /* HS_STATUS_H */
