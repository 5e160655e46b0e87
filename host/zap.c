/*
 * The ZAP handler (RFC 27): one thread answers libzmq's authentication requests for the CURVE
 * sockets, admitting a peer whose key is in the list its socket's role wants, and logs refusals
 * rate-limited. host/security.h has the contract.
 */
#include "host/security_state.h"

#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

/* ---- the ZAP handler -------------------------------------------------------------------- */

static int role_of_domain(const zmq_msg_t *m)
{
    for (int r = 0; r < IFD_SOCK_ROLES; r++)
        if (zmq_msg_size((zmq_msg_t *)m) == strlen(ifd_zap_domains[r]) &&
            memcmp(zmq_msg_data((zmq_msg_t *)m), ifd_zap_domains[r], strlen(ifd_zap_domains[r])) ==
                0)
            return r;
    return -1;
}

static int allowed(const ifd_security *s, int role, const uint8_t *key)
{
    switch (role) {
    case IFD_SOCK_INGEST:
        return ifd_keys_find_bin(&s->authorized, key) != NULL;
    case IFD_SOCK_CONTROL:
        return ifd_keys_find_bin(&s->admin, key) != NULL;
    case IFD_SOCK_PUBLISH:
        return ifd_keys_find_bin(&s->admin, key) != NULL ||
               ifd_keys_find_bin(&s->authorized, key) != NULL;
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
    IFD_LOG_INFO("%s socket: refused a CURVE peer from %s with key %s: %s%s", ifd_role_names[role],
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
                         ifd_role_names[r], l->suppressed, l->suppressed == 1 ? "" : "s");
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
                              ifd_role_names[role], addr, fp);
            } else {
                char why[96];
                snprintf(why, sizeof why, "not in %s", ifd_role_wants[role]);
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

int ifd_security_apply(ifd_security *s, void *zsock, ifd_sock_role role, ifd_error *err)
{
    if (s == NULL)
        return IFD_OK;
    int one = 1;
    const char *what = ifd_role_names[role];
    if (zmq_setsockopt(zsock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(zsock, ZMQ_CURVE_SECRETKEY, s->secret, sizeof s->secret) != 0 ||
        zmq_setsockopt(zsock, ZMQ_ZAP_DOMAIN, ifd_zap_domains[role],
                       strlen(ifd_zap_domains[role])) != 0)
        return ifd_error_set(err, IFD_EIO, "%s socket: setting up CURVE: %s", what,
                             zmq_strerror(zmq_errno()));
    /* Best effort: refuse every peer should the handler be gone (it outlives the sockets
     * anyway). */
    zmq_setsockopt(zsock, ZMQ_ZAP_ENFORCE_DOMAIN, &one, sizeof one);
    return IFD_OK;
}
