#include "host/security.h"

#include "core/log.h"
#include "core/thread.h"
#include "core/wire.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

/* A DRAFT option in libzmq 4.3's header, implemented by the library: a CURVE socket then refuses
 * every peer while no ZAP handler is bound, instead of accepting every one. */
#ifndef ZMQ_ZAP_ENFORCE_DOMAIN
#define ZMQ_ZAP_ENFORCE_DOMAIN 93
#endif

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define NAME_LEN (IFD_PROTO_NAME_MAX + 1)
#define LOG_INTERVAL_NS 1000000000LL

typedef struct key_entry {
    uint8_t key[IFD_KEY_BIN_LEN];
    char z85[IFD_KEY_Z85_LEN + 1];
    char (*names)[NAME_LEN]; /* the names this key is bound to; none: any name not bound */
    int nnames;
    int line;
} key_entry;

typedef struct key_list {
    key_entry *v;
    int n, cap;
} key_list;

typedef struct refusal_log {
    int64_t last_ns; /* when the last line was written; 0: never */
    uint64_t suppressed;
} refusal_log;

struct ifd_security {
    char pub[IFD_KEY_Z85_LEN + 1];
    uint8_t secret[IFD_KEY_BIN_LEN];
    key_list authorized, admin;
    /* the ZAP handler: its socket is used only by its thread once started */
    void *zap;
    int wake[2]; /* a pipe: a byte written to wake[1] stops the handler */
    ifd_thread thread;
    int started;
    refusal_log log[IFD_SOCK_ROLES];
    uint64_t refused[IFD_SOCK_ROLES]; /* atomic */
};

static const char *const domains[IFD_SOCK_ROLES] = {"infeed-ingest", "infeed-publish",
                                                    "infeed-control"};
static const char *const role_names[IFD_SOCK_ROLES] = {"ingest", "publish", "control"};
static const char *const role_wants[IFD_SOCK_ROLES] = {
    "authorized_keys", "admin_keys or authorized_keys", "admin_keys"};

const char *ifd_sock_role_name(ifd_sock_role role)
{
    return role >= 0 && role < IFD_SOCK_ROLES ? role_names[role] : "?";
}

/* ---- key lists -------------------------------------------------------------------------- */

static void key_list_fini(key_list *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->v[i].names);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static const key_entry *key_find_bin(const key_list *l, const uint8_t *key)
{
    for (int i = 0; i < l->n; i++)
        if (memcmp(l->v[i].key, key, IFD_KEY_BIN_LEN) == 0)
            return &l->v[i];
    return NULL;
}

static const key_entry *key_find_z85(const key_list *l, const char *z85)
{
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->v[i].z85, z85) == 0)
            return &l->v[i];
    return NULL;
}

/* The key that binds name, or NULL. */
static const key_entry *name_owner(const key_list *l, const char *name)
{
    for (int i = 0; i < l->n; i++)
        for (int j = 0; j < l->v[i].nnames; j++)
            if (strcmp(l->v[i].names[j], name) == 0)
                return &l->v[i];
    return NULL;
}

static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

typedef struct keys_parse {
    key_list *list;
    const char *source;
    int allow_names;
    ifd_error *err;
} keys_parse;

