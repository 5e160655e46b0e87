/* A checkpoint file (docs/checkpoint.md): its format, the atomic write and the loader. */
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

static json_t *header_json(const ifd_checkpoint *c)
{
    json_t *params = json_array();
    for (int i = 0; i < c->nparams; i++) {
        const ifd_param_spec *ps = &c->params_spec[i];
        json_t *shape = json_array();
        for (int d = 0; d < ps->rank; d++)
            json_array_append_new(shape, json_integer(ps->dims[d]));
        json_array_append_new(params, json_pack("{s:s, s:o, s:I, s:I}", "name", ps->name, "shape",
                                                shape, "offset", (json_int_t)ps->offset, "count",
                                                (json_int_t)ps->count));
    }
    /* One host: "producers". Several: "hosts" and "host_producers", each host's in rank order,
     * with "producers" empty (docs/checkpoint.md). */
    json_t *by_host = c->nhosts > 1 ? json_array() : NULL;
    json_t *producers = NULL;
    for (int h = 0; h < c->nhosts; h++) {
        const ifd_ckpt_table *t = &c->tables[h];
        json_t *m = json_object();
        for (int i = 0; i < t->nproducers; i++)
            json_object_set_new(m, t->producers[i].name, json_integer(t->producers[i].seq));
        if (by_host)
            json_array_append_new(by_host, m);
        else
            producers = m;
    }
    if (by_host)
        producers = json_object();
    const ifd_optimizer *o = &c->optimizer;
    json_t *opt = json_pack(
        "{s:s, s:i, s:f, s:f, s:f, s:f, s:f}", "kind", ifd_optimizer_name(o->kind), "slots",
        c->nslots, "learning_rate", (double)o->learning_rate, "momentum", (double)o->momentum,
        "beta1", (double)o->beta1, "beta2", (double)o->beta2, "epsilon", (double)o->epsilon);
    json_t *settings =
        json_pack("{s:I, s:I, s:I}", "features", (json_int_t)c->settings.features, "classes",
                  (json_int_t)c->settings.classes, "hidden", (json_int_t)c->settings.hidden);
    json_t *h = json_pack(
        "{s:s, s:s, s:o, s:o, s:I, s:o, s:I, s:I, s:o, s:f}", "format", "infeed-checkpoint",
        "program", c->program, "settings", settings, "params", params, "nparam_floats",
        (json_int_t)c->nparam_floats, "optimizer", opt, "global_step", (json_int_t)c->global_step,
        "opt_step", (json_int_t)c->opt_step, "producers", producers, "created", (double)time(NULL));
    if (h && by_host) {
        json_object_set_new(h, "hosts", json_integer(c->nhosts));
        json_object_set_new(h, "host_producers", by_host);
    } else {
        json_decref(by_host);
    }
    return h;
}

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
    json_t *h = header_json(c);
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

/* An integer member in [lo, hi]. */
static int get_int(json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                   const char *path, ifd_error *err)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: '%s': expected an integer from %" PRId64
                             " to %" PRId64 ", got %s",
                             path, key, lo, hi,
                             v == NULL            ? "nothing"
                             : json_is_integer(v) ? "an integer out of range"
                                                  : "another type");
    *out = json_integer_value(v);
    return IFD_OK;
}

static int get_float(json_t *obj, const char *key, float *out, const char *path, ifd_error *err)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_number(v))
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: 'optimizer.%s': expected a number", path,
                             key);
    *out = (float)json_number_value(v);
    return IFD_OK;
}

