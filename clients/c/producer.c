/*
 * The producer: one DEALER socket, driven only from the caller's thread. Replies (WELCOME, ACK,
 * CREDIT, ERROR, BYE) are read whenever a call waits, and drained without waiting after every
 * send, so the credit count stays current. ERROR replies are queued and each is returned once.
 */
#include "infeed/client.h"

#include "clients/c/producer_internal.h"
#include "clients/c/wire.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define IFDP_NAME_MAX 63
#define IFDP_MAX_FRAMES 8
/* Daemon messages are small; a larger frame means a wrong peer. */
#define IFDP_MAX_REPLY (1 << 20)

struct ifd_producer {
    void *ctx;
    void *sock;
    ifdw_watch watch; /* the connect timeout, until the first handshake */
    char name[IFDP_NAME_MAX + 1];
    int has_name;
    char endpoint[256];

    /* The last WELCOME. */
    int welcomed;
    char *welcome_json;
    int64_t batch_size;
    int64_t max_steps; /* WELCOME's max_steps_per_message */
    int64_t window;
    int replicas;
    int replica; /* sent in HELLO when >= 0 (per-core input) */
    char mode[32];
    int ntensors;

    /* Flow control since the WELCOME. */
    int64_t next_seq;
    int64_t available;
    int64_t in_flight;
    int64_t sent;
    int64_t acked;
    int64_t rejected;
    int64_t acked_seq;
    int end_sent;

    /* predict mode: called for each PREDICTION */
    ifd_prediction_fn pred_fn;
    void *pred_arg;
    int64_t predictions;

    /* The BYE, once it came. */
    char *bye_json;
    int bye_ok;
    char bye_text[IFD_ERROR_MSG_MAX];

    /* ERROR replies not returned yet: a FIFO. */
    ifd_error *errs;
    int errs_head, errs_len, errs_cap;

    /* While hello waits: its answer. */
    int hello_waiting;
    int hello_answered;
    ifd_error hello_err;
};

/* ---- replies ------------------------------------------------------------------------------ */

static int push_error(ifd_producer *p, int code, const char *msg)
{
    if (p->errs_len == p->errs_cap) {
        int cap = p->errs_cap ? p->errs_cap * 2 : 8;
        ifd_error *e = malloc((size_t)cap * sizeof *e);
        if (e == NULL)
            return IFD_ENOMEM;
        for (int i = 0; i < p->errs_len; i++)
            e[i] = p->errs[(p->errs_head + i) % p->errs_cap];
        free(p->errs);
        p->errs = e;
        p->errs_cap = cap;
        p->errs_head = 0;
    }
    ifd_error *slot = &p->errs[(p->errs_head + p->errs_len) % p->errs_cap];
    ifd_error_set(slot, code, "%s", msg);
    p->errs_len++;
    return IFD_OK;
}

/* Returns the oldest queued ERROR into err, or IFD_OK when none is queued. */
static int pop_error(ifd_producer *p, ifd_error *err)
{
    if (p->errs_len == 0)
        return IFD_OK;
    ifd_error *e = &p->errs[p->errs_head];
    p->errs_head = (p->errs_head + 1) % p->errs_cap;
    p->errs_len--;
    return ifd_error_set(err, e->code, "%s", e->msg);
}

/* Credit returned or granted by the daemon (n >= 0). Saturates: a daemon's numbers must not
 * overflow the count. */
static void add_credit(ifd_producer *p, int64_t n)
{
    p->available = n > INT64_MAX - p->available ? INT64_MAX : p->available + n;
}

static json_t *parse_json_frame(const ifd_frame *m)
{
    return json_loadb(m->data, m->size, JSON_REJECT_DUPLICATES, NULL);
}

static int64_t json_int_or(json_t *o, const char *key, int64_t dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : dflt;
}

static const char *json_str_or(json_t *o, const char *key, const char *dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : dflt;
}

