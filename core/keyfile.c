#include "core/keyfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

int ifd_key_z85_valid(const char *s, size_t len)
{
    if (s == NULL || len != IFD_KEY_Z85_LEN)
        return 0;
    char z[IFD_KEY_Z85_LEN + 1];
    memcpy(z, s, IFD_KEY_Z85_LEN);
    z[IFD_KEY_Z85_LEN] = '\0';
    uint8_t bin[IFD_KEY_BIN_LEN];
    /* zmq_z85_decode refuses characters outside the alphabet and 5-character groups above
     * 2^32 - 1. */
    return zmq_z85_decode(bin, z) != NULL;
}

int ifd_keyfile_read(const char *path, const char *what, char **text, ifd_error *err)
{
    *text = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return ifd_error_set(err, IFD_EINVAL, "%s: cannot open '%s': %s", what, path,
                             strerror(errno));
    char *buf = malloc(IFD_KEYFILE_MAX + 1);
    if (buf == NULL) {
        fclose(f);
        return ifd_error_set(err, IFD_ENOMEM, "%s: reading '%s'", what, path);
    }
    size_t n = fread(buf, 1, IFD_KEYFILE_MAX + 1, f);
    int bad = ferror(f), e = errno;
    fclose(f);
    if (bad) {
        free(buf);
        return ifd_error_set(err, IFD_EINVAL, "%s: cannot read '%s': %s", what, path, strerror(e));
    }
    if (n > IFD_KEYFILE_MAX) {
        free(buf);
        return ifd_error_set(err, IFD_EINVAL,
                             "%s: '%s' is larger than %d bytes, which no key file is", what, path,
                             IFD_KEYFILE_MAX);
    }
    if (memchr(buf, '\0', n)) {
        free(buf);
        return ifd_error_set(err, IFD_EINVAL,
                             "%s: '%s' holds a NUL byte: expected a text file of Z85 keys", what,
                             path);
    }
    buf[n] = '\0';
    *text = buf;
    return IFD_OK;
}

static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

int ifd_keyfile_lines(char *text, int (*fn)(void *arg, char *line, int lineno), void *arg)
{
    int lineno = 0;
    char *p = text;
    while (*p) {
        char *nl = strchr(p, '\n');
        char *next = nl ? nl + 1 : p + strlen(p);
        if (nl)
            *nl = '\0';
        lineno++;
        char *end = p + strlen(p);
        while (end > p && is_blank(end[-1]))
            *--end = '\0';
        while (is_blank(*p))
            p++;
        int rc = fn(arg, p, lineno);
        if (rc)
            return rc;
        p = next;
    }
    return IFD_OK;
}

/* "a line of 12 characters starting 'abc'": what arrived, quoted safely. */
static const char *describe_line(const char *line, char *buf, size_t len)
{
    char head[24];
    size_t i = 0, n = strlen(line);
    for (; i < n && i < 16; i++)
        head[i] = (unsigned char)line[i] >= 0x20 && (unsigned char)line[i] < 0x7f ? line[i] : '?';
    head[i] = '\0';
    snprintf(buf, len, "'%s%s' (%zu characters)", head, n > i ? "..." : "", n);
    return buf;
}

typedef struct pair_parse {
    const char *source;
    char *pub, *sec;
    int pub_line, sec_line;
    ifd_error *err;
} pair_parse;

static int pair_line(void *arg, char *line, int lineno)
{
    pair_parse *pp = arg;
    if (line[0] == '\0' || line[0] == '#')
        return IFD_OK;
    const char *kw = line;
    char *sp = line;
    while (*sp && !is_blank(*sp))
        sp++;
    size_t kwlen = (size_t)(sp - line);
    while (is_blank(*sp))
        sp++;
    char got[96];
    int is_pub = kwlen == 10 && strncmp(kw, "public-key", 10) == 0;
    int is_sec = kwlen == 10 && strncmp(kw, "secret-key", 10) == 0;
    /* a key pair file holds a secret: quote no more of a bad line than its first word */
    if (!is_pub && !is_sec) {
        char word[16];
        snprintf(word, sizeof word, "%.*s", (int)(kwlen < 12 ? kwlen : 12), kw);
        return ifd_error_set(pp->err, IFD_EINVAL,
                             "%s, line %d: expected 'public-key KEY' or 'secret-key KEY' (a key "
                             "pair file written by infeedd keygen), got a line starting %s",
                             pp->source, lineno, describe_line(word, got, sizeof got));
    }
    int *seen = is_pub ? &pp->pub_line : &pp->sec_line;
    if (*seen)
        return ifd_error_set(pp->err, IFD_EINVAL,
                             "%s, line %d: a second %.10s (the first is on "
                             "line %d)",
                             pp->source, lineno, kw, *seen);
    if (!ifd_key_z85_valid(sp, strlen(sp)))
        return ifd_error_set(pp->err, IFD_EINVAL,
                             "%s, line %d: %.10s: expected a key of 40 Z85 characters, got %zu "
                             "characters%s",
                             pp->source, lineno, kw, strlen(sp),
                             strlen(sp) == IFD_KEY_Z85_LEN ? " that are not a Z85 key" : "");
    memcpy(is_pub ? pp->pub : pp->sec, sp, IFD_KEY_Z85_LEN + 1);
    *seen = lineno;
    return IFD_OK;
}

