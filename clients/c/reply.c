/*
 * The producer's replies: WELCOME, ACK, CREDIT, ERROR, BYE and PREDICTION are decoded here and
 * update the producer's state. ERROR replies are queued and each is returned once.
 */
#include <infeed/client.h>

#include "clients/c/producer_impl.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

/* ---- replies ------------------------------------------------------------------------------ */

int ifdp_push_error(ifd_producer *p, int code, const char *msg)
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
int ifdp_pop_error(ifd_producer *p, ifd_error *err)
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

static int hex_digit(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* An array of n non-negative integers into out; the count, or -1. */
static int u64_array(json_t *a, uint64_t *out, int max)
{
    if (!json_is_array(a) || json_array_size(a) > (size_t)max)
        return -1;
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return -1;
        out[i] = (uint64_t)json_integer_value(v);
    }
    return (int)json_array_size(a);
}

/* WELCOME's "shm" (an object, or null) and "shm_refused". What is malformed goes into
 * d->why, for the producer to report when it maps the pool (send_shm.c). */
static void parse_shm(ifd_producer *p, json_t *o)
{
    ifdp_shm_desc *d = &p->shm_desc;
    memset(d, 0, sizeof *d);
    snprintf(p->shm_refused_msg, sizeof p->shm_refused_msg, "%s",
             json_str_or(o, "shm_refused", ""));
    json_t *shm = json_object_get(o, "shm");
    if (!json_is_object(shm))
        return;
    d->given = 1;
    const char *path = json_str_or(shm, "path", NULL);
    const char *token = json_str_or(shm, "token", "");
    json_t *size = json_object_get(shm, "size");
    d->slots = json_int_or(shm, "slots", -1);
    int no = u64_array(json_object_get(shm, "offsets"), d->offsets, IFD_MAX_INPUTS);
    int ns = u64_array(json_object_get(shm, "step_bytes"), d->step_bytes, IFD_MAX_INPUTS);
    d->n = no;
    if (path == NULL || path[0] == '\0' || strlen(path) >= sizeof d->path)
        snprintf(d->why, sizeof d->why, "path: expected a file path of 1 to %zu bytes",
                 sizeof d->path - 1);
    else if (!json_is_integer(size) || json_integer_value(size) <= 0)
        snprintf(d->why, sizeof d->why, "size: expected an integer > 0");
    else if (strlen(token) != 2 * IFD_SHM_TOKEN_LEN)
        snprintf(d->why, sizeof d->why, "token: expected %d hex digits, got %zu characters",
                 2 * IFD_SHM_TOKEN_LEN, strlen(token));
    else if (no < 0 || ns < 0 || no != ns)
        snprintf(d->why, sizeof d->why,
                 "offsets and step_bytes: expected two arrays of as many integers >= 0 (at most "
                 "%d)",
                 IFD_MAX_INPUTS);
    if (d->why[0])
        return;
    snprintf(d->path, sizeof d->path, "%s", path);
    d->size = (uint64_t)json_integer_value(size);
    for (int i = 0; i < IFD_SHM_TOKEN_LEN; i++) {
        int hi = hex_digit(token[2 * i]), lo = hex_digit(token[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            snprintf(d->why, sizeof d->why, "token: expected hex digits, got '%c%c' at %d",
                     token[2 * i], token[2 * i + 1], 2 * i);
            return;
        }
        d->token[i] = (unsigned char)(hi << 4 | lo);
    }
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
    parse_shm(p, o);
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
        ifdp_push_error(p, IFD_EPROTO, "ERROR reply: frame 1 is not a JSON object");
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
        if (json_is_integer(seq) && p->pool.base) /* the refused message's slots */
            ifdp_slots_reject(&p->pool.slots, (int64_t)json_integer_value(seq));
        if (json_is_integer(seq) && p->in_flight > 0) {
            /* a refused batch of k steps returns its k credits */
            int64_t k = credit > 1 ? credit : 1;
            p->in_flight -= k < p->in_flight ? k : p->in_flight;
            p->rejected++;
        }
        if (credit > 0)
            add_credit(p, credit);
        ifdp_push_error(p, code, text);
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

/* A tensor's dtype by name: its element size (0: unknown), *dtype set. */
static size_t parse_dtype(const char *dt, ifd_dtype *dtype)
{
    *dtype = IFD_DTYPE_MAX;
#define IFDP_PARSE_CASE_(e, str, size)                                                             \
    if (dt && strcmp(dt, str) == 0) {                                                              \
        *dtype = IFD_##e;                                                                          \
        return size;                                                                               \
    }
    IFD_DTYPE_MAP(IFDP_PARSE_CASE_)
#undef IFDP_PARSE_CASE_
    return 0;
}

/* One tensor of a PREDICTION: its description e (name, dtype, shape) for `rows` rows against
 * its frame, copied to aligned memory (*copy, the caller frees it). 0, or -1 with why[] set. */
static int parse_pred_tensor(json_t *e, int i, int64_t rows, const ifd_frame *frame,
                             const char **name, ifd_tensor *t, void **copy, char *why, size_t cap)
{
    json_t *shape = json_object_get(e, "shape");
    *name = json_string_value(json_object_get(e, "name"));
    size_t bytes = parse_dtype(json_string_value(json_object_get(e, "dtype")), &t->dtype);
    if (*name == NULL || bytes == 0 || !json_is_array(shape) ||
        json_array_size(shape) >= IFD_MAX_RANK) {
        snprintf(why, cap, "tensor %d: expected a name, a known dtype and a shape of rank below %d",
                 i, IFD_MAX_RANK);
        return -1;
    }
    t->shape.rank = 1 + (int)json_array_size(shape);
    t->shape.dims[0] = rows;
    int overflow = __builtin_mul_overflow(bytes, (uint64_t)rows, &bytes);
    for (int d = 1; d < t->shape.rank; d++) {
        json_t *v = json_array_get(shape, (size_t)d - 1);
        if (!json_is_integer(v) || json_integer_value(v) < 0) {
            snprintf(why, cap, "tensor %d '%.64s': shape: expected integers >= 0", i, *name);
            return -1;
        }
        t->shape.dims[d] = json_integer_value(v);
        overflow |= __builtin_mul_overflow(bytes, (uint64_t)t->shape.dims[d], &bytes);
    }
    if (overflow) {
        snprintf(why, cap,
                 "tensor %d '%.64s': %lld rows of its shape: expected a size that fits in "
                 "memory, got one that overflows (the frame has %zu bytes)",
                 i, *name, (long long)rows, frame->size);
        return -1;
    }
    if (frame->size != bytes) {
        snprintf(why, cap,
                 "tensor %d '%.64s': expected %zu bytes (%lld rows of its shape), got a frame "
                 "of %zu",
                 i, *name, bytes, (long long)rows, frame->size);
        return -1;
    }
    *copy = malloc(bytes ? bytes : 1);
    if (*copy == NULL) {
        snprintf(why, cap, "tensor %d: out of memory for %zu bytes", i, bytes);
        return -1;
    }
    memcpy(*copy, frame->data, bytes);
    t->data = *copy;
    return 0;
}

/* PREDICTION: the BATCH header layout, a JSON array of {name, dtype, shape}, one raw frame per
 * tensor. Each frame is copied to aligned memory for the callback's views. A description that
 * does not fit the frames (or whose rows x shape x dtype size overflows) queues an EPROTO error
 * naming the tensor, and the callback is not called. */
static void on_prediction(ifd_producer *p, const ifd_frame *frames, int n)
{
    if (frames[0].size < IFD_PROTO_BATCH_HDR || n < 2) {
        ifdp_push_error(p, IFD_EPROTO, "PREDICTION: expected a 32-byte header and a JSON frame");
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
    for (int i = 0; i < nt; i++)
        if (parse_pred_tensor(json_array_get(desc, (size_t)i), i, h.rows, &frames[2 + i], &names[i],
                              &t[i], &copies[i], why, sizeof why))
            break;
    if (why[0] == '\0') {
        p->predictions++;
        if (p->pred_fn)
            p->pred_fn(p->pred_arg, h.seq, h.rows, nt, names, t);
    } else {
        char msg[IFD_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "PREDICTION for batch %lld: %s", (long long)h.seq, why);
        ifdp_push_error(p, IFD_EPROTO, msg);
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
        ifd_get_u16(h + 4) != IFD_PROTOCOL_VERSION) {
        ifdp_push_error(p, IFD_EPROTO, "reply from the daemon: a header that is not protocol 1");
        return;
    }
    int type = ifd_get_u16(h + 6);
    ifdw_watch_confirm(&p->watch); /* a daemon's message */
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
        if (p->pool.base)
            ifdp_slots_ack(&p->pool.slots, seq);
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

/* A message of a type only producers send (HELLO, BATCH, END, BATCH_SHM) came back: the socket
 * is connected to itself. A TCP client that connects to a port of the kernel's ephemeral range
 * where nothing listens can be given that same port as its own (simultaneous open), and a ZeroMQ
 * DEALER takes its own greeting for a peer's: the producer would wait for a WELCOME from itself,
 * and the connect timeout would take the handshake for the daemon's. */
static int is_own_message(zmq_msg_t *m)
{
    const unsigned char *h = zmq_msg_data(m);
    if (zmq_msg_size(m) < IFD_PROTO_HDR || memcmp(h, IFD_PROTO_MAGIC, 4) != 0)
        return 0;
    int type = ifd_get_u16(h + 6);
    return type == IFD_MSG_HELLO || type == IFD_MSG_BATCH || type == IFD_MSG_END ||
           type == IFD_MSG_BATCH_SHM;
}

/* Drops the connection to itself and connects again (a new local port); before the first
 * WELCOME the connect timeout watches again, to its first deadline, and a HELLO that came back is
 * sent again. A later message that came back was not delivered and stays unacknowledged. */
static int reconnect_from_self(ifd_producer *p, zmq_msg_t *frames, int n, ifd_error *err)
{
    if (zmq_disconnect(p->sock, p->endpoint) != 0 || zmq_connect(p->sock, p->endpoint) != 0)
        return ifdw_zmq_error(err, "reconnecting a socket that connected to itself");
    int rc;
    if (!p->welcomed && (rc = ifdw_watch_rearm(&p->watch, p->ctx, p->sock, err)) != IFD_OK)
        return rc;
    if (ifd_get_u16((const unsigned char *)zmq_msg_data(&frames[0]) + 6) != IFD_MSG_HELLO ||
        !p->hello_waiting)
        return IFD_OK;
    for (int i = 0; i < n; i++)
        if (zmq_send(p->sock, zmq_msg_data(&frames[i]), zmq_msg_size(&frames[i]),
                     i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
            return ifdw_zmq_error(err, "hello: sending HELLO again");
    return IFD_OK;
}

/* Reads one reply if one arrives within timeout_ms (0: only if one is there). IFD_OK when one
 * was handled, IFD_ETIMEDOUT when none came, another code for a socket failure. */
int ifdp_recv_one(ifd_producer *p, long timeout_ms, ifd_error *err)
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
    if (!dropped && n > 0 && is_own_message(&frames[0])) {
        rc = reconnect_from_self(p, frames, n, err);
        goto out;
    }
    if (!dropped) {
        ifd_frame spans[IFDP_MAX_FRAMES];
        for (int i = 0; i < n; i++) {
            spans[i].data = zmq_msg_data(&frames[i]);
            spans[i].size = zmq_msg_size(&frames[i]);
        }
        ifdp_on_reply(p, spans, n);
    } else
        ifdp_push_error(p, IFD_EPROTO, "reply from the daemon: too many frames");
out:
    for (int i = 0; i < n; i++)
        zmq_msg_close(&frames[i]);
    return rc;
}

/* Handles every reply already received, without waiting. */
int ifdp_drain(ifd_producer *p, ifd_error *err)
{
    for (;;) {
        int rc = ifdp_recv_one(p, 0, err);
        if (rc == IFD_ETIMEDOUT)
            return IFD_OK;
        if (rc)
            return rc;
    }
}