static void on_welcome(ifd_producer *p, const ifd_frame *frames, int n)
{
    if (!p->hello_waiting || p->hello_answered)
        return; /* a stale or unasked WELCOME */
    p->hello_answered = 1;
    ifd_error_clear(&p->hello_err);
    json_t *o = n == 2 ? parse_json_frame(&frames[1]) : NULL;
    if (!json_is_object(o)) {
        ifd_error_set(&p->hello_err, IFD_EPROTO, "WELCOME from %s: frame 1 is not a JSON object",
                      p->endpoint);
        goto out;
    }
    int64_t proto = json_int_or(o, "protocol", IFD_PROTOCOL_VERSION);
    int64_t credit = json_int_or(o, "credit", -1);
    int64_t next_seq = json_int_or(o, "next_seq", -1);
    int64_t batch_size = json_int_or(o, "batch_size", -1);
    if (proto != IFD_PROTOCOL_VERSION) {
        ifd_error_set(&p->hello_err, IFD_EPROTO, "WELCOME: protocol: expected %d, got %lld",
                      IFD_PROTOCOL_VERSION, (long long)proto);
        goto out;
    }
    if (credit < 0 || next_seq < 0 || batch_size < 0) {
        ifd_error_set(&p->hello_err, IFD_EPROTO,
                      "WELCOME: '%s' is missing or not a non-negative integer",
                      credit < 0     ? "credit"
                      : next_seq < 0 ? "next_seq"
                                     : "batch_size");
        goto out;
    }
    char *text = malloc(frames[1].size + 1);
    if (text == NULL) {
        ifd_error_set(&p->hello_err, IFD_ENOMEM, "WELCOME: out of memory");
        goto out;
    }
    memcpy(text, frames[1].data, frames[1].size);
    text[frames[1].size] = '\0';
    free(p->welcome_json);
    p->welcome_json = text;
    p->welcomed = 1;
    p->window = credit;
    p->available = credit;
    p->next_seq = next_seq;
    p->batch_size = batch_size;
    p->max_steps = json_int_or(o, "max_steps_per_message", 1);
    p->replicas = (int)json_int_or(o, "replicas", 0);
    snprintf(p->mode, sizeof p->mode, "%s", json_str_or(o, "mode", ""));
    p->in_flight = 0;
    p->sent = 0;
    p->acked = 0;
    p->rejected = 0;
    p->acked_seq = -1;
    p->end_sent = 0;
out:
    json_decref(o);
}

static void on_error(ifd_producer *p, const ifd_frame *frames, int n)
{
    json_t *o = n == 2 ? parse_json_frame(&frames[1]) : NULL;
    if (!json_is_object(o)) {
        json_decref(o);
        push_error(p, IFD_EPROTO, "ERROR reply: frame 1 is not a JSON object");
        return;
    }
    const char *name = json_str_or(o, "code", "");
    const char *msg = json_str_or(o, "message", "");
    json_t *seq = json_object_get(o, "seq");
    int64_t credit = json_int_or(o, "credit", 0);
    int code = ifdw_code_parse(name);
    char text[IFD_ERROR_MSG_MAX];
    if (code <= 0)
        snprintf(text, sizeof text, "%s (unknown error code '%s')", msg, name);
    else
        snprintf(text, sizeof text, "%s", msg[0] ? msg : ifd_strerror(code));
    if (code <= 0)
        code = IFD_EPROTO;

    if (p->hello_waiting && !p->hello_answered && !json_is_integer(seq)) {
        /* The answer to HELLO (a batch's rejection names its seq). */
        p->hello_answered = 1;
        ifd_error_set(&p->hello_err, code, "%s", text);
    } else if (!p->hello_waiting) {
        if (json_is_integer(seq) && p->in_flight > 0) {
            /* a refused batch of k steps returns its k credits */
            int64_t k = credit > 1 ? credit : 1;
            p->in_flight -= k < p->in_flight ? k : p->in_flight;
            p->rejected++;
        }
        if (credit > 0)
            add_credit(p, credit);
        push_error(p, code, text);
    }
    json_decref(o);
}