/* One name of a line's comma-separated list, trimmed; added to e. */
static int add_name(keys_parse *kp, key_entry *e, const char *s, size_t len, int lineno)
{
    while (len && is_blank(*s)) {
        s++;
        len--;
    }
    while (len && is_blank(s[len - 1]))
        len--;
    if (len == 0)
        return ifd_error_set(kp->err, IFD_EINVAL,
                             "%s, line %d: names: expected a comma-separated list of producer "
                             "names, got an empty name",
                             kp->source, lineno);
    if (len > IFD_PROTO_NAME_MAX)
        return ifd_error_set(kp->err, IFD_EINVAL,
                             "%s, line %d: name '%.20s...': expected at most %d bytes, got %zu",
                             kp->source, lineno, s, IFD_PROTO_NAME_MAX, len);
    for (size_t i = 0; i < len; i++)
        if (is_blank(s[i]) || (unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return ifd_error_set(kp->err, IFD_EINVAL,
                                 "%s, line %d: name '%.*s': expected no blanks or control "
                                 "characters inside a name (names are separated by commas)",
                                 kp->source, lineno, (int)len, s);
    char name[NAME_LEN];
    memcpy(name, s, len);
    name[len] = '\0';
    for (int j = 0; j < e->nnames; j++)
        if (strcmp(e->names[j], name) == 0)
            return ifd_error_set(kp->err, IFD_EINVAL, "%s, line %d: name '%s' is listed twice",
                                 kp->source, lineno, name);
    const key_entry *owner = name_owner(kp->list, name);
    if (owner)
        return ifd_error_set(kp->err, IFD_EINVAL,
                             "%s, line %d: name '%s' is already bound to the key on line %d: a "
                             "name may be bound to one key only",
                             kp->source, lineno, name, owner->line);
    char(*names)[NAME_LEN] = realloc(e->names, (size_t)(e->nnames + 1) * sizeof *names);
    if (names == NULL)
        return ifd_error_set(kp->err, IFD_ENOMEM, "%s, line %d", kp->source, lineno);
    e->names = names;
    memcpy(e->names[e->nnames++], name, len + 1);
    return IFD_OK;
}

static int keys_line(void *arg, char *line, int lineno)
{
    keys_parse *kp = arg;
    if (line[0] == '\0' || line[0] == '#')
        return IFD_OK;
    size_t klen = 0;
    while (line[klen] && !is_blank(line[klen]))
        klen++;
    const char *rest = line + klen;
    while (is_blank(*rest))
        rest++;
    if (!ifd_key_z85_valid(line, klen)) {
        char head[20];
        size_t n = klen < 16 ? klen : 16;
        for (size_t i = 0; i < n; i++)
            head[i] = (unsigned char)line[i] >= 0x20 && line[i] != 0x7f ? line[i] : '?';
        head[n] = '\0';
        return ifd_error_set(kp->err, IFD_EINVAL,
                             "%s, line %d: expected a public key of 40 Z85 characters%s, got "
                             "'%s%s' (%zu characters)",
                             kp->source, lineno,
                             kp->allow_names ? " and, optionally, names (KEY name1,name2)" : "",
                             head, klen > n ? "..." : "", klen);
    }
    if (*rest && !kp->allow_names)
        return ifd_error_set(kp->err, IFD_EINVAL,
                             "%s, line %d: expected a public key alone (admin keys take no "
                             "producer names), got names after it",
                             kp->source, lineno);
    key_list *l = kp->list;
    key_entry e = {.line = lineno};
    memcpy(e.z85, line, IFD_KEY_Z85_LEN);
    e.z85[IFD_KEY_Z85_LEN] = '\0';
    zmq_z85_decode(e.key, e.z85);
    const key_entry *dup = key_find_bin(l, e.key);
    if (dup)
        return ifd_error_set(kp->err, IFD_EINVAL,
                             "%s, line %d: key %.8s... is already listed on line %d: expected "
                             "each key once (put all its names on one line)",
                             kp->source, lineno, e.z85, dup->line);
    while (*rest) {
        const char *comma = strchr(rest, ',');
        size_t len = comma ? (size_t)(comma - rest) : strlen(rest);
        int rc = add_name(kp, &e, rest, len, lineno);
        if (rc) {
            free(e.names);
            return rc;
        }
        rest += len;
        if (comma) {
            rest++;
            if (*rest == '\0') {
                free(e.names);
                return ifd_error_set(kp->err, IFD_EINVAL,
                                     "%s, line %d: names: expected a name after the last comma",
                                     kp->source, lineno);
            }
        }
    }
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        key_entry *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (v == NULL) {
            free(e.names);
            return ifd_error_set(kp->err, IFD_ENOMEM, "%s, line %d", kp->source, lineno);
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = e;
    return IFD_OK;
}

int ifd_security_parse_keys(ifd_security *s, const char *text, const char *source, int allow_names,
                            ifd_error *err)
{
    char *copy = strdup(text);
    if (copy == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "%s", source);
    keys_parse kp = {.list = allow_names ? &s->authorized : &s->admin,
                     .source = source,
                     .allow_names = allow_names,
                     .err = err};
    int rc = ifd_keyfile_lines(copy, keys_line, &kp);
    free(copy);
    return rc;
}

static int load_keys(ifd_security *s, const char *path, const char *what, int allow_names,
                     ifd_error *err)
{
    char *text;
    int rc = ifd_keyfile_read(path, what, &text, err);
    if (rc)
        return rc;
    char source[512];
    snprintf(source, sizeof source, "%s: '%s'", what, path);
    rc = ifd_security_parse_keys(s, text, source, allow_names, err);
    free(text);
    return rc;
}

/* A key file's sentence starts with the key that names the file (the "what" it was read as):
 * the config names that key as the user gave it. */
static void about(ifd_error *err, const char *key)
{
    ifd_error_mark_key(err, key, 0, (int)strlen(key));
}

/* ---- lifecycle -------------------------------------------------------------------------- */

int ifd_security_create_empty(ifd_security **out, ifd_error *err)
{
    ifd_security *s = calloc(1, sizeof *s);
    *out = s;
    if (s == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "security");
    s->wake[0] = s->wake[1] = -1;
    return IFD_OK;
}

int ifd_security_create(ifd_security **out, const ifd_daemon_config *c, ifd_error *err)
{
    *out = NULL;
    if (c->curve_secret_key == NULL) {
        if (c->authorized_keys || c->admin_keys)
            return ifd_error_set_key(err, IFD_EINVAL,
                                     c->authorized_keys ? "authorized_keys" : "admin_keys",
                                     "expected curve_secret_key, the daemon's key pair, with it "
                                     "(CURVE is off without one), got none");
        return IFD_OK;
    }
    if (!zmq_has("curve"))
        return ifd_error_set_key(err, IFD_ENOTSUP, "curve_secret_key",
                                 "CURVE was asked for, but this libzmq was built without it "
                                 "(zmq_has(\"curve\") is false)");
    if (c->authorized_keys == NULL)
        return ifd_error_set_key(err, IFD_EINVAL, "authorized_keys",
                                 "CURVE (curve_secret_key) needs the producers' public keys: "
                                 "expected a file, got none");
    ifd_security *s;
    int rc = ifd_security_create_empty(&s, err);
    if (rc)
        return rc;
    char sec[IFD_KEY_Z85_LEN + 1];
    rc = ifd_keyfile_load_pair(c->curve_secret_key, "curve_secret_key", s->pub, sec, err);
    if (rc) {
        about(err, "curve_secret_key");
        goto fail;
    }
    zmq_z85_decode(s->secret, sec);
    memset(sec, 0, sizeof sec);
    struct stat st;
    if (stat(c->curve_secret_key, &st) == 0 && (st.st_mode & 077))
        IFD_LOG_WARN("curve_secret_key: '%s' can be read by other users (mode %03o): whoever "
                     "reads it can act as this daemon; chmod 600 it",
                     c->curve_secret_key, (unsigned)(st.st_mode & 0777));
    rc = load_keys(s, c->authorized_keys, "authorized_keys", 1, err);
    if (rc) {
        about(err, "authorized_keys");
        goto fail;
    }
    if (s->authorized.n == 0) {
        rc = ifd_error_set_key(err, IFD_EINVAL, "authorized_keys",
                               "'%s': expected at least one producer key, got none",
                               c->authorized_keys);
        goto fail;
    }
    if (c->admin_keys && (rc = load_keys(s, c->admin_keys, "admin_keys", 0, err)) != IFD_OK) {
        about(err, "admin_keys");
        goto fail;
    }
    *out = s;
    return IFD_OK;
fail:
    ifd_security_destroy(s);
    return rc;
}

/* ---- the ZAP handler -------------------------------------------------------------------- */

static int role_of_domain(const zmq_msg_t *m)
{
    for (int r = 0; r < IFD_SOCK_ROLES; r++)
        if (zmq_msg_size((zmq_msg_t *)m) == strlen(domains[r]) &&
            memcmp(zmq_msg_data((zmq_msg_t *)m), domains[r], strlen(domains[r])) == 0)
            return r;
    return -1;
}

static int allowed(const ifd_security *s, int role, const uint8_t *key)
{
    switch (role) {
    case IFD_SOCK_INGEST:
        return key_find_bin(&s->authorized, key) != NULL;
    case IFD_SOCK_CONTROL:
        return key_find_bin(&s->admin, key) != NULL;
    case IFD_SOCK_PUBLISH:
        return key_find_bin(&s->admin, key) != NULL || key_find_bin(&s->authorized, key) != NULL;
    }
    return 0;
}

/* The peer's address as ZAP gives it, printable. */
static void peer_address(const zmq_msg_t *m, char *buf, size_t len)
{
    size_t n = zmq_msg_size((zmq_msg_t *)m), j = 0;
    const unsigned char *p = zmq_msg_data((zmq_msg_t *)m);
    for (size_t i = 0; i < n && j + 1 < len; i++)
        buf[j++] = p[i] >= 0x20 && p[i] < 0x7f ? (char)p[i] : '?';
    buf[j] = '\0';
    if (j == 0)
        snprintf(buf, len, "an unknown address");
}

static void log_refusal(ifd_security *s, int role, const char *fp, const char *addr,
                        const char *why)
{
    __atomic_fetch_add(&s->refused[role], 1, __ATOMIC_RELAXED);
    refusal_log *l = &s->log[role];
    int64_t now = ifd_clock_ns();
    if (l->last_ns && now - l->last_ns < LOG_INTERVAL_NS) {
        l->suppressed++;
        return;
    }
    char more[64] = "";
    if (l->suppressed)
        snprintf(more, sizeof more, " (%" PRIu64 " more suppressed)", l->suppressed);
    IFD_LOG_INFO("%s socket: refused a CURVE peer from %s with key %s: %s%s", role_names[role],
                 addr, fp, why, more);
    l->last_ns = now;
    l->suppressed = 0;
}

/* Refusals suppressed a second or more ago: one line for them. */
static void flush_refusals(ifd_security *s, int force)
{
    int64_t now = ifd_clock_ns();
    for (int r = 0; r < IFD_SOCK_ROLES; r++) {
        refusal_log *l = &s->log[r];
        if (l->suppressed && (force || now - l->last_ns >= LOG_INTERVAL_NS)) {
            IFD_LOG_INFO("%s socket: refused %" PRIu64 " more CURVE peer%s (suppressed)",
                         role_names[r], l->suppressed, l->suppressed == 1 ? "" : "s");
            l->suppressed = 0;
            l->last_ns = now;
        }
    }
}

#define ZAP_MAX_FRAMES 8

/* One request (RFC 27: version, request id, domain, address, identity, mechanism,
 * credentials...) and its reply (version, request id, status code, status text, user id,
 * metadata). */
static void zap_serve(ifd_security *s)
{
    zmq_msg_t f[ZAP_MAX_FRAMES];
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s->zap, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            if (n == 0)
                return;
            break; /* a multipart message arrives whole; not reached */
        }
        more = zmq_msg_more(&m);
        if (n < ZAP_MAX_FRAMES)
            f[n++] = m;
        else
            zmq_msg_close(&m);
    }
    const char *status = "400", *text = "not allowed";
    char user[IFD_KEY_Z85_LEN + 1] = "";
    int role = n >= 6 ? role_of_domain(&f[2]) : -1;
    if (n < 6 || zmq_msg_size(&f[0]) != 3 || memcmp(zmq_msg_data(&f[0]), "1.0", 3) != 0) {
        status = "500";
        text = "malformed ZAP request";
        IFD_LOG_WARN("ZAP handler: a malformed request (%d frames)", n);
    } else if (role < 0) {
        text = "unknown ZAP domain";
        IFD_LOG_WARN("ZAP handler: a request for an unknown domain '%.*s'",
                     (int)(zmq_msg_size(&f[2]) < 64 ? zmq_msg_size(&f[2]) : 64),
                     (const char *)zmq_msg_data(&f[2]));
    } else {
        char addr[72], fp[16] = "(none)";
        peer_address(&f[3], addr, sizeof addr);
        int curve = zmq_msg_size(&f[5]) == 5 && memcmp(zmq_msg_data(&f[5]), "CURVE", 5) == 0;
        if (!curve || n != 7 || zmq_msg_size(&f[6]) != IFD_KEY_BIN_LEN) {
            log_refusal(s, role, fp, addr, "not a CURVE handshake");
        } else {
            const uint8_t *key = zmq_msg_data(&f[6]);
            zmq_z85_encode(user, key, IFD_KEY_BIN_LEN);
            snprintf(fp, sizeof fp, "%.8s", user);
            if (allowed(s, role, key)) {
                status = "200";
                text = "OK";
                IFD_LOG_DEBUG("%s socket: accepted a CURVE peer from %s with key %s",
                              role_names[role], addr, fp);
            } else {
                char why[96];
                snprintf(why, sizeof why, "not in %s", role_wants[role]);
                log_refusal(s, role, fp, addr, why);
                user[0] = '\0';
            }
        }
    }
    const char *reply[6] = {"1.0", NULL, status, text, user, ""};
    for (int i = 0; i < 6; i++) {
        int flags = i < 5 ? ZMQ_SNDMORE : 0;
        if (i == 1) {
            if (n >= 2)
                zmq_send(s->zap, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), flags);
            else
                zmq_send(s->zap, "", 0, flags);
        } else {
            zmq_send(s->zap, reply[i], strlen(reply[i]), flags);
        }
    }
    for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
}

