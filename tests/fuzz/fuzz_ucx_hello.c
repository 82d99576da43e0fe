/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_ucx_hello.c - libFuzzer harness for the UCX bootstrap records
 * (transport/ucx_hello.c), the only bytes a peer gets to send before it has
 * proved itself on a UCX consumer. Input: one record as it would arrive. The
 * head check runs on the first 12 bytes, as the reader does before it
 * allocates the body, then the whole-record parser; whatever they accept
 * must stay inside the input, and a packed REFUSE must parse back. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ucx_hello_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char why[256];
    if (size >= HS__UCX_BOOT_HEAD) {
        hs__ucx_boot_head_t h;
        if (hs__ucx_boot_head_parse(data, &h, why, sizeof why) == HS_OK &&
            (size_t)h.body_len + HS__UCX_BOOT_HEAD > HS__UCX_BOOT_RECORD_MAX)
            abort(); /* the reader would allocate this much */
    }
    hs__ucx_boot_msg_t m;
    if (hs__ucx_hello_parse(data, size, &m, why, sizeof why) == HS_OK) {
        const uint8_t *end = data + size;
        if (m.nonce && (m.nonce < data || m.nonce + HS__UCX_BOOT_NONCE > end)) abort();
        if (m.mac && (m.mac < data || m.mac + HS__UCX_BOOT_MAC > end)) abort();
        if (m.addr && (m.addr_len == 0 || m.addr_len > HS__UCX_BOOT_ADDR_MAX || m.addr < data ||
                       m.addr + m.addr_len > end))
            abort();
        if (m.type == HS__UCX_BOOT_REFUSE) {
            if (strlen(m.text) > HS__UCX_BOOT_TEXT_MAX || m.status >= 0) abort();
            uint8_t buf[HS__UCX_BOOT_HEAD + 4 + HS__UCX_BOOT_TEXT_MAX];
            size_t n = hs__ucx_boot_pack_refuse(buf, sizeof buf, m.status, m.text);
            hs__ucx_boot_msg_t back;
            if (n == 0 || hs__ucx_hello_parse(buf, n, &back, why, sizeof why) != HS_OK ||
                back.status != m.status || strcmp(back.text, m.text) != 0)
                abort();
        }
    }
    return 0;
}