static void on_bye(ifd_producer *p, const ifd_frame *frames, int n)
{
    if (p->bye_json)
        return;
    size_t len = n == 2 ? frames[1].size : 0;
    char *text = malloc(len + 1);
    if (text == NULL)
        return;
    if (len)
        memcpy(text, frames[1].data, len);
    text[len] = '\0';
    p->bye_json = text;
    json_t *o = json_loads(text, 0, NULL);
    const char *status = json_str_or(o, "status", "?");
    const char *reason = json_str_or(o, "reason", "?");
    const char *msg = json_str_or(o, "message", "");
    p->bye_ok = strcmp(status, "ok") == 0;
    snprintf(p->bye_text, sizeof p->bye_text, "the daemon ended the run: status %s, reason %s%s%s",
             status, reason, msg[0] ? ": " : "", msg);
    json_decref(o);
}

/* PREDICTION: the BATCH header layout, a JSON array of {name, dtype, shape}, one raw frame per
 * tensor. Each frame is copied to aligned memory for the callback's views. A description that
 * does not fit the frames (or whose rows x shape x dtype size overflows) queues an EPROTO error
 * naming the tensor, and the callback is not called. */
static void on_prediction(ifd_producer *p, const ifd_frame *frames, int n)
{
    if (frames[0].size < IFD_PROTO_BATCH_HDR || n < 2) {
        push_error(p, IFD_EPROTO, "PREDICTION: expected a 32-byte header and a JSON frame");
        return;
    }
    ifd_proto_batch h;
    ifd_proto_parse_batch(frames[0].data, &h);
    json_t *desc = json_loadb(frames[1].data, frames[1].size, 0, NULL);
    const char *names[IFD_MAX_INPUTS];
    ifd_tensor t[IFD_MAX_INPUTS];
    void *copies[IFD_MAX_INPUTS] = {0};
    char why[256] = "";
    int nt = 0;
    if (h.ntensors < 1 || h.ntensors > IFD_MAX_INPUTS || n != 2 + (int)h.ntensors)
        snprintf(why, sizeof why,
                 "ntensors: expected 1 to %d, one a frame after the JSON frame, "
                 "got %u with %d frames after it",
                 IFD_MAX_INPUTS, h.ntensors, n - 2);
    else if (h.rows < 0)
        snprintf(why, sizeof why, "rows: expected >= 0, got %lld", (long long)h.rows);
    else if (!json_is_array(desc) || json_array_size(desc) != h.ntensors)
        snprintf(why, sizeof why, "frame 1: expected a JSON array of %u tensors", h.ntensors);
    else
        nt = (int)h.ntensors;
    for (int i = 0; i < nt && why[0] == '\0'; i++) {
        json_t *e = json_array_get(desc, (size_t)i), *shape = json_object_get(e, "shape");
        const char *dt = json_string_value(json_object_get(e, "dtype"));
        names[i] = json_string_value(json_object_get(e, "name"));
        size_t esize = 0;
        t[i].dtype = IFD_DTYPE_MAX;
#define IFDP_PARSE_CASE_(e, str, size)                                                             \
    if (dt && strcmp(dt, str) == 0) {                                                              \
        t[i].dtype = IFD_##e;                                                                      \
        esize = size;                                                                              \
    }
        IFD_DTYPE_MAP(IFDP_PARSE_CASE_)
#undef IFDP_PARSE_CASE_
        if (names[i] == NULL || esize == 0 || !json_is_array(shape) ||
            json_array_size(shape) >= IFD_MAX_RANK) {
            snprintf(why, sizeof why,
                     "tensor %d: expected a name, a known dtype and a shape of rank below %d", i,
                     IFD_MAX_RANK);
            break;
        }
        t[i].shape.rank = 1 + (int)json_array_size(shape);
        t[i].shape.dims[0] = h.rows;
        size_t bytes = esize;
        int overflow = __builtin_mul_overflow(bytes, (uint64_t)h.rows, &bytes);
        for (int d = 1; d < t[i].shape.rank; d++) {
            json_t *v = json_array_get(shape, (size_t)d - 1);
            if (!json_is_integer(v) || json_integer_value(v) < 0) {
                snprintf(why, sizeof why, "tensor %d '%.64s': shape: expected integers >= 0", i,
                         names[i]);
                break;
            }
            t[i].shape.dims[d] = json_integer_value(v);
            overflow |= __builtin_mul_overflow(bytes, (uint64_t)t[i].shape.dims[d], &bytes);
        }
        if (why[0])
            break;
        if (overflow) {
            snprintf(why, sizeof why,
                     "tensor %d '%.64s': %lld rows of its shape: expected a size that fits in "
                     "memory, got one that overflows (the frame has %zu bytes)",
                     i, names[i], (long long)h.rows, frames[2 + i].size);
            break;
        }
        if (frames[2 + i].size != bytes) {
            snprintf(why, sizeof why,
                     "tensor %d '%.64s': expected %zu bytes (%lld rows of its shape), got a frame "
                     "of %zu",
                     i, names[i], bytes, (long long)h.rows, frames[2 + i].size);
            break;
        }
        copies[i] = malloc(bytes ? bytes : 1);
        if (copies[i] == NULL) {
            snprintf(why, sizeof why, "tensor %d: out of memory for %zu bytes", i, bytes);
            break;
        }
        memcpy(copies[i], frames[2 + i].data, bytes);
        t[i].data = copies[i];
    }
    if (why[0] == '\0') {
        p->predictions++;
        if (p->pred_fn)
            p->pred_fn(p->pred_arg, h.seq, h.rows, nt, names, t);
    } else {
        char msg[IFD_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "PREDICTION for batch %lld: %s", (long long)h.seq, why);
        push_error(p, IFD_EPROTO, msg);
    }
    for (int i = 0; i < nt; i++)
        free(copies[i]);
    json_decref(desc);
}