int ifd_keyfile_parse_pair(const char *text, const char *source, char pub[IFD_KEY_Z85_LEN + 1],
                           char sec[IFD_KEY_Z85_LEN + 1], ifd_error *err)
{
    char *copy = strdup(text);
    if (copy == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "%s", source);
    pair_parse pp = {.source = source, .pub = pub, .sec = sec, .err = err};
    int rc = ifd_keyfile_lines(copy, pair_line, &pp);
    free(copy);
    if (rc)
        return rc;
    if (!pp.pub_line || !pp.sec_line)
        return ifd_error_set(err, IFD_EINVAL,
                             "%s: expected a 'public-key' and a 'secret-key' line (a key pair "
                             "file written by infeedd keygen), got %s",
                             source,
                             pp.pub_line   ? "no secret-key"
                             : pp.sec_line ? "no public-key"
                                           : "neither");
    char derived[IFD_KEY_Z85_LEN + 1];
    if (zmq_curve_public(derived, sec) != 0)
        return ifd_error_set(err, IFD_ENOTSUP,
                             "%s: this libzmq has no CURVE support (zmq_curve_public: %s)", source,
                             zmq_strerror(zmq_errno()));
    if (strcmp(derived, pub) != 0)
        return ifd_error_set(err, IFD_EINVAL,
                             "%s, line %d: public-key: expected the public key of the secret key "
                             "on line %d (%.8s...), got %.8s...",
                             source, pp.pub_line, pp.sec_line, derived, pub);
    return IFD_OK;
}

typedef struct pub_parse {
    const char *source;
    char *pub;
    int line;
    ifd_error *err;
} pub_parse;

static int pub_line(void *arg, char *line, int lineno)
{
    pub_parse *pp = arg;
    if (line[0] == '\0' || line[0] == '#')
        return IFD_OK;
    char got[96];
    if (strncmp(line, "secret-key", 10) == 0 || strncmp(line, "public-key", 10) == 0)
        return ifd_error_set(pp->err, IFD_EINVAL,
                             "%s, line %d: expected a public key file (PREFIX.pub of infeedd "
                             "keygen), got a key pair file, which holds a secret key",
                             pp->source, lineno);
    if (pp->line)
        return ifd_error_set(pp->err, IFD_EINVAL,
                             "%s, line %d: expected one key (the first is on line %d), got %s",
                             pp->source, lineno, pp->line, describe_line(line, got, sizeof got));
    if (!ifd_key_z85_valid(line, strlen(line)))
        return ifd_error_set(pp->err, IFD_EINVAL,
                             "%s, line %d: expected a public key of 40 Z85 characters, got %s",
                             pp->source, lineno, describe_line(line, got, sizeof got));
    memcpy(pp->pub, line, IFD_KEY_Z85_LEN + 1);
    pp->line = lineno;
    return IFD_OK;
}

int ifd_keyfile_parse_public(const char *text, const char *source, char pub[IFD_KEY_Z85_LEN + 1],
                             ifd_error *err)
{
    char *copy = strdup(text);
    if (copy == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "%s", source);
    pub_parse pp = {.source = source, .pub = pub, .err = err};
    int rc = ifd_keyfile_lines(copy, pub_line, &pp);
    free(copy);
    if (rc == IFD_OK && !pp.line)
        rc = ifd_error_set(err, IFD_EINVAL,
                           "%s: expected a public key of 40 Z85 characters, got no key line",
                           source);
    return rc;
}

