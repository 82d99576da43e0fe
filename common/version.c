/* SPDX-License-Identifier: Apache-2.0 */
/* version.c - the release, the git checkout and the options of this build,
 * for --version on every binary, hsflow_version()/hsflow_build_info() and
 * the first status line of both sides. */
#include <stdio.h>
#include <string.h>

#include "hs_build_config.h"
#include "hs_version.h"
#include "hs_git_describe.h"
#include "hsflow.h"

const char *hsflow_version(void) { return HSFLOW_VERSION_STRING; }

const char *hsflow_git_describe(void) { return HS_GIT_DESCRIBE; }

const char *hsflow_build_info(void)
{
    return "CUDA " HS_BUILD_CUDA ", UCX " HS_BUILD_UCX ", cuBLASLt " HS_BUILD_CUBLASLT
           ", cuDNN " HS_BUILD_CUDNN ", " HS_BUILD_TYPE;
}

const char *hs_version_line(void)
{
    /* "0.1.0" or "0.1.0 (git f08d450-dirty)" */
    return HS_GIT_DESCRIBE[0] ? HSFLOW_VERSION_STRING " (git " HS_GIT_DESCRIBE ")"
                              : HSFLOW_VERSION_STRING;
}

void hs_version_print(FILE *out, const char *program)
{
    fprintf(out, "%s %s\nbuild: %s\n", program, hs_version_line(), hsflow_build_info());
}
