#include "clients/c/connection.h"

#include "core/keyfile.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

int64_t ifdw_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t ifdw_deadline(int timeout_ms)
{
    if (timeout_ms < 0)
        return -1;
    return ifdw_now_ns() + (int64_t)timeout_ms * 1000000;
}

long ifdw_left_ms(int64_t deadline)
{
    if (deadline < 0)
        return -1;
    int64_t left = deadline - ifdw_now_ns();
    if (left <= 0)
        return 0;
    return (long)((left + 999999) / 1000000);
}

int ifdw_code_parse(const char *name)
{
    if (name == NULL)
        return -1;
#define IFDW_CODE_CASE_(code, s)                                                                   \
    if (strcmp(name, #code) == 0)                                                                  \
        return IFD_##code;
    IFD_ERRNO_MAP(IFDW_CODE_CASE_)
#undef IFDW_CODE_CASE_
    return -1;
}

int ifdw_zmq_error(ifd_error *err, const char *what)
{
    int e = errno;
    int code = e == ENOMEM ? IFD_ENOMEM : e == ETERM ? IFD_ECLOSED : IFD_EIO;
    return ifd_error_set(err, code, "%s: %s", what, zmq_strerror(e));
}

/* Which keys were given: exactly one form of the daemon's key, and of this client's pair. */
static int check_key_options(const ifd_client_options *o, const char *who, ifd_error *err)
{
    if ((o->server_key != NULL) == (o->server_key_file != NULL))
        return ifd_error_set(err, IFD_EINVAL,
                             "%s: server_key, server_key_file: expected exactly one (the daemon's "
                             "public key, or its .pub file), got %s",
                             who, o->server_key ? "both" : "neither");
    int pair = o->public_key || o->secret_key;
    if (pair == (o->key_file != NULL) || (pair && (!o->public_key || !o->secret_key)))
        return ifd_error_set(err, IFD_EINVAL,
                             "%s: key_file, public_key and secret_key: expected key_file alone or "
                             "public_key with secret_key (this client's key pair), got %s",
                             who,
                             pair && o->key_file ? "both"
                             : pair ? (o->public_key ? "no secret_key" : "no public_key")
                                    : "none");
    if (!zmq_has("curve"))
        return ifd_error_set(err, IFD_ENOTSUP,
                             "%s: CURVE keys were given, but this libzmq has no CURVE "
                             "(zmq_has(\"curve\") is false)",
                             who);
    return IFD_OK;
}

/* The daemon's public key, given or from its .pub file. */
static int server_key(const ifd_client_options *o, const char *who, char *server, ifd_error *err)
{
    if (o->server_key) {
        if (!ifd_key_z85_valid(o->server_key, strlen(o->server_key)))
            return ifd_error_set(err, IFD_EINVAL,
                                 "%s: server_key: expected a key of 40 Z85 characters, got %zu "
                                 "characters%s",
                                 who, strlen(o->server_key),
                                 strlen(o->server_key) == IFD_KEY_Z85_LEN ? " that are not Z85"
                                                                          : "");
        memcpy(server, o->server_key, IFD_KEY_Z85_LEN + 1);
        return IFD_OK;
    }
    char what[64];
    snprintf(what, sizeof what, "%s: server_key_file", who);
    return ifd_keyfile_load_public(o->server_key_file, what, server, err);
}

/* This client's key pair, from its key file or given (the public key must be the secret's). */
static int client_pair(const ifd_client_options *o, const char *who, char *pub, char *sec,
                       ifd_error *err)
{
    if (o->key_file) {
        char what[64];
        snprintf(what, sizeof what, "%s: key_file", who);
        return ifd_keyfile_load_pair(o->key_file, what, pub, sec, err);
    }
    const char *k[2] = {o->public_key, o->secret_key}, *names[2] = {"public_key", "secret_key"};
    for (int i = 0; i < 2; i++)
        if (!ifd_key_z85_valid(k[i], strlen(k[i])))
            return ifd_error_set(err, IFD_EINVAL,
                                 "%s: %s: expected a key of 40 Z85 characters, got %zu "
                                 "characters",
                                 who, names[i], strlen(k[i]));
    memcpy(pub, o->public_key, IFD_KEY_Z85_LEN + 1);
    memcpy(sec, o->secret_key, IFD_KEY_Z85_LEN + 1);
    char derived[IFD_KEY_Z85_LEN + 1];
    if (zmq_curve_public(derived, sec) != 0 || strcmp(derived, pub) != 0)
        return ifd_error_set(err, IFD_EINVAL,
                             "%s: public_key: expected the public key of secret_key "
                             "(%.8s...), got %.8s...",
                             who, derived, pub);
    return IFD_OK;
}

int ifdw_curve_apply(void *sock, const ifd_client_options *o, const char *who, ifd_error *err)
{
    if (o == NULL ||
        (!o->server_key && !o->server_key_file && !o->public_key && !o->secret_key && !o->key_file))
        return IFD_OK;
    char server[IFD_KEY_Z85_LEN + 1], pub[IFD_KEY_Z85_LEN + 1], sec[IFD_KEY_Z85_LEN + 1];
    int rc = check_key_options(o, who, err);
    if (rc == IFD_OK)
        rc = server_key(o, who, server, err);
    if (rc == IFD_OK)
        rc = client_pair(o, who, pub, sec, err);
    if (rc == IFD_OK && (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server, IFD_KEY_Z85_LEN) ||
                         zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, pub, IFD_KEY_Z85_LEN) ||
                         zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, sec, IFD_KEY_Z85_LEN)))
        rc = ifdw_zmq_error(err, who);
    memset(sec, 0, sizeof sec);
    return rc;
}