void ifdp_on_reply(ifd_producer *p, const ifd_frame *frames, int n)
{
    size_t hl = frames[0].size;
    const unsigned char *h = frames[0].data;
    if (hl < IFD_PROTO_HDR || memcmp(h, IFD_PROTO_MAGIC, 4) != 0 ||
        ifd_get_u16(h + 4) != IFD_PROTO_VERSION) {
        push_error(p, IFD_EPROTO, "reply from the daemon: a header that is not protocol 1");
        return;
    }
    int type = ifd_get_u16(h + 6);
    if (type == IFD_MSG_PREDICTION) {
        on_prediction(p, frames, n);
        return;
    }
    switch (type) {
    case IFD_MSG_WELCOME:
        on_welcome(p, frames, n);
        break;
    case IFD_MSG_ERROR:
        on_error(p, frames, n);
        break;
    case IFD_MSG_BYE:
        on_bye(p, frames, n);
        break;
    case IFD_MSG_ACK:
        if (hl < IFD_PROTO_ACK_HDR || p->hello_waiting)
            break;
        /* Cumulative: the n oldest batches in flight, up to seq, were consumed. */
        int64_t seq = (int64_t)ifd_get_u64(h + 8);
        uint32_t n = ifd_get_u32(h + 16);
        if (seq > p->acked_seq)
            p->acked_seq = seq;
        p->in_flight -= (int64_t)n < p->in_flight ? (int64_t)n : p->in_flight;
        p->acked += n;
        add_credit(p, n);
        break;
    case IFD_MSG_CREDIT:
        if (hl < IFD_PROTO_CREDIT_HDR || p->hello_waiting)
            break;
        add_credit(p, ifd_get_u32(h + 8));
        break;
    default:
        break; /* types of later versions */
    }
}