static void *zap_main(void *arg)
{
    ifd_security *s = arg;
    zmq_pollitem_t items[2] = {{s->zap, 0, ZMQ_POLLIN, 0}, {NULL, s->wake[0], ZMQ_POLLIN, 0}};
    for (;;) {
        int rc = zmq_poll(items, 2, 1000);
        if (rc < 0) {
            if (zmq_errno() == EINTR)
                continue;
            IFD_LOG_ERROR("ZAP handler: zmq_poll: %s; every CURVE peer is refused from now on",
                          zmq_strerror(zmq_errno()));
            break;
        }
        if (items[1].revents & ZMQ_POLLIN)
            break;
        if (items[0].revents & ZMQ_POLLIN)
            zap_serve(s);
        flush_refusals(s, 0);
    }
    flush_refusals(s, 1);
    return NULL;
}

int ifd_security_start(ifd_security *s, void *zctx, ifd_error *err)
{
    if (s == NULL)
        return IFD_OK;
    if (pipe2(s->wake, O_CLOEXEC) != 0) {
        s->wake[0] = s->wake[1] = -1;
        return ifd_error_set(err, IFD_EIO, "ZAP handler: pipe: %s", strerror(errno));
    }
    int rc;
    s->zap = zmq_socket(zctx, ZMQ_REP);
    if (s->zap == NULL) {
        rc = ifd_error_set(err, IFD_EIO, "ZAP handler: zmq_socket: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    int zero = 0;
    zmq_setsockopt(s->zap, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(s->zap, ZAP_ENDPOINT) != 0) {
        rc = ifd_error_set(err, IFD_EIO, "ZAP handler: binding %s: %s", ZAP_ENDPOINT,
                           zmq_strerror(zmq_errno()));
        goto fail;
    }
    /* The socket moves to the handler thread (thread creation is a full barrier). */
    rc = ifd_thread_start(&s->thread, "ifd-zap", zap_main, s);
    if (rc) {
        ifd_error_set(err, rc, "ZAP handler: starting its thread");
        goto fail;
    }
    s->started = 1;
    return IFD_OK;
fail:
    if (s->zap)
        zmq_close(s->zap);
    s->zap = NULL;
    close(s->wake[0]);
    close(s->wake[1]);
    s->wake[0] = s->wake[1] = -1;
    return rc;
}

void ifd_security_stop(ifd_security *s)
{
    if (s == NULL || !s->started)
        return;
    char b = 1;
    while (write(s->wake[1], &b, 1) < 0 && errno == EINTR)
        ;
    ifd_thread_join(&s->thread);
    s->started = 0;
    zmq_close(s->zap);
    s->zap = NULL;
    close(s->wake[0]);
    close(s->wake[1]);
    s->wake[0] = s->wake[1] = -1;
}

void ifd_security_destroy(ifd_security *s)
{
    if (s == NULL)
        return;
    ifd_security_stop(s);
    key_list_fini(&s->authorized);
    key_list_fini(&s->admin);
    memset(s->secret, 0, sizeof s->secret);
    free(s);
}

int ifd_security_apply(ifd_security *s, void *zsock, ifd_sock_role role, ifd_error *err)
{
    if (s == NULL)
        return IFD_OK;
    int one = 1;
    const char *what = role_names[role];
    if (zmq_setsockopt(zsock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(zsock, ZMQ_CURVE_SECRETKEY, s->secret, sizeof s->secret) != 0 ||
        zmq_setsockopt(zsock, ZMQ_ZAP_DOMAIN, domains[role], strlen(domains[role])) != 0)
        return ifd_error_set(err, IFD_EIO, "%s socket: setting up CURVE: %s", what,
                             zmq_strerror(zmq_errno()));
    /* Best effort: refuse every peer should the handler be gone (it outlives the sockets
     * anyway). */
    zmq_setsockopt(zsock, ZMQ_ZAP_ENFORCE_DOMAIN, &one, sizeof one);
    return IFD_OK;
}

/* ---- names ------------------------------------------------------------------------------ */

static void list_names(const key_entry *e, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int j = 0; j < e->nnames && used + 1 < len; j++) {
        int w = snprintf(buf + used, len - used, "%s'%s'", j ? ", " : "", e->names[j]);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    if (used >= len && len > 4)
        memcpy(buf + len - 4, "...", 4);
}

int ifd_security_key_names(const ifd_security *s, const char *user_id)
{
    const key_entry *e = s && user_id ? key_find_z85(&s->authorized, user_id) : NULL;
    return e ? e->nnames : 0;
}

int ifd_security_name_allowed(const ifd_security *s, const char *user_id, const char *name,
                              char *why, size_t len)
{
    char sink[8];
    if (why == NULL) {
        why = sink;
        len = sizeof sink;
    }
    if (s == NULL)
        return 1;
    const key_entry *e = user_id ? key_find_z85(&s->authorized, user_id) : NULL;
    if (e == NULL) {
        snprintf(why, len, "HELLO: this connection's CURVE key %.8s... is not in authorized_keys",
                 user_id ? user_id : "(none)");
        return 0;
    }
    if (e->nnames) {
        for (int j = 0; name && j < e->nnames; j++)
            if (strcmp(e->names[j], name) == 0)
                return 1;
        char names[256];
        list_names(e, names, sizeof names);
        if (name)
            snprintf(why, len,
                     "HELLO: name: key %.8s... may use only the name%s %s (authorized_keys), "
                     "got '%s'",
                     e->z85, e->nnames == 1 ? "" : "s", names, name);
        else
            snprintf(why, len,
                     "HELLO: name: key %.8s... may use only the name%s %s (authorized_keys): "
                     "expected one of them, got no name",
                     e->z85, e->nnames == 1 ? "" : "s", names);
        return 0;
    }
    if (name == NULL)
        return 1;
    const key_entry *owner = name_owner(&s->authorized, name);
    if (owner && owner != e) {
        snprintf(why, len,
                 "HELLO: name: '%s' is bound to another key in authorized_keys (%.8s..., line "
                 "%d), not to this connection's key %.8s...",
                 name, owner->z85, owner->line, e->z85);
        return 0;
    }
    return 1;
}

const char *ifd_security_public_key(const ifd_security *s)
{
    return s ? s->pub : "";
}

int ifd_security_authorized_count(const ifd_security *s)
{
    return s ? s->authorized.n : 0;
}

int ifd_security_admin_count(const ifd_security *s)
{
    return s ? s->admin.n : 0;
}

uint64_t ifd_security_refused(const ifd_security *s, ifd_sock_role role)
{
    return s ? __atomic_load_n(&s->refused[role], __ATOMIC_RELAXED) : 0;
}
