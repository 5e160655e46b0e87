/* A checkpoint file (docs/checkpoint.md): its layout, the atomic write and the loader (the JSON
 * header in it: checkpoint/header.c). */
#include "core/log.h"
#include "core/wire.h"
#include "device/step.h"
#include "checkpoint/format.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define MAGIC "IFDCKPT\0"
#define MAGIC_LEN 8
#define PREAMBLE 16 /* magic, version, header length */
#define CRC_LEN 4
#define HEADER_MAX (16u << 20)

/* ---- the format ------------------------------------------------------------------------------ */

static size_t data_bytes(int64_t nparam_floats, int nslots)
{
    return sizeof(float) * (size_t)nparam_floats * (size_t)(1 + nslots);
}

/* zlib's crc32 takes a 32-bit length. */
static uint32_t crc_update(uint32_t crc, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    while (len > 0) {
        uInt n = len > (1u << 30) ? (1u << 30) : (uInt)len;
        crc = (uint32_t)crc32(crc, p, n);
        p += n;
        len -= n;
    }
    return crc;
}

/* Floats are stored little-endian: a no-op on little-endian hosts, a swap in place otherwise. */
static void floats_from_le(float *f, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &f[i], 4);
        u = __builtin_bswap32(u);
        memcpy(&f[i], &u, 4);
    }
#else
    (void)f;
    (void)n;
#endif
}

static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static void split_path(const char *path, char *dir, size_t len, const char **base)
{
    const char *slash = strrchr(path, '/');
    if (slash == NULL) {
        snprintf(dir, len, ".");
        *base = path;
    } else if (slash == path) {
        snprintf(dir, len, "/");
        *base = slash + 1;
    } else {
        snprintf(dir, len, "%.*s", (int)(slash - path), path);
        *base = slash + 1;
    }
}

/* Writes n floats little-endian (a copy is swapped in chunks on a big-endian host), updating
 * *crc. */
static int write_floats(int fd, const float *f, size_t n, uint32_t *crc)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    float chunk[4096];
    for (size_t i = 0; i < n; i += 4096) {
        size_t k = n - i < 4096 ? n - i : 4096;
        memcpy(chunk, f + i, k * sizeof(float));
        floats_from_le(chunk, k);
        *crc = crc_update(*crc, chunk, k * sizeof(float));
        if (write_all(fd, chunk, k * sizeof(float)))
            return -1;
    }
    return 0;
#else
    *crc = crc_update(*crc, f, n * sizeof(float));
    return write_all(fd, f, n * sizeof(float));
#endif
}

/* The test hook of docs/checkpoint.md: IFD_TEST_CHECKPOINT_PAUSE=STEP:PHASE stops the writer of
 * the checkpoint of global step STEP at PHASE ("partial": half its floats written; "written": the
 * temporary file complete and flushed, not yet renamed) until the process is killed, so that a
 * test can kill the daemon inside a write. Unset, it costs a getenv per write. */
static void test_pause(const ifd_checkpoint *c, const char *phase, const char *tmp)
{
    const char *v = getenv("IFD_TEST_CHECKPOINT_PAUSE");
    if (v == NULL || v[0] == '\0')
        return;
    char *end;
    errno = 0;
    long long step = strtoll(v, &end, 10);
    if (errno || end == v || *end != ':' || step != c->global_step || strcmp(end + 1, phase) != 0)
        return;
    IFD_LOG_WARN("checkpoint: IFD_TEST_CHECKPOINT_PAUSE=%s: the write of '%s' stops here until the "
                 "process is killed",
                 v, tmp);
    for (;;)
        pause();
}

