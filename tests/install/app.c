/* SPDX-License-Identifier: Apache-2.0 */
/* app.c - a program outside the tree that links libhsflow: prints the
 * library's version and a default consumer configuration's cache size. */
#include <stdio.h>
#include <string.h>

#include <hsflow.h>

int main(void)
{
    hs_consumer_config_t cfg;
    hs_consumer_config_default(&cfg);
    if (strcmp(hsflow_version(), HSFLOW_VERSION_STRING) != 0) {
        fprintf(stderr, "header %s, library %s\n", HSFLOW_VERSION_STRING, hsflow_version());
        return 1;
    }
    printf("hsflow %s cache %llu status %s\n", hsflow_version(),
           (unsigned long long)cfg.cache_bytes, hsflow_status_str(0));
    return 0;
}