static int load(const char *path, const char *what, char *pub, char *sec, ifd_error *err)
{
    char *text;
    int rc = ifd_keyfile_read(path, what, &text, err);
    if (rc)
        return rc;
    char source[512];
    snprintf(source, sizeof source, "%s: '%s'", what, path);
    rc = sec ? ifd_keyfile_parse_pair(text, source, pub, sec, err)
             : ifd_keyfile_parse_public(text, source, pub, err);
    /* the text held a secret key: do not leave it in freed memory */
    memset(text, 0, strlen(text));
    free(text);
    return rc;
}

int ifd_keyfile_load_pair(const char *path, const char *what, char pub[IFD_KEY_Z85_LEN + 1],
                          char sec[IFD_KEY_Z85_LEN + 1], ifd_error *err)
{
    return load(path, what, pub, sec, err);
}

int ifd_keyfile_load_public(const char *path, const char *what, char pub[IFD_KEY_Z85_LEN + 1],
                            ifd_error *err)
{
    return load(path, what, pub, NULL, err);
}

/* Creates path exclusively with mode and writes text; removes it again on a failed write. */
static int write_new(const char *path, mode_t mode, const char *text, ifd_error *err)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0)
        return ifd_error_set(err, IFD_EINVAL, "keygen: cannot create '%s': %s%s", path,
                             strerror(errno),
                             errno == EEXIST ? " (keygen never overwrites a key file)" : "");
    /* the umask may have taken bits away, never added any; make the mode exact */
    int rc = fchmod(fd, mode) == 0 ? 0 : -1;
    size_t len = strlen(text), done = 0;
    while (rc == 0 && done < len) {
        ssize_t n = write(fd, text + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            rc = -1;
        else
            done += (size_t)n;
    }
    if (rc == 0)
        rc = fsync(fd);
    int e = errno;
    if (close(fd) != 0 && rc == 0) {
        rc = -1;
        e = errno;
    }
    if (rc != 0) {
        unlink(path);
        return ifd_error_set(err, IFD_EIO, "keygen: writing '%s': %s", path, strerror(e));
    }
    return IFD_OK;
}

int ifd_keyfile_generate(const char *prefix, char pub_out[IFD_KEY_Z85_LEN + 1], ifd_error *err)
{
    if (prefix == NULL || prefix[0] == '\0')
        return ifd_error_set(err, IFD_EINVAL, "keygen: expected a file name prefix, got ''");
    if (!zmq_has("curve"))
        return ifd_error_set(err, IFD_ENOTSUP,
                             "keygen: this libzmq was built without CURVE (zmq_has(\"curve\") "
                             "is false)");
    size_t n = strlen(prefix) + 5;
    char *keypath = malloc(n), *pubpath = malloc(n);
    int rc = IFD_OK;
    if (keypath == NULL || pubpath == NULL) {
        rc = ifd_error_set(err, IFD_ENOMEM, "keygen");
        goto out;
    }
    snprintf(keypath, n, "%s.key", prefix);
    snprintf(pubpath, n, "%s.pub", prefix);
    if (access(keypath, F_OK) == 0 || access(pubpath, F_OK) == 0) {
        rc = ifd_error_set(err, IFD_EINVAL,
                           "keygen: '%s' exists: expected new file names (keygen never "
                           "overwrites a key file)",
                           access(keypath, F_OK) == 0 ? keypath : pubpath);
        goto out;
    }
    char pub[IFD_KEY_Z85_LEN + 1], sec[IFD_KEY_Z85_LEN + 1];
    if (zmq_curve_keypair(pub, sec) != 0) {
        rc = ifd_error_set(err, IFD_ENOTSUP, "keygen: zmq_curve_keypair: %s",
                           zmq_strerror(zmq_errno()));
        goto out;
    }
    char keytext[512], pubtext[64];
    snprintf(keytext, sizeof keytext,
             "# infeed CURVE key pair (infeedd keygen). Keep this file secret: whoever reads it\n"
             "# can act as this key. Hand out the .pub file of the same name instead.\n"
             "public-key %s\n"
             "secret-key %s\n",
             pub, sec);
    snprintf(pubtext, sizeof pubtext, "%s\n", pub);
    rc = write_new(keypath, 0600, keytext, err);
    if (rc == IFD_OK && (rc = write_new(pubpath, 0644, pubtext, err)) != IFD_OK)
        unlink(keypath);
    memset(keytext, 0, sizeof keytext);
    memset(sec, 0, sizeof sec);
    if (rc == IFD_OK && pub_out)
        memcpy(pub_out, pub, sizeof pub);
out:
    free(keypath);
    free(pubpath);
    return rc;
}
