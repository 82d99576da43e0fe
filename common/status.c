/* SPDX-License-Identifier: Apache-2.0 */
/* status.c - hs_status_t to text. */
#include "hsflow.h"
#include "hs_status.h"

const char *hs_status_str(hs_status_t status)
{
    switch (status) {
    case HS_OK:
        return "ok";
    case HS_ERR_INVALID:
        return "invalid argument";
    case HS_ERR_NOMEM:
        return "out of memory";
    case HS_ERR_IO:
        return "i/o error";
    case HS_ERR_FORMAT:
        return "malformed input";
    case HS_ERR_PROTO:
        return "protocol error";
    case HS_ERR_MISMATCH:
        return "mismatch with peer";
    case HS_ERR_AUTH:
        return "authentication failed";
    case HS_ERR_CHECKSUM:
        return "checksum mismatch";
    case HS_ERR_CLOSED:
        return "closed";
    case HS_ERR_AGAIN:
        return "try again";
    case HS_ERR_TIMEOUT:
        return "timed out";
    case HS_ERR_NOSPACE:
        return "no space";
    case HS_ERR_NOT_FOUND:
        return "not found";
    case HS_ERR_UNSUPPORTED:
        return "unsupported";
    case HS_ERR_CUDA:
        return "cuda error";
    case HS_ERR_BUSY:
        return "busy";
    }
    return "unknown status";
}