/* Reads one reply if one arrives within timeout_ms (0: only if one is there). IFD_OK when one
 * was handled, IFD_ETIMEDOUT when none came, another code for a socket failure. */
static int recv_one(ifd_producer *p, long timeout_ms, ifd_error *err)
{
    zmq_msg_t frames[IFDP_MAX_FRAMES];
    int n = 0, rc = IFD_OK;
    if (timeout_ms != 0) {
        zmq_pollitem_t it = {p->sock, 0, ZMQ_POLLIN, 0};
        int r = zmq_poll(&it, 1, timeout_ms);
        if (r < 0) {
            if (errno == EINTR)
                return IFD_OK; /* callers loop to their deadline */
            return ifdw_zmq_error(err, "zmq_poll");
        }
        if (r == 0)
            return IFD_ETIMEDOUT;
    }
    int more = 1, dropped = 0;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, p->sock, n == 0 && !dropped ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(&m);
            if (n == 0 && errno == EAGAIN)
                return IFD_ETIMEDOUT;
            if (errno == EINTR && n == 0)
                return IFD_OK;
            rc = ifdw_zmq_error(err, "receiving a reply");
            goto out;
        }
        more = zmq_msg_more(&m);
        if (n < IFDP_MAX_FRAMES)
            frames[n++] = m;
        else {
            zmq_msg_close(&m);
            dropped = 1;
        }
    }
    if (!dropped) {
        ifd_frame spans[IFDP_MAX_FRAMES];
        for (int i = 0; i < n; i++) {
            spans[i].data = zmq_msg_data(&frames[i]);
            spans[i].size = zmq_msg_size(&frames[i]);
        }
        ifdp_on_reply(p, spans, n);
    } else
        push_error(p, IFD_EPROTO, "reply from the daemon: too many frames");
out:
    for (int i = 0; i < n; i++)
        zmq_msg_close(&frames[i]);
    return rc;
}

/* Handles every reply already received, without waiting. */
static int drain(ifd_producer *p, ifd_error *err)
{
    for (;;) {
        int rc = recv_one(p, 0, err);
        if (rc == IFD_ETIMEDOUT)
            return IFD_OK;
        if (rc)
            return rc;
    }
}

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

int ifdp_pop_error(ifd_producer *p, ifd_error *err)
{
    return pop_error(p, err);
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
    free(p->welcome_json);
    free(p->bye_json);
    free(p->errs);
    free(p);
}

/* ---- HELLO -------------------------------------------------------------------------------- */