/* The file's bytes, in order, with a running CRC. */
static int write_body(int fd, const ifd_checkpoint *c, ifd_error *err, const char *tmp)
{
    json_t *h = ifd_ckpt_header_json(c);
    char *text = h ? json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(h);
    if (text == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "checkpoint: header");
    size_t hlen = strlen(text);
    uint8_t pre[PREAMBLE];
    memcpy(pre, MAGIC, MAGIC_LEN);
    ifd_put_u32(pre + 8, IFD_CHECKPOINT_VERSION);
    ifd_put_u32(pre + 12, (uint32_t)hlen);
    uint32_t crc = crc_update(0, pre, sizeof pre);
    crc = crc_update(crc, text, hlen);
    int bad = write_all(fd, pre, sizeof pre) || write_all(fd, text, hlen);
    free(text);
    /* params and slots are one block, written in two halves (for the test hook) */
    size_t floats = (size_t)c->nparam_floats * (size_t)(1 + c->nslots), half = floats / 2;
    bad = bad || write_floats(fd, c->params, half, &crc);
    if (!bad)
        test_pause(c, "partial", tmp);
    bad = bad || write_floats(fd, c->params + half, floats - half, &crc);
    uint8_t tail[CRC_LEN];
    ifd_put_u32(tail, crc);
    bad = bad || write_all(fd, tail, sizeof tail);
    if (bad)
        return ifd_error_set(err, IFD_EIO, "checkpoint: cannot write '%s': %s", tmp,
                             strerror(errno));
    return IFD_OK;
}

int ifd_checkpoint_write(const ifd_checkpoint *c, const char *path, ifd_error *err)
{
    char dir[4096], tmp[4096 + 64];
    const char *base;
    split_path(path, dir, sizeof dir, &base);
    int n = snprintf(tmp, sizeof tmp, "%s/.%s" CKPT_TMP_MARK "%ld", dir, base, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof tmp)
        return ifd_error_set(err, IFD_EINVAL, "checkpoint: path '%s' is too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return ifd_error_set(err, IFD_EIO, "checkpoint: cannot create '%s': %s", tmp,
                             strerror(errno));
    int rc = write_body(fd, c, err, tmp);
    if (rc == IFD_OK && fsync(fd) != 0)
        rc = ifd_error_set(err, IFD_EIO, "checkpoint: fsync '%s': %s", tmp, strerror(errno));
    if (close(fd) != 0 && rc == IFD_OK)
        rc = ifd_error_set(err, IFD_EIO, "checkpoint: close '%s': %s", tmp, strerror(errno));
    if (rc == IFD_OK)
        test_pause(c, "written", tmp);
    if (rc == IFD_OK && rename(tmp, path) != 0)
        rc = ifd_error_set(err, IFD_EIO, "checkpoint: cannot rename '%s' to '%s': %s", tmp, path,
                           strerror(errno));
    if (rc) {
        unlink(tmp);
        return rc;
    }
    /* The rename is durable once the folder is. */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) != 0)
        rc = ifd_error_set(err, IFD_EIO, "checkpoint: fsync of folder '%s': %s", dir,
                           strerror(errno));
    if (dfd >= 0)
        close(dfd);
    return rc;
}
/* ---- loading --------------------------------------------------------------------------------- */

static int read_file(const char *path, uint8_t **out, size_t *len, ifd_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ifd_error_set(err, errno == ENOENT ? IFD_ENOTFOUND : IFD_EIO,
                             "checkpoint '%s': cannot open: %s", path, strerror(errno));
    struct stat st;
    uint8_t *buf = NULL;
    int rc = IFD_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = ifd_error_set(err, IFD_EIO, "checkpoint '%s': not a regular file", path);
        goto out;
    }
    buf = malloc((size_t)st.st_size + 1);
    if (buf == NULL) {
        rc = ifd_error_set(err, IFD_ENOMEM, "checkpoint '%s': %lld bytes", path,
                           (long long)st.st_size);
        goto out;
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            rc = ifd_error_set(err, IFD_EIO, "checkpoint '%s': read: %s", path,
                               n < 0 ? strerror(errno) : "the file shrank");
            goto out;
        }
        got += (size_t)n;
    }
    *out = buf;
    *len = got;
    buf = NULL;
out:
    free(buf);
    close(fd);
    return rc;
}

int ifd_checkpoint_load(const char *path, ifd_checkpoint **out, ifd_error *err)
{
    *out = NULL;
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = read_file(path, &buf, &len, err);
    if (rc)
        return rc;
    rc = ifd_checkpoint_load_buffer(buf, len, path, out, err);
    free(buf);
    return rc;
}

