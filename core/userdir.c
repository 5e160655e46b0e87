#include "core/userdir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void ifd_user_dir(char *buf, size_t len)
{
    const char *r = getenv("RUNTIME_DIRECTORY"), *x = getenv("XDG_RUNTIME_DIR");
    if (r && r[0] == '/' && strchr(r, ':') == NULL)
        snprintf(buf, len, "%s", r);
    else if (x && x[0] == '/')
        snprintf(buf, len, "%s/infeed", x);
    else
        snprintf(buf, len, "/tmp/infeed-%lu", (unsigned long)geteuid());
}

void ifd_default_control(char *buf, size_t len)
{
    char dir[4096];
    ifd_user_dir(dir, sizeof dir);
    snprintf(buf, len, "ipc://%s/control", dir);
}