static char *hello_json(const ifd_producer *p, const ifd_input_spec *schema, int n,
                        int64_t first_seq, ifd_error *err)
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
#define IFDP_DTYPE_CASE_(e, str, size)                                                             \
    if (s->dtype == IFD_##e)                                                                       \
        dt = str;
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
        for (int d = 0; d < s->rank; d++)
            json_array_append_new(shape, json_integer(s->dims[d]));
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
    ifd_error tmp;
    char *text = hello_json(p, schema, n, first_seq, err ? err : &tmp);
    if (text == NULL)
        return err ? err->code : tmp.code;

    int rc = IFD_OK;
    unsigned char h[IFD_PROTO_HDR];
    ifd_proto_header(h, IFD_MSG_HELLO);
    int64_t deadline = ifdw_deadline(timeout_ms);
    if (zmq_send(p->sock, h, sizeof h, ZMQ_SNDMORE) < 0 ||
        zmq_send(p->sock, text, strlen(text), 0) < 0) {
        rc = ifdw_zmq_error(err, "hello: sending HELLO");
        goto out;
    }
    /* Errors of the previous stream are stale now. */
    p->errs_len = 0;
    p->hello_waiting = 1;
    p->hello_answered = 0;
    while (!p->hello_answered && p->bye_json == NULL) {
        long left = ifdw_left_ms(deadline);
        if (left == 0) {
            rc = ifd_error_set(err, IFD_ETIMEDOUT, "hello: no WELCOME from %s within %d ms",
                               p->endpoint, timeout_ms);
            goto out_waiting;
        }
        if ((rc = ifdw_watch_check(&p->watch, p->endpoint, &left, err)) != IFD_OK)
            goto out_waiting;
        rc = recv_one(p, left, err);
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

/* ---- BATCH -------------------------------------------------------------------------------- */

/* Checks that a batch may go and waits for credit. IFD_OK when it may be sent now. */
/* The steps a batch of `rows` carries (train, eval: k x batch_size rows, k up to WELCOME's
 * max_steps_per_message), which is the credit it costs; 1 for other rows, which the daemon
 * refuses or takes as one batch. */
static int64_t batch_steps(const ifd_producer *p, int64_t rows)
{
    if (p->max_steps > 1 && p->batch_size > 0 && strcmp(p->mode, "predict") != 0 &&
        rows > p->batch_size && rows % p->batch_size == 0 && rows / p->batch_size <= p->max_steps)
        return rows / p->batch_size;
    return 1;
}

static int before_send(ifd_producer *p, int64_t rows, const ifd_frame *frames, int n,
                       int timeout_ms, ifd_error *err)
{
    if (n < 1 || n > IFD_MAX_INPUTS || frames == NULL)
        return ifd_error_set(err, IFD_EINVAL, "send: expected 1 to %d frames, got %d",
                             IFD_MAX_INPUTS, n);
    if (rows < 0)
        return ifd_error_set(err, IFD_EINVAL, "send: rows: expected >= 0, got %lld",
                             (long long)rows);
    for (int i = 0; i < n; i++)
        if (frames[i].data == NULL && frames[i].size > 0)
            return ifd_error_set(err, IFD_EINVAL, "send: frame %d: NULL data of %zu bytes", i,
                                 frames[i].size);
    if (!p->welcomed)
        return ifd_error_set(err, IFD_EINVAL, "send: no WELCOME yet: call ifd_producer_hello");
    int rc = drain(p, err);
    if (rc)
        return rc;
    int64_t deadline = ifdw_deadline(timeout_ms);
    for (;;) {
        if ((rc = pop_error(p, err)))
            return rc;
        if (p->bye_json)
            return ifd_error_set(err, IFD_ECLOSED, "send: %s", p->bye_text);
        if (p->end_sent)
            return ifd_error_set(err, IFD_ECLOSED, "send: the stream was ended (END sent)");
        if (p->available >= batch_steps(p, rows))
            return IFD_OK;
        long left = ifdw_left_ms(deadline);
        if (left == 0)
            return ifd_error_set(err, IFD_ETIMEDOUT,
                                 "send: no credit within %d ms (%lld batches in flight)",
                                 timeout_ms, (long long)p->in_flight);
        rc = recv_one(p, left, err);
        if (rc && rc != IFD_ETIMEDOUT)
            return rc;
    }
}

static void batch_header(ifd_producer *p, unsigned char *h, int64_t rows, int n)
{
    ifd_proto_header(h, IFD_MSG_BATCH);
    ifd_put_u64(h + 8, (uint64_t)p->next_seq);
    ifd_put_u64(h + 16, (uint64_t)rows);
    ifd_put_u32(h + 24, 0);
    ifd_put_u32(h + 28, (uint32_t)n);
}

/* Sends the header frame, waiting for the socket to take it. */
static int send_header(ifd_producer *p, const unsigned char *h, int timeout_ms, ifd_error *err)
{
    int64_t deadline = ifdw_deadline(timeout_ms);
    while (zmq_send(p->sock, h, IFD_PROTO_BATCH_HDR, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        if (errno != EAGAIN && errno != EINTR)
            return ifdw_zmq_error(err, "send: BATCH header");
        long left = ifdw_left_ms(deadline);
        if (left == 0)
            return ifd_error_set(err, IFD_ETIMEDOUT,
                                 "send: the socket took no message within %d ms (is the daemon "
                                 "at %s up?)",
                                 timeout_ms, p->endpoint);
        zmq_pollitem_t it = {p->sock, 0, ZMQ_POLLOUT, 0};
        if (zmq_poll(&it, 1, left) < 0 && errno != EINTR)
            return ifdw_zmq_error(err, "send: zmq_poll");
    }
    return IFD_OK;
}

static int after_send(ifd_producer *p, int64_t rows, ifd_error *err)
{
    int64_t k = batch_steps(p, rows); /* step j of it is batch next_seq + j */
    p->next_seq += k;
    p->available -= k;
    p->in_flight += k;
    p->sent += k;
    /* Replies already there update the credit; their ERRORs wait for the next call. */
    return drain(p, err);
}

int ifd_producer_send(ifd_producer *p, int64_t rows, const ifd_frame *frames, int n, int timeout_ms,
                      ifd_error *err)
{
    int rc = before_send(p, rows, frames, n, timeout_ms, err);
    if (rc)
        return rc;
    unsigned char h[IFD_PROTO_BATCH_HDR];
    batch_header(p, h, rows, n);
    if ((rc = send_header(p, h, timeout_ms, err)))
        return rc;
    for (int i = 0; i < n; i++)
        if (zmq_send(p->sock, frames[i].data, frames[i].size, i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
            return ifdw_zmq_error(err, "send: tensor frame");
    return after_send(p, rows, err);
}

int ifd_producer_send_tensors(ifd_producer *p, const ifd_tensor *tensors, int n, int timeout_ms,
                              ifd_error *err)
{
    ifd_frame frames[IFD_MAX_INPUTS];
    if (n < 1 || n > IFD_MAX_INPUTS || tensors == NULL)
        return ifd_error_set(err, IFD_EINVAL, "send: expected 1 to %d tensors, got %d",
                             IFD_MAX_INPUTS, n);
    int64_t rows = -1;
    for (int i = 0; i < n; i++) {
        const ifd_tensor *t = &tensors[i];
        size_t esize = 0;
#define IFDP_SIZE_CASE_(e, str, size)                                                              \
    if (t->dtype == IFD_##e)                                                                       \
        esize = size;
        IFD_DTYPE_MAP(IFDP_SIZE_CASE_)
#undef IFDP_SIZE_CASE_
        if (esize == 0 || t->shape.rank < 1 || t->shape.rank > IFD_MAX_RANK)
            return ifd_error_set(err, IFD_EINVAL,
                                 "send: tensor %d: expected a known dtype and rank >= 1", i);
        if (i == 0)
            rows = t->shape.dims[0];
        else if (t->shape.dims[0] != rows)
            return ifd_error_set(err, IFD_ESHAPE,
                                 "send: tensor %d has %lld rows, tensor 0 has %lld", i,
                                 (long long)t->shape.dims[0], (long long)rows);
        size_t bytes = esize;
        for (int d = 0; d < t->shape.rank; d++)
            bytes *= (size_t)t->shape.dims[d];
        frames[i].data = t->data;
        frames[i].size = bytes;
    }
    return ifd_producer_send(p, rows, frames, n, timeout_ms, err);
}

int ifd_producer_send_zc(ifd_producer *p, int64_t rows, const ifd_frame *frames, int n,
                         ifd_free_fn free_fn, void *hint, int timeout_ms, ifd_error *err)
{
    zmq_msg_t msgs[IFD_MAX_INPUTS];
    int made = 0, sent = 0;
    int rc = before_send(p, rows, frames, n, timeout_ms, err);
    if (rc)
        goto release;
    for (; made < n; made++)
        if (zmq_msg_init_data(&msgs[made], (void *)frames[made].data, frames[made].size, free_fn,
                              hint) != 0) {
            rc = ifdw_zmq_error(err, "send: zmq_msg_init_data");
            goto release;
        }
    unsigned char h[IFD_PROTO_BATCH_HDR];
    batch_header(p, h, rows, n);
    if ((rc = send_header(p, h, timeout_ms, err)))
        goto release;
    for (; sent < n; sent++)
        if (zmq_msg_send(&msgs[sent], p->sock, sent + 1 < n ? ZMQ_SNDMORE : 0) < 0) {
            rc = ifdw_zmq_error(err, "send: tensor frame");
            goto release;
        }
    return after_send(p, rows, err);

release:
    /* Every frame's free_fn runs exactly once: libzmq's for messages it holds, here for the
     * rest. */
    for (int i = sent; i < made; i++)
        zmq_msg_close(&msgs[i]);
    if (free_fn)
        for (int i = made; i < n && frames; i++)
            free_fn((void *)frames[i].data, hint);
    return rc;
}

/* ---- waiting, END, BYE -------------------------------------------------------------------- */

/* Waits until every batch is ACKed or rejected, BYE comes, or an ERROR comes. */
static int wait_acks(ifd_producer *p, const char *what, int timeout_ms, ifd_error *err)
{
    int64_t deadline = ifdw_deadline(timeout_ms);
    int rc;
    for (;;) {
        if ((rc = pop_error(p, err)))
            return rc;
        if (p->in_flight == 0)
            return IFD_OK;
        if (p->bye_json)
            return ifd_error_set(err, IFD_ECLOSED, "%s: %s (%lld batches not acknowledged)", what,
                                 p->bye_text, (long long)p->in_flight);
        long left = ifdw_left_ms(deadline);
        if (left == 0)
            return ifd_error_set(err, IFD_ETIMEDOUT,
                                 "%s: %lld batches still unacknowledged after %d ms", what,
                                 (long long)p->in_flight, timeout_ms);
        rc = recv_one(p, left, err);
        if (rc && rc != IFD_ETIMEDOUT)
            return rc;
    }
}

int ifd_producer_wait(ifd_producer *p, int timeout_ms, ifd_error *err)
{
    int rc = drain(p, err);
    if (rc)
        return rc;
    return wait_acks(p, "wait", timeout_ms, err);
}

int ifd_producer_end(ifd_producer *p, int timeout_ms, ifd_error *err)
{
    if (!p->welcomed)
        return ifd_error_set(err, IFD_EINVAL, "end: no WELCOME yet: call ifd_producer_hello");
    int rc = drain(p, err);
    if (rc)
        return rc;
    if (!p->end_sent) {
        if ((rc = pop_error(p, err)))
            return rc;
        if (p->bye_json == NULL) {
            unsigned char h[IFD_PROTO_HDR];
            ifd_proto_header(h, IFD_MSG_END);
            if (zmq_send(p->sock, h, sizeof h, 0) < 0)
                return ifdw_zmq_error(err, "end: sending END");
        }
        p->end_sent = 1;
    }
    rc = wait_acks(p, "end", timeout_ms, err);
    if (rc == IFD_ECLOSED && p->bye_json)
        rc = IFD_OK; /* the run ended first: the BYE decides */
    if (rc == IFD_OK && p->bye_json && !p->bye_ok)
        rc = ifd_error_set(err, IFD_ESTOPPED, "end: %s", p->bye_text);
    return rc;
}

int ifd_producer_bye(ifd_producer *p, int timeout_ms, const char **json, ifd_error *err)
{
    int64_t deadline = ifdw_deadline(timeout_ms);
    while (p->bye_json == NULL) {
        long left = ifdw_left_ms(deadline);
        if (left == 0)
            return ifd_error_set(err, IFD_ETIMEDOUT, "bye: no BYE from %s within %d ms",
                                 p->endpoint, timeout_ms);
        int rc = recv_one(p, left, err);
        if (rc && rc != IFD_ETIMEDOUT)
            return rc;
    }
    if (json)
        *json = p->bye_json;
    return IFD_OK;
}