/* The parameter list: names, shapes, offsets and counts that tile nparam_floats. */
static int parse_params(ifd_checkpoint *c, json_t *params, const char *path, ifd_error *err)
{
    if (!json_is_array(params) || json_array_size(params) > IFD_MAX_PARAMS)
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: 'params': expected an array of at most %d "
                             "parameters",
                             path, IFD_MAX_PARAMS);
    int64_t at = 0;
    c->nparams = (int)json_array_size(params);
    for (int i = 0; i < c->nparams; i++) {
        json_t *e = json_array_get(params, (size_t)i);
        ifd_param_spec *ps = &c->params_spec[i];
        json_t *name = json_object_get(e, "name"), *shape = json_object_get(e, "shape");
        if (!json_is_string(name) || json_string_length(name) >= IFD_NAME_MAX ||
            !json_is_array(shape) || json_array_size(shape) > 2)
            return ifd_error_set(err, IFD_EPROTO,
                                 "checkpoint '%s': header: 'params[%d]': expected a name of at "
                                 "most %d bytes and a shape of rank 0 to 2",
                                 path, i, IFD_NAME_MAX - 1);
        snprintf(ps->name, sizeof ps->name, "%s", json_string_value(name));
        ps->rank = (int)json_array_size(shape);
        /* A parameter has at most 2^40 floats (as nparam_floats), so count cannot overflow. */
        int64_t count = 1;
        for (int d = 0; d < ps->rank; d++) {
            json_t *dim = json_array_get(shape, (size_t)d);
            if (!json_is_integer(dim) || json_integer_value(dim) < 1)
                return ifd_error_set(err, IFD_EPROTO,
                                     "checkpoint '%s': header: 'params[%d].shape': expected "
                                     "positive integers",
                                     path, i);
            if (json_integer_value(dim) > ((int64_t)1 << 40) / count)
                return ifd_error_set(err, IFD_EPROTO,
                                     "checkpoint '%s': header: 'params[%d].shape': expected at "
                                     "most 2^40 floats in all, got dimension %d of %" PRId64
                                     " after %" PRId64 " floats",
                                     path, i, d, (int64_t)json_integer_value(dim), count);
            ps->dims[d] = json_integer_value(dim);
            count *= ps->dims[d];
        }
        int rc = get_int(e, "offset", at, at, &ps->offset, path, err);
        if (rc == IFD_OK)
            rc = get_int(e, "count", count, count, &ps->count, path, err);
        if (rc)
            return ifd_error_prefix(err, "parameter '%s' (the parameters tile the vector in order)",
                                    ps->name);
        at += count;
    }
    if (at != c->nparam_floats)
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: 'params' cover %" PRId64
                             " floats, 'nparam_floats' says %" PRId64,
                             path, at, c->nparam_floats);
    return IFD_OK;
}

/* A producer map (name: seq) into c's selected table; field names it in sentences. */
static int parse_producers(ifd_checkpoint *c, json_t *producers, const char *field,
                           const char *path, ifd_error *err)
{
    if (!json_is_object(producers))
        return ifd_error_set(err, IFD_EPROTO, "checkpoint '%s': header: '%s': expected an object",
                             path, field);
    const char *name;
    json_t *seq;
    json_object_foreach(producers, name, seq)
    {
        if (!json_is_integer(seq))
            return ifd_error_set(err, IFD_EPROTO,
                                 "checkpoint '%s': header: '%s.%s': expected an integer", path,
                                 field, name);
        ifd_error e;
        if (ifd_checkpoint_set_producer(c, name, json_integer_value(seq), &e))
            return ifd_error_set(err, e.code == IFD_ENOMEM ? e.code : IFD_EPROTO,
                                 "checkpoint '%s': header: %s: %s", path, field, e.msg);
    }
    return IFD_OK;
}

/* "program" and "settings". */
static int parse_program(ifd_checkpoint *c, json_t *h, const char *path, ifd_error *err)
{
    json_t *prog = json_object_get(h, "program");
    if (!json_is_string(prog) || json_string_length(prog) == 0 ||
        json_string_length(prog) >= sizeof c->program)
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: 'program': expected a program name", path);
    snprintf(c->program, sizeof c->program, "%s", json_string_value(prog));
    json_t *s = json_object_get(h, "settings");
    int64_t big = (int64_t)1 << 40;
    int rc = get_int(s, "features", 0, big, &c->settings.features, path, err);
    if (rc == IFD_OK)
        rc = get_int(s, "classes", 0, big, &c->settings.classes, path, err);
    if (rc == IFD_OK)
        rc = get_int(s, "hidden", 0, big, &c->settings.hidden, path, err);
    return rc;
}

