#include "tests/util/files.h"

#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *tu_tmp_dir(const char *prefix)
{
    char *d = malloc(strlen(prefix) + 16);
    ck_assert_ptr_nonnull(d);
    sprintf(d, "/tmp/%s-XXXXXX", prefix);
    ck_assert_ptr_nonnull(mkdtemp(d));
    return d;
}

void tu_rm_dir(char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char p[512];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
    free(dir);
}

uint8_t *tu_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open '%s'", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    ck_assert_int_ge(n, 0);
    fseek(f, 0, SEEK_SET);
    *len = (size_t)n;
    uint8_t *b = malloc(*len + 1);
    ck_assert_ptr_nonnull(b);
    ck_assert_uint_eq(fread(b, 1, *len, f), *len);
    b[*len] = '\0';
    fclose(f);
    return b;
}

void tu_spit(const char *path, const void *bytes, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot create '%s'", path);
    ck_assert_uint_eq(fwrite(bytes, 1, len, f), len);
    fclose(f);
}

char *tu_capture_stderr(void (*fn)(void *arg), void *arg)
{
    fflush(stderr);
    int saved = dup(2);
    ck_assert_int_ge(saved, 0);
    FILE *tmp = tmpfile();
    ck_assert_ptr_nonnull(tmp);
    ck_assert_int_ge(dup2(fileno(tmp), 2), 0);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fseek(tmp, 0, SEEK_END);
    long n = ftell(tmp);
    ck_assert_int_ge(n, 0);
    rewind(tmp);
    char *buf = calloc((size_t)n + 1, 1);
    ck_assert_ptr_nonnull(buf);
    size_t got = fread(buf, 1, (size_t)n, tmp);
    buf[got] = '\0';
    fclose(tmp);
    return buf;
}
