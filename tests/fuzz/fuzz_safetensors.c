/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_safetensors.c - the safetensors reader (model/safetensors.c): the
 * 8-byte header length, the JSON header, every tensor's dtype, shape and
 * data offsets, and __metadata__.
 *
 * Input: a whole safetensors file. Every tensor the reader accepts is then
 * read in full as bf16 (converted from F16/F32 where needed), so a data
 * range that reaches past the file is caught by AddressSanitizer. */
#include <stdlib.h>
#include <string.h>

#include "safetensors_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    hs__st_set_t *st = NULL;
    if (hs__st_open_memory(data, size, "fuzz.safetensors", &st) != HS_OK) return 0;
    (void)hs__st_metadata(st, "format");
    volatile uint32_t sink = 0;
    for (size_t i = 0; i < hs__st_count(st); i++) {
        const hs__st_tensor_t *t = hs__st_at(st, i);
        if (hs__st_find(st, t->name) != t) abort(); /* names are unique */
        const uint8_t *b = t->data;
        for (size_t j = 0; j < t->nbytes; j++)
            sink += b[j];
        const uint16_t *v;
        if (hs__st_get_bf16(st, t->name, t->ndim, t->shape, &v) == HS_OK) {
            for (size_t j = 0; j < t->nbytes / (t->dtype == HS_ST_F32 ? 4 : 2); j++)
                sink += v[j];
        }
    }
    (void)sink;
    hs__st_close(st);
    return 0;
}