int ifd_checkpoint_load_buffer(const void *data, size_t len, const char *path, ifd_checkpoint **out,
                               ifd_error *err)
{
    *out = NULL;
    const uint8_t *buf = data;
    int rc = IFD_OK;
    json_t *h = NULL;
    ifd_checkpoint *c = NULL;
    if (len < PREAMBLE + CRC_LEN) {
        rc = ifd_error_set(err, IFD_EPROTO,
                           "checkpoint '%s': truncated: %zu bytes, expected at least %d", path, len,
                           PREAMBLE + CRC_LEN);
        goto out;
    }
    if (memcmp(buf, MAGIC, MAGIC_LEN) != 0) {
        char got[MAGIC_LEN * 4 + 1];
        for (int i = 0; i < MAGIC_LEN; i++)
            snprintf(got + 4 * i, 5, "\\x%02x", buf[i]);
        rc = ifd_error_set(err, IFD_EPROTO,
                           "checkpoint '%s': magic: expected \"IFDCKPT\\0\" (an infeed "
                           "checkpoint), got \"%s\"",
                           path, got);
        goto out;
    }
    uint32_t version = ifd_get_u32(buf + 8), hlen = ifd_get_u32(buf + 12);
    if (version != IFD_CHECKPOINT_VERSION) {
        rc = ifd_error_set(err, IFD_EPROTO, "checkpoint '%s': version: expected %d, got %u", path,
                           IFD_CHECKPOINT_VERSION, version);
        goto out;
    }
    if (hlen > HEADER_MAX || PREAMBLE + (size_t)hlen + CRC_LEN > len) {
        rc = ifd_error_set(err, IFD_EPROTO,
                           "checkpoint '%s': truncated: %zu bytes, the header alone says %u bytes "
                           "of JSON",
                           path, len, hlen);
        goto out;
    }
    uint32_t stored = ifd_get_u32(buf + len - CRC_LEN);
    uint32_t crc = crc_update(0, buf, len - CRC_LEN);
    json_error_t je;
    h = json_loadb((const char *)buf + PREAMBLE, hlen, JSON_REJECT_DUPLICATES, &je);
    if (h == NULL || !json_is_object(h)) {
        if (crc != stored)
            rc = ifd_error_set(err, IFD_EPROTO,
                               "checkpoint '%s': checksum: stored %08x, computed %08x (the file "
                               "is corrupt)",
                               path, stored, crc);
        else
            rc = ifd_error_set(err, IFD_EPROTO, "checkpoint '%s': header: line %d: %s", path,
                               je.line, h ? "expected a JSON object" : je.text);
        goto out;
    }
    int64_t np = 0, nslots = 0;
    json_t *kind = json_object_get(json_object_get(h, "optimizer"), "kind");
    ifd_optimizer_kind k;
    if (json_is_string(kind) && ifd_optimizer_parse(json_string_value(kind), &k) == IFD_OK)
        nslots = ifd_optimizer_slots(k);
    rc = ifd_ckpt_header_int(h, "nparam_floats", 0, (int64_t)1 << 40, &np, path, err);
    if (rc)
        goto out;
    size_t want = PREAMBLE + hlen + data_bytes(np, (int)nslots) + CRC_LEN;
    if (len != want) {
        rc = ifd_error_set(
            err, IFD_EPROTO,
            "checkpoint '%s': %s: %zu bytes, expected %zu (a %u-byte header, %" PRId64
            " parameter floats and %d slot vectors)",
            path, len < want ? "truncated" : "trailing bytes", len, want, hlen, np, (int)nslots);
        goto out;
    }
    if (crc != stored) {
        rc = ifd_error_set(err, IFD_EPROTO,
                           "checkpoint '%s': checksum: stored %08x, computed %08x (the file is "
                           "corrupt)",
                           path, stored, crc);
        goto out;
    }
    c = ifd_ckpt_alloc(np, (int)nslots, err);
    if (c == NULL) {
        rc = IFD_ENOMEM;
        goto out;
    }
    rc = ifd_ckpt_header_parse(c, h, path, err);
    if (rc)
        goto out;
    memcpy(c->params, buf + PREAMBLE + hlen, data_bytes(np, (int)nslots));
    floats_from_le(c->params, (size_t)np * (size_t)(1 + nslots));
    *out = c;
    c = NULL;
out:
    ifd_checkpoint_free(c);
    json_decref(h);
    return rc;
}
