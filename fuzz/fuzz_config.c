/*
 * libFuzzer harness: infeedd's config file and flag parser (host/config.c). The input up to the
 * first NUL is a JSON config file's text; what follows, cut at NULs, is argv.
 */
#include "host/config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1);
    if (buf == NULL)
        return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    size_t json_len = strlen(buf);
    ifd_daemon_config c;
    ifd_error err;
    ifd_daemon_config_defaults(&c);
    if (ifd_daemon_config_apply_json(&c, buf, "fuzz.json", &err) == 0)
        ifd_daemon_config_validate(&c, &err);
    ifd_daemon_config_free(&c);

    char *argv[64] = {"infeedd"};
    int argc = 1;
    for (size_t at = json_len + 1; at < size && argc < 63; at += strlen(buf + at) + 1)
        argv[argc++] = buf + at;
    argv[argc] = NULL;
    FILE *out = fopen("/dev/null", "w");
    int exit_now = 0;
    ifd_daemon_config_defaults(&c);
    for (int i = 1; i < argc; i++) /* --config FILE would read the filesystem: not here */
        if (strncmp(argv[i], "--config", 8) == 0)
            argv[i] = "--seed";
    ifd_daemon_config_parse(&c, argc, argv, out, &exit_now, &err);
    ifd_daemon_config_free(&c);
    if (out)
        fclose(out);
    free(buf);
    return 0;
}
