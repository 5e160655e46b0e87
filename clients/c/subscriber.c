#include <infeed/client.h>

#include "clients/c/connection.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

struct ifd_subscriber {
    void *ctx;
    void *sock;
    ifdw_watch watch; /* the connect timeout, until the first handshake */
    char endpoint[256];
};

int ifd_subscriber_create(ifd_subscriber **out, const char *endpoint, ifd_error *err)
{
    return ifd_subscriber_create_opts(out, endpoint, NULL, err);
}

int ifd_subscriber_create_opts(ifd_subscriber **out, const char *endpoint,
                               const ifd_client_options *opts, ifd_error *err)
{
    *out = NULL;
    if (endpoint == NULL || endpoint[0] == '\0')
        return ifd_error_set(err, IFD_EINVAL, "subscriber: endpoint: expected a ZeroMQ endpoint");
    int rc;
    ifd_subscriber *s = calloc(1, sizeof *s);
    if (s == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "subscriber: out of memory");
    s->ctx = zmq_ctx_new();
    if (s->ctx == NULL) {
        rc = ifdw_zmq_error(err, "subscriber: zmq_ctx_new");
        goto fail_ctx;
    }
    s->sock = zmq_socket(s->ctx, ZMQ_SUB);
    if (s->sock == NULL) {
        rc = ifdw_zmq_error(err, "subscriber: zmq_socket");
        goto fail_sock;
    }
    int zero = 0;
    zmq_setsockopt(s->sock, ZMQ_LINGER, &zero, sizeof zero);
    /* the summaries, JSON objects; not the tensor messages ("tensor:NAME", docs/summaries.md) */
    if (zmq_setsockopt(s->sock, ZMQ_SUBSCRIBE, "{", 1) != 0) {
        rc = ifdw_zmq_error(err, "subscriber: ZMQ_SUBSCRIBE");
        goto fail_setup;
    }
    if ((rc = ifdw_curve_apply(s->sock, opts, "subscriber", err)) != IFD_OK)
        goto fail_setup;
    snprintf(s->endpoint, sizeof s->endpoint, "%s", endpoint);
    if ((rc = ifdw_watch_start(&s->watch, s->ctx, s->sock, opts, "subscriber", "--publish", err)) !=
        IFD_OK)
        goto fail_setup;
    if (zmq_connect(s->sock, endpoint) != 0) {
        rc = ifd_error_set(err, IFD_EINVAL, "subscriber: cannot connect to '%s': %s", endpoint,
                           zmq_strerror(errno));
        ifdw_watch_stop(&s->watch);
        goto fail_setup;
    }
    *out = s;
    return IFD_OK;

fail_setup:
    zmq_close(s->sock);
fail_sock:
    zmq_ctx_term(s->ctx);
fail_ctx:
    free(s);
    return rc;
}

void ifd_subscriber_destroy(ifd_subscriber *s)
{
    if (s == NULL)
        return;
    ifdw_watch_stop(&s->watch);
    zmq_close(s->sock);
    zmq_ctx_term(s->ctx);
    free(s);
}

int ifd_subscriber_recv(ifd_subscriber *s, char **json, int timeout_ms, ifd_error *err)
{
    *json = NULL;
    int64_t deadline = ifdw_deadline(timeout_ms);
    for (;;) {
        zmq_pollitem_t it = {s->sock, 0, ZMQ_POLLIN, 0};
        long wait = ifdw_left_ms(deadline);
        int rc = ifdw_watch_check(&s->watch, s->endpoint, &wait, err);
        if (rc)
            return rc;
        int r = zmq_poll(&it, 1, wait);
        if (r < 0 && errno != EINTR)
            return ifdw_zmq_error(err, "subscriber: zmq_poll");
        if (r > 0) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, s->sock, ZMQ_DONTWAIT) >= 0) {
                int multipart = zmq_msg_more(&m), more = multipart;
                size_t len = zmq_msg_size(&m);
                char *text = multipart ? NULL : malloc(len + 1);
                if (text) {
                    memcpy(text, zmq_msg_data(&m), len);
                    text[len] = '\0';
                }
                zmq_msg_close(&m);
                /* A summary is one frame: skip anything else whole. */
                while (more) {
                    zmq_msg_init(&m);
                    more = zmq_msg_recv(&m, s->sock, 0) >= 0 && zmq_msg_more(&m);
                    zmq_msg_close(&m);
                }
                if (text) {
                    *json = text;
                    return IFD_OK;
                }
                if (!multipart)
                    return ifd_error_set(err, IFD_ENOMEM, "subscriber: out of memory");
            } else {
                zmq_msg_close(&m);
                if (errno != EAGAIN && errno != EINTR)
                    return ifdw_zmq_error(err, "subscriber: receiving");
            }
        }
        if (ifdw_left_ms(deadline) == 0)
            return ifd_error_set(err, IFD_ETIMEDOUT, "subscriber: no summary within %d ms",
                                 timeout_ms);
    }
}
