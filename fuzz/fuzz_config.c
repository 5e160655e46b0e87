/*
 * fuzz_config: infeedd's config file and flag parser (host/config_parse.c, host/config_json.c,
 * host/config_validate.c).
 *
 * The input is split at NUL bytes: the first piece is the text of a JSON config file, the others
 * are command-line arguments. Each input is parsed twice, from the defaults each time:
 *   - the text as a --config file (ifd_daemon_config_apply_json), then the validation pass;
 *   - the arguments as infeedd's argv (ifd_daemon_config_parse_with), where a --config among
 *     them reads the text instead of a file, so nothing touches the filesystem.
 * Beyond the sanitizers, it aborts when a failure has no sentence or another code than it
 * returned, or when a config that passed does not pass the validation pass again.
 */
#include "core/log.h"
#include "host/config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ARGS 64

static FILE *devnull;

static int read_text(void *arg, const char *path, char **text, ifd_error *err)
{
    (void)path;
    *text = strdup((const char *)arg);
    return *text ? IFD_OK : ifd_error_set(err, IFD_ENOMEM, "--config: out of memory");
}

/* --program-lib: nothing is loaded (no file is touched); every library fails with a sentence. */
static int no_program_lib(const char *path, ifd_error *err)
{
    return ifd_error_set(err, IFD_EINVAL, "program library '%s': not loaded by the fuzzer", path);
}

static void check_result(int rc, const ifd_daemon_config *c, const ifd_error *err)
{
    if (rc != IFD_OK) {
        if (err->code != rc || err->msg[0] == '\0' ||
            memchr(err->msg, '\0', sizeof err->msg) == NULL)
            abort();
        return;
    }
    ifd_error again;
    ifd_error_clear(&again);
    if (ifd_daemon_config_validate(c, &again) != IFD_OK)
        abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    devnull = fopen("/dev/null", "w");
    ifd_log_set_level(IFD_LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* One NUL-terminated copy: the pieces are C strings in place. */
    char *buf = malloc(size + 1);
    if (buf == NULL)
        return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    char *argv[MAX_ARGS + 2];
    int argc = 0;
    argv[argc++] = "infeedd";
    char *text = buf;
    for (char *p = buf + strlen(buf); p < buf + size && argc <= MAX_ARGS; p += strlen(p)) {
        p++; /* past the NUL */
        argv[argc++] = p;
    }
    argv[argc] = NULL;

    ifd_daemon_config c;
    ifd_error err;

    ifd_daemon_config_defaults(&c);
    ifd_error_clear(&err);
    int rc = ifd_daemon_config_apply_json(&c, text, "config file fuzz.json", &err);
    if (rc == IFD_OK)
        rc = ifd_daemon_config_validate(&c, &err);
    check_result(rc, &c, &err);
    ifd_daemon_config_free(&c);

    ifd_daemon_config_defaults(&c);
    c.program_libs.load = no_program_lib;
    c.host_call_libs.load = no_program_lib;
    ifd_error_clear(&err);
    int exit_now = 0;
    rc = ifd_daemon_config_parse_with(&c, argc, argv, devnull, &exit_now, read_text, text, &err);
    if (!exit_now)
        check_result(rc, &c, &err);
    ifd_daemon_config_free(&c);

    free(buf);
    return 0;
}
