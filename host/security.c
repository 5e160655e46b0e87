#include "host/security.h"
#include "host/security_state.h"

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

const char *const ifd_zap_domains[IFD_SOCK_ROLES] = {"infeed-ingest", "infeed-publish",
                                                     "infeed-control"};
const char *const ifd_role_names[IFD_SOCK_ROLES] = {"ingest", "publish", "control"};
const char *const ifd_role_wants[IFD_SOCK_ROLES] = {"authorized_keys",
                                                    "admin_keys or authorized_keys", "admin_keys"};

const char *ifd_sock_role_name(ifd_sock_role role)
{
    return role >= 0 && role < IFD_SOCK_ROLES ? ifd_role_names[role] : "?";
}

/* ---- key lists -------------------------------------------------------------------------- */

static void key_list_fini(key_list *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->v[i].names);
    free(l->v);
    memset(l, 0, sizeof *l);
}

const key_entry *ifd_keys_find_bin(const key_list *l, const uint8_t *key)
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
    const key_entry *dup = ifd_keys_find_bin(l, e.key);
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
