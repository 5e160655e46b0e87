/* libFuzzer harness: the checkpoint loader (loop/checkpoint.c), reading a file (a memfd). */
#include "infeed/checkpoint.h"

#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz-checkpoint", 0);
    if (fd < 0)
        return 0;
    if (write(fd, data, size) == (ssize_t)size) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        ifd_checkpoint *c = NULL;
        ifd_error err;
        if (ifd_checkpoint_load(path, &c, &err) == IFD_OK)
            ifd_checkpoint_free(c);
    }
    close(fd);
    return 0;
}
