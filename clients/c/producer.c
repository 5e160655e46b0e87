/*
 * The producer: one DEALER socket, driven only from the caller's thread. Replies (WELCOME, ACK,
 * CREDIT, ERROR, BYE) are read whenever a call waits (reply.c), and drained without waiting after
 * every send (send.c), so the credit count stays current. This file: create, destroy, HELLO and
 * the accessors.
 */
#include <infeed/client.h>

#include "clients/c/producer_impl.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

/* ---- lifecycle ---------------------------------------------------------------------------- */

int ifdp_alloc(ifd_producer **out, const char *endpoint, const char *name, ifd_error *err)
{
    *out = NULL;
    if (endpoint == NULL || endpoint[0] == '\0')
        return ifd_error_set(err, IFD_EINVAL, "producer: endpoint: expected a ZeroMQ endpoint");
    if (name && (name[0] == '\0' || strlen(name) > IFDP_NAME_MAX))
        return ifd_error_set(err, IFD_EINVAL, "producer: name: expected 1 to %d bytes, got %zu",
                             IFDP_NAME_MAX, strlen(name));
    ifd_producer *p = calloc(1, sizeof *p);
    if (p == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "producer: out of memory");
    if (name) {
        snprintf(p->name, sizeof p->name, "%s", name);
        p->has_name = 1;
    }
    snprintf(p->endpoint, sizeof p->endpoint, "%s", endpoint);
    const char *sep = strstr(endpoint, "://");
    snprintf(p->scheme, sizeof p->scheme, "%.*s", sep ? (int)(sep - endpoint) : 0, endpoint);
    p->acked_seq = -1;
    p->replica = -1;
    *out = p;
    return IFD_OK;
}

void ifdp_expect_hello(ifd_producer *p, int waiting)
{
    p->hello_waiting = waiting;
    p->hello_answered = 0;
    ifd_error_clear(&p->hello_err);
}

int ifdp_hello_answer(const ifd_producer *p, ifd_error *err)
{
    if (!p->hello_answered)
        return -1;
    if (p->hello_err.code)
        return ifd_error_set(err, p->hello_err.code, "%s", p->hello_err.msg);
    return IFD_OK;
}

int ifd_producer_create(ifd_producer **out, const char *endpoint, const char *name, ifd_error *err)
{
    return ifd_producer_create_opts(out, endpoint, name, NULL, err);
}