/* "optimizer": its kind, the slots that kind keeps, its hyperparameters. */
static int parse_optimizer(ifd_checkpoint *c, json_t *o, const char *path, ifd_error *err)
{
    json_t *kind = json_object_get(o, "kind");
    if (!json_is_string(kind) || ifd_optimizer_parse(json_string_value(kind), &c->optimizer.kind))
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: 'optimizer.kind': expected sgd, momentum "
                             "or adam",
                             path);
    int want = ifd_optimizer_slots(c->optimizer.kind);
    json_t *slots = json_object_get(o, "slots");
    if (!json_is_integer(slots) || json_integer_value(slots) != want)
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: 'optimizer.slots': %s keeps %d slot "
                             "vectors, the header says %lld",
                             path, json_string_value(kind), want,
                             json_is_integer(slots) ? (long long)json_integer_value(slots) : -1LL);
    if (get_float(o, "learning_rate", &c->optimizer.learning_rate, path, err) ||
        get_float(o, "momentum", &c->optimizer.momentum, path, err) ||
        get_float(o, "beta1", &c->optimizer.beta1, path, err) ||
        get_float(o, "beta2", &c->optimizer.beta2, path, err) ||
        get_float(o, "epsilon", &c->optimizer.epsilon, path, err))
        return err ? err->code : IFD_EPROTO;
    return IFD_OK;
}

/* "producers", or, written by several hosts, "hosts" and each host's table in
 * "host_producers". */
static int parse_positions(ifd_checkpoint *c, json_t *h, const char *path, ifd_error *err)
{
    json_t *producers = json_object_get(h, "producers");
    if (!json_is_object(producers))
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: 'producers': expected an object", path);
    int64_t hosts = 1;
    int rc;
    if (json_object_get(h, "hosts") &&
        (rc = get_int(h, "hosts", 1, IFD_CHECKPOINT_MAX_HOSTS, &hosts, path, err)) != IFD_OK)
        return rc;
    if (hosts == 1)
        return parse_producers(c, producers, "producers", path, err);
    json_t *by_host = json_object_get(h, "host_producers");
    if (!json_is_array(by_host))
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: 'host_producers': expected an array (one "
                             "object a host, 'hosts' is %lld), got none",
                             path, (long long)hosts);
    if (json_array_size(by_host) != (size_t)hosts)
        return ifd_error_set(
            err, IFD_EPROTO,
            "checkpoint '%s': header: 'host_producers': expected %lld objects (one "
            "a host, 'hosts'), got %zu",
            path, (long long)hosts, json_array_size(by_host));
    ifd_error e;
    if (ifd_checkpoint_set_hosts(c, (int)hosts, &e))
        return ifd_error_set(err, e.code, "checkpoint '%s': %s", path, e.msg);
    for (int i = 0; i < (int)hosts; i++) {
        char field[48];
        snprintf(field, sizeof field, "host_producers[%d]", i);
        c->host = i;
        if ((rc = parse_producers(c, json_array_get(by_host, (size_t)i), field, path, err)) !=
            IFD_OK)
            return rc;
    }
    c->host = 0;
    return IFD_OK;
}

static int parse_header(ifd_checkpoint *c, json_t *h, const char *path, ifd_error *err)
{
    int rc = parse_program(c, h, path, err);
    if (rc == IFD_OK)
        rc = parse_optimizer(c, json_object_get(h, "optimizer"), path, err);
    if (rc == IFD_OK)
        rc = get_int(h, "global_step", 0, INT64_MAX, &c->global_step, path, err);
    if (rc == IFD_OK)
        rc = get_int(h, "opt_step", 0, INT64_MAX, &c->opt_step, path, err);
    if (rc == IFD_OK)
        rc = parse_params(c, json_object_get(h, "params"), path, err);
    if (rc == IFD_OK)
        rc = parse_positions(c, h, path, err);
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
    rc = get_int(h, "nparam_floats", 0, (int64_t)1 << 40, &np, path, err);
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
    rc = parse_header(c, h, path, err);
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
