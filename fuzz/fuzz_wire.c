/* libFuzzer harness: the fixed wire headers (core/wire.h) every peer parses. */
#include "core/wire.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ifd_proto_header_info h;
    char why[200];
    if (ifd_proto_parse_header(data, size, &h, why, sizeof why) == 0 &&
        size >= IFD_PROTO_BATCH_HDR) {
        ifd_proto_batch b;
        ifd_proto_parse_batch(data, &b);
    }
    return 0;
}