int ifd_producer_create_opts(ifd_producer **out, const char *endpoint, const char *name,
                             const ifd_client_options *opts, ifd_error *err)
{
    *out = NULL;
    ifd_producer *p;
    int rc = ifdp_alloc(&p, endpoint, name, err);
    if (rc)
        return rc;
    if (opts && (rc = ifd_producer_set_shm(p, opts->shm, err)))
        goto fail_ctx;
    p->ctx = zmq_ctx_new();
    if (p->ctx == NULL) {
        rc = ifdw_zmq_error(err, "producer: zmq_ctx_new");
        goto fail_ctx;
    }
    p->sock = zmq_socket(p->ctx, ZMQ_DEALER);
    if (p->sock == NULL) {
        rc = ifdw_zmq_error(err, "producer: zmq_socket");
        goto fail_sock;
    }
    int64_t maxmsg = IFDP_MAX_REPLY;
    int zero = 0;
    zmq_setsockopt(p->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(p->sock, ZMQ_LINGER, &zero, sizeof zero);
    if ((rc = ifdw_curve_apply(p->sock, opts, "producer", err)) != IFD_OK)
        goto fail_connect;
    if ((rc = ifdw_watch_start(&p->watch, p->ctx, p->sock, opts, "producer", "--listen", err)))
        goto fail_connect;
    if (zmq_connect(p->sock, endpoint) != 0) {
        rc = ifd_error_set(err, IFD_EINVAL, "producer: cannot connect to '%s': %s", endpoint,
                           zmq_strerror(errno));
        goto fail_watch;
    }
    *out = p;
    return IFD_OK;

fail_watch:
    ifdw_watch_stop(&p->watch);
fail_connect:
    zmq_close(p->sock);
fail_sock:
    zmq_ctx_term(p->ctx);
fail_ctx:
    free(p);
    return rc;
}

void ifd_producer_destroy(ifd_producer *p)
{
    if (p == NULL)
        return;
    /* Give a sent END a moment to leave; otherwise nothing is worth waiting for. */
    int linger = p->end_sent && p->bye_json == NULL ? 1000 : 0;
    ifdw_watch_stop(&p->watch);
    if (p->sock) {
        zmq_setsockopt(p->sock, ZMQ_LINGER, &linger, sizeof linger);
        zmq_close(p->sock);
    }
    if (p->ctx)
        zmq_ctx_term(p->ctx);
    ifdp_shm_drop(p);
    for (int i = 0; i < IFD_MAX_INPUTS; i++)
        free(p->scratch[i]);
    free(p->welcome_json);
    free(p->bye_json);
    free(p->errs);
    free(p);
}

/* ---- HELLO -------------------------------------------------------------------------------- */

static char *hello_json(ifd_producer *p, const ifd_input_spec *schema, int n, int64_t first_seq,
                        int shm, ifd_error *err)
{
    json_t *arr = json_array();
    json_t *o = json_object();
    char *text = NULL;
    if (arr == NULL || o == NULL)
        goto oom;
    for (int i = 0; i < n; i++) {
        const ifd_input_spec *s = &schema[i];
        if (s->name[0] == '\0' || memchr(s->name, '\0', sizeof s->name) == NULL) {
            ifd_error_set(err, IFD_EINVAL, "hello: schema[%d]: name is empty or unterminated", i);
            goto out;
        }
        const char *dt = NULL;
        size_t esize = 0;
#define IFDP_DTYPE_CASE_(e, str, size)                                                             \
    if (s->dtype == IFD_##e) {                                                                     \
        dt = str;                                                                                  \
        esize = size;                                                                              \
    }
        IFD_DTYPE_MAP(IFDP_DTYPE_CASE_)
#undef IFDP_DTYPE_CASE_
        if (dt == NULL) {
            ifd_error_set(err, IFD_EDTYPE, "hello: schema[%d] '%s': unknown dtype %d", i, s->name,
                          (int)s->dtype);
            goto out;
        }
        if (s->rank < 0 || s->rank > IFD_MAX_RANK) {
            ifd_error_set(err, IFD_EINVAL, "hello: schema[%d] '%s': rank %d is not in [0, %d]", i,
                          s->name, s->rank, IFD_MAX_RANK);
            goto out;
        }
        json_t *shape = json_array();
        if (shape == NULL)
            goto oom;
        p->row_bytes[i] = esize;
        for (int d = 0; d < s->rank; d++) {
            json_array_append_new(shape, json_integer(s->dims[d]));
            p->row_bytes[i] *= s->dims[d] > 0 ? (size_t)s->dims[d] : 0;
        }
        if (json_array_append_new(
                arr, json_pack("{s:s, s:s, s:o}", "name", s->name, "dtype", dt, "shape", shape)))
            goto oom;
    }
    if (p->has_name && json_object_set_new(o, "name", json_string(p->name)))
        goto oom;
    if (json_object_set(o, "schema", arr) ||
        json_object_set_new(o, "first_seq", json_integer(first_seq)))
        goto oom;
    if (p->replica >= 0 && json_object_set_new(o, "replica", json_integer(p->replica)))
        goto oom;
    if (shm && json_object_set_new(o, "shm", json_true()))
        goto oom;
    if (p->eval && json_object_set_new(o, "role", json_string("eval")))
        goto oom;
    text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (text == NULL)
        goto oom;
    if (strlen(text) > IFD_PROTO_HELLO_JSON_MAX) {
        ifd_error_set(err, IFD_EINVAL, "hello: the HELLO JSON is %zu bytes, at most %d allowed",
                      strlen(text), IFD_PROTO_HELLO_JSON_MAX);
        free(text);
        text = NULL;
    }
    goto out;
oom:
    ifd_error_set(err, IFD_ENOMEM, "hello: out of memory");
out:
    json_decref(arr);
    json_decref(o);
    return text;
}

void ifd_producer_on_prediction(ifd_producer *p, ifd_prediction_fn fn, void *arg)
{
    p->pred_fn = fn;
    p->pred_arg = arg;
}

int64_t ifd_producer_predictions(const ifd_producer *p)
{
    return p->predictions;
}

int ifd_producer_set_replica(ifd_producer *p, int replica, ifd_error *err)
{
    if (replica < -1)
        return ifd_error_set(
            err, IFD_EINVAL,
            "producer: replica: expected -1 (none) or a replica index >= 0, got %d", replica);
    p->replica = replica;
    return IFD_OK;
}

int ifd_producer_set_role(ifd_producer *p, const char *role, ifd_error *err)
{
    if (role == NULL || (strcmp(role, "train") != 0 && strcmp(role, "eval") != 0))
        return ifd_error_set(err, IFD_EINVAL,
                             "producer: role: expected \"train\" or \"eval\", got %s%s%s",
                             role ? "'" : "", role ? role : "NULL", role ? "'" : "");
    p->eval = strcmp(role, "eval") == 0;
    return IFD_OK;
}

/* Sends one HELLO (asking for a pool when shm) and waits for its answer until deadline. */
static int hello_once(ifd_producer *p, const ifd_input_spec *schema, int n, int64_t first_seq,
                      int shm, int64_t deadline, int timeout_ms, ifd_error *err)
{
    char *text = hello_json(p, schema, n, first_seq, shm, err);
    if (text == NULL)
        return err->code;

    int rc = IFD_OK;
    unsigned char h[IFD_PROTO_HDR];
    ifd_proto_header(h, IFD_MSG_HELLO);
    if (zmq_send(p->sock, h, sizeof h, ZMQ_SNDMORE) < 0 ||
        zmq_send(p->sock, text, strlen(text), 0) < 0) {
        rc = ifdw_zmq_error(err, "hello: sending HELLO");
        goto out;
    }
    /* Errors of the previous stream are stale now. */
    p->errs_len = 0;
    memset(&p->shm_desc, 0, sizeof p->shm_desc);
    p->shm_refused_msg[0] = '\0';
    p->hello_waiting = 1;
    p->hello_answered = 0;
    while (!p->hello_answered && p->bye_json == NULL) {
        /* the connect timeout first: when it ends with hello's own (the same bound), the
         * sentence says that no daemon answered, not that no WELCOME came */
        long left = ifdw_left_ms(deadline);
        if ((rc = ifdw_watch_check(&p->watch, p->endpoint, &left, err)) != IFD_OK)
            goto out_waiting;
        if (left == 0) {
            rc = ifd_error_set(err, IFD_ETIMEDOUT, "hello: no WELCOME from %s within %d ms%s",
                               p->endpoint, timeout_ms,
                               ifdw_watch_poll(&p->watch) ? ""
                                                          : " (no daemon has answered there yet)");
            goto out_waiting;
        }
        rc = ifdp_recv_one(p, left, err);
        if (rc == IFD_ETIMEDOUT)
            rc = IFD_OK;
        else if (rc)
            goto out_waiting;
    }
    ifdw_watch_poll(&p->watch);
    if (!p->hello_answered)
        rc = ifd_error_set(err, IFD_ECLOSED, "hello: %s", p->bye_text);
    else if (p->hello_err.code)
        rc = ifd_error_set(err, p->hello_err.code, "%s", p->hello_err.msg);
    else
        p->ntensors = n;
out_waiting:
    p->hello_waiting = 0;
out:
    free(text);
    return rc;
}

/* The pool after a WELCOME to a HELLO that asked for one: mapped, or (auto) the stream goes on
 * with BATCH, after a HELLO without shm when the daemon made a pool this producer cannot use, so
 * that the daemon drops it. */
static int hello_shm(ifd_producer *p, const ifd_input_spec *schema, int n, int64_t first_seq,
                     int64_t deadline, int timeout_ms, ifd_error *err)
{
    int rc = ifdp_shm_attach(p, err);
    if (rc == IFD_OK)
        return IFD_OK;
    snprintf(p->shm_why, sizeof p->shm_why, "%s", err->msg);
    if (p->shm_mode == IFD_SHM_ON) {
        p->welcomed = 0;
        return ifd_error_set(err, rc, "hello: shm on: %s", p->shm_why);
    }
    if (!p->shm_desc.given)
        return IFD_OK;
    return hello_once(p, schema, n, first_seq, 0, deadline, timeout_ms, err);
}

int ifd_producer_hello(ifd_producer *p, const ifd_input_spec *schema, int n, int64_t first_seq,
                       int timeout_ms, ifd_error *err)
{
    if (n < 1 || n > IFD_MAX_INPUTS || schema == NULL)
        return ifd_error_set(err, IFD_EINVAL, "hello: expected 1 to %d schema tensors, got %d",
                             IFD_MAX_INPUTS, n);
    if (first_seq < 0)
        return ifd_error_set(err, IFD_EINVAL, "hello: first_seq: expected >= 0, got %lld",
                             (long long)first_seq);
    if (p->bye_json)
        return ifd_error_set(err, IFD_ECLOSED, "hello: %s", p->bye_text);
    ifd_error e;
    ifd_error_clear(&e);
    ifdp_shm_drop(p); /* a new WELCOME brings a new pool, or none */
    p->shm_why[0] = '\0';
    int shm = ifdp_shm_wanted(p);
    int64_t deadline = ifdw_deadline(timeout_ms);
    int rc = hello_once(p, schema, n, first_seq, shm, deadline, timeout_ms, &e);
    if (shm && rc == IFD_EINVAL && p->shm_mode == IFD_SHM_AUTO && strstr(e.msg, "'shm'")) {
        /* A daemon older than the shared-memory transport: HELLO's key is unknown to it. */
        snprintf(p->shm_why, sizeof p->shm_why, "the daemon does not know HELLO's shm: %.400s",
                 e.msg);
        rc = hello_once(p, schema, n, first_seq, 0, deadline, timeout_ms, &e);
    } else if (shm && rc == IFD_OK)
        rc = hello_shm(p, schema, n, first_seq, deadline, timeout_ms, &e);
    return rc ? ifd_error_set(err, rc, "%s", e.msg) : IFD_OK;
}

/* ---- accessors ---------------------------------------------------------------------------- */

int64_t ifd_producer_batch_size(const ifd_producer *p)
{
    return p->batch_size;
}

int64_t ifd_producer_credit(const ifd_producer *p)
{
    return p->window;
}

int ifd_producer_replicas(const ifd_producer *p)
{
    return p->replicas;
}

const char *ifd_producer_mode(const ifd_producer *p)
{
    return p->welcomed ? p->mode : NULL;
}

const char *ifd_producer_welcome(const ifd_producer *p)
{
    return p->welcome_json;
}

int64_t ifd_producer_next_seq(const ifd_producer *p)
{
    return p->next_seq;
}

int64_t ifd_producer_acked_seq(const ifd_producer *p)
{
    return p->acked_seq;
}

int64_t ifd_producer_in_flight(const ifd_producer *p)
{
    return p->in_flight;
}

int64_t ifd_producer_available(const ifd_producer *p)
{
    return p->available > 0 ? p->available : 0;
}

int64_t ifd_producer_sent(const ifd_producer *p)
{
    return p->sent;
}

int64_t ifd_producer_acked(const ifd_producer *p)
{
    return p->acked;
}

int64_t ifd_producer_rejected(const ifd_producer *p)
{
    return p->rejected;
}