static int watch_monitor(ifdw_watch *w, void *ctx, void *sock, ifd_error *err);

int ifdw_watch_start(ifdw_watch *w, void *ctx, void *sock, const ifd_client_options *opts,
                     const char *who, const char *flag, ifd_error *err)
{
    memset(w, 0, sizeof *w);
    w->who = who;
    w->flag = flag;
    w->keys = "set server_key_file and key_file";
    w->curve = opts && (opts->server_key || opts->server_key_file);
    w->timeout_ms =
        opts && opts->connect_timeout_ms ? opts->connect_timeout_ms : IFD_CONNECT_TIMEOUT_MS;
    if (w->timeout_ms < 0)
        return IFD_OK;
    w->deadline = ifdw_deadline(w->timeout_ms);
    return watch_monitor(w, ctx, sock, err);
}

int ifdw_watch_rearm(ifdw_watch *w, void *ctx, void *sock, ifd_error *err)
{
    if (w->timeout_ms < 0)
        return IFD_OK;
    w->doubt = 1;
    w->refused = 0;
    return w->mon ? IFD_OK : watch_monitor(w, ctx, sock, err);
}

void ifdw_watch_confirm(ifdw_watch *w)
{
    if (w->doubt) {
        w->doubt = 0;
        ifdw_watch_stop(w);
    }
}

static int watch_monitor(ifdw_watch *w, void *ctx, void *sock, ifd_error *err)
{
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://ifd-client-monitor-%p", sock);
    if (zmq_socket_monitor(sock, ep,
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0)
        return ifdw_zmq_error(err, "zmq_socket_monitor");
    w->mon = zmq_socket(ctx, ZMQ_PAIR);
    if (w->mon == NULL || zmq_connect(w->mon, ep) != 0) {
        int rc = ifdw_zmq_error(err, "connecting the socket monitor");
        if (w->mon)
            zmq_close(w->mon);
        w->mon = NULL;
        zmq_socket_monitor(sock, NULL, 0);
        return rc;
    }
    int zero = 0;
    zmq_setsockopt(w->mon, ZMQ_LINGER, &zero, sizeof zero);
    w->sock = sock;
    return IFD_OK;
}

int ifdw_watch_poll(ifdw_watch *w)
{
    while (w->mon) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, w->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return 0;
        }
        /* frame 1: the event (uint16) and its value (uint32); frame 2: the endpoint */
        uint16_t event = 0;
        if (zmq_msg_size(&m) >= 2)
            memcpy(&event, zmq_msg_data(&m), 2);
        int more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        while (more) {
            zmq_msg_init(&m);
            more = zmq_msg_recv(&m, w->mon, 0) >= 0 && zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
        if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            if (!w->doubt)
                ifdw_watch_stop(w);
        } else
            w->refused = event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ? 1 : 2;
    }
    return 1;
}

void ifdw_watch_why(const ifdw_watch *w, const char *endpoint, char *buf, size_t len)
{
    if (w->refused == 1)
        snprintf(buf, len, ": it refused this client's CURVE key");
    else if (w->refused == 2 && w->curve)
        snprintf(buf, len,
                 ": the handshake failed (a CURVE setting that does not match the daemon's, or "
                 "not an infeedd socket)");
    else if (w->refused == 2)
        snprintf(buf, len,
                 ": the handshake failed: it may require CURVE (%s), or it is not an "
                 "infeedd socket",
                 w->keys);
    else
        snprintf(buf, len, "; is infeedd running with %s %.250s%s?", w->flag, endpoint,
                 w->curve ? ", or does it refuse this client's key (CURVE)" : "");
}

const char *ifdw_seconds(int ms, char *buf, size_t len)
{
    snprintf(buf, len, "%g s", (double)ms / 1000.0);
    return buf;
}

int ifdw_watch_check(ifdw_watch *w, const char *endpoint, long *wait_ms, ifd_error *err)
{
    if (ifdw_watch_poll(w))
        return IFD_OK;
    if (ifdw_left_ms(w->deadline) == 0) {
        char why[400], secs[32];
        ifdw_watch_why(w, endpoint, why, sizeof why);
        return ifd_error_set(err, IFD_ETIMEDOUT,
                             "%s: no daemon answered at %s within %s (connect_timeout_ms)%s",
                             w->who, endpoint, ifdw_seconds(w->timeout_ms, secs, sizeof secs), why);
    }
    if (*wait_ms < 0 || *wait_ms > 50)
        *wait_ms = 50;
    return IFD_OK;
}

void ifdw_watch_stop(ifdw_watch *w)
{
    if (w->mon == NULL)
        return;
    zmq_socket_monitor(w->sock, NULL, 0);
    zmq_close(w->mon);
    w->mon = NULL;
}
