#include "tests/util/fake_ingest.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

fake_ingest *fake_current;

/* ---- what the socket side would provide ---------------------------------------------------- */

#define GONE_MAX 64
static char gone[GONE_MAX][RID_MAX + 1];

void fake_set_gone(const char *rid, int is_gone)
{
    for (int i = 0; i < GONE_MAX; i++)
        if (strcmp(gone[i], rid) == 0) {
            if (!is_gone)
                gone[i][0] = '\0';
            return;
        }
    for (int i = 0; is_gone && i < GONE_MAX; i++)
        if (gone[i][0] == '\0') {
            snprintf(gone[i], sizeof gone[i], "%s", rid);
            return;
        }
}

static int is_gone(const producer_rid *to)
{
    for (int i = 0; i < GONE_MAX; i++)
        if (gone[i][0] && strlen(gone[i]) == to->len && memcmp(gone[i], to->rid, to->len) == 0)
            return 1;
    return 0;
}

static fake_reply *record(const producer_rid *to, int type)
{
    fake_ingest *f = fake_current;
    if (f->nreplies == FAKE_REPLIES_MAX)
        abort();
    fake_reply *r = &f->replies[f->nreplies++];
    memset(r, 0, sizeof *r);
    r->type = type;
    memcpy(r->rid, to->rid, to->len);
    r->rid_len = to->len;
    return r;
}

void ingest_send_json(ifd_ingest *g, const producer_rid *to, int type, json_t *j, int keep)
{
    (void)g;
    (void)keep;
    record(to, type)->json = j;
}

void ingest_send_error(ifd_ingest *g, const producer_rid *to, int code, int64_t seq, int credit,
                       const char *fmt, ...)
{
    (void)g;
    fake_reply *r = record(to, IFD_MSG_ERROR);
    r->code = code;
    r->seq = seq;
    r->credit = credit;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->text, sizeof r->text, fmt, ap);
    va_end(ap);
}

void ingest_reply_ack(ifd_ingest *g, const producer_rid *to, int64_t seq, uint32_t n)
{
    (void)g;
    fake_reply *r = record(to, IFD_MSG_ACK);
    r->seq = seq;
    r->credit = n;
}

void ingest_reply_credit(ifd_ingest *g, const producer_rid *to, uint32_t n)
{
    (void)g;
    record(to, IFD_MSG_CREDIT)->credit = n;
}

void ingest_reply_prediction(ifd_ingest *g, const producer_rid *to, prediction_msg *m)
{
    (void)g;
    record(to, IFD_MSG_PREDICTION);
    ingest_prediction_free(m);
}

int ingest_send_probe(ifd_ingest *g, const producer_rid *to)
{
    if (!is_gone(to))
        return 0;
    ingest_note_gone(g, to);
    return EHOSTUNREACH;
}

int ingest_replies_held(ifd_ingest *g, const producer_rid *to)
{
    (void)g;
    (void)to;
    return 0;
}

void ingest_replies_drop(ifd_ingest *g, const producer_rid *to)
{
    (void)g;
    (void)to;
}

void ifd_ingest_wake(ifd_ingest *g)
{
    (void)g;
    if (fake_current)
        fake_current->wakes++;
}

void ingest_drop_busy_hello(ifd_ingest *g, const producer_rid *from)
{
    (void)g;
    (void)from;
}

/* One connection (descriptor -1 in this fake) with its count of names started. */
static int names_started;
uint64_t ifd_conns_mark(ifd_conns *c, int fd)
{
    (void)c;
    (void)fd;
    return 0;
}
void ifd_conns_unmark(ifd_conns *c, int fd, uint64_t mark)
{
    (void)c;
    (void)fd;
    (void)mark;
}
int ifd_conns_count(ifd_conns *c, int fd, int delta)
{
    (void)c;
    (void)fd;
    return names_started += delta;
}

/* ---- the ingest ------------------------------------------------------------------------------ */

void fake_ingest_init(fake_ingest *f, const ifd_daemon_config *cfg)
{
    memset(f, 0, sizeof *f);
    f->cfg = *cfg;
    fake_current = f;
    names_started = 0;
    memset(gone, 0, sizeof gone);
    ifd_error err;
    if (ifd_program_init(&f->program, cfg->run.program, &cfg->run.settings, &err))
        abort();
    ifd_ingest *g = f->g = calloc(1, sizeof *g);
    g->cfg = &f->cfg;
    g->sock.msg_fd = -1;
    ifd_mutex_init(&g->fifo.mu);
    ifd_cond_init(&g->fifo.cv);
    ifd_mutex_init(&g->end.mu);
    ifd_mutex_init(&g->pools.mu);
    g->producers = calloc((size_t)cfg->max_producers, sizeof *g->producers);
    g->fifo.nlanes = cfg->run.input_mode == IFD_INPUT_PER_CORE ? cfg->run.replicas : 1;
    g->fifo.lanes = calloc((size_t)g->fifo.nlanes, sizeof *g->fifo.lanes);
    g->fifo.max_pos = 4 * cfg->max_producers > 1024 ? 4 * cfg->max_producers : 1024;
    g->lim_hello = (ifd_log_limit)IFD_LOG_LIMIT_INIT(20, 1000000000LL);
    g->lim_reject = (ifd_log_limit)IFD_LOG_LIMIT_INIT(10, 1000000000LL);
    g->lim_gone = (ifd_log_limit)IFD_LOG_LIMIT_INIT(20, 1000000000LL);
    ingest_proto *pr = &g->pr;
    pr->mode = cfg->run.mode;
    pr->input_mode = cfg->run.input_mode;
    pr->replicas = cfg->run.replicas;
    pr->batch_size = cfg->run.batch_size;
    pr->batch_rows = ifd_input_batch_rows(pr->input_mode, pr->batch_size, pr->replicas);
    pr->max_steps = pr->mode == IFD_MODE_PREDICT ? 1 : cfg->max_steps_per_message;
    pr->credit = cfg->credit;
    pr->check_finite = cfg->check_finite;
    pr->max_abs_input = cfg->max_abs_input;
    ingest_proto_attach(pr, &f->program);
}

void fake_ingest_free(fake_ingest *f)
{
    ifd_ingest *g = f->g;
    for (int i = 0; i < g->fifo.nlanes; i++)
        for (host_batch *hb = g->fifo.lanes[i].head; hb; hb = hb->qnext)
            ingest_host_batch_free_frames(hb);
    for (int i = 0; i < f->cfg.max_producers; i++) {
        host_batch *hb = g->producers[i].head;
        while (hb) {
            host_batch *next = hb->pnext;
            ingest_host_batch_free(hb);
            hb = next;
        }
        ingest_shm_drop(g, &g->producers[i]);
    }
    free(g->fifo.lanes);
    free(g->producers);
    ingest_host_batch_spares_free(g);
    ingest_copy_spares_free(g);
    ingest_producers_free(g);
    ingest_ended_conns_free(g);
    ifd_mutex_fini(&g->end.mu);
    ifd_mutex_fini(&g->pools.mu);
    ifd_cond_fini(&g->fifo.cv);
    ifd_mutex_fini(&g->fifo.mu);
    free(g);
    ifd_program_free(&f->program);
    for (int i = 0; i < f->nreplies; i++)
        json_decref(f->replies[i].json);
    fake_current = NULL;
}

static producer_rid rid_of(const char *rid)
{
    return (producer_rid){.rid = (const uint8_t *)rid, .len = strlen(rid)};
}

static int never_park(ingest_hello_msg *m)
{
    (void)m;
    return 0;
}

void fake_hello(fake_ingest *f, const char *rid, const char *json)
{
    producer_rid from = rid_of(rid);
    ingest_hello_msg m = {.json = {json, strlen(json)}, .park = never_park};
    ingest_handle_hello(f->g, &from, &m);
}

/* The BATCH's frames, copied (the transport would keep libzmq's). */
typedef struct copied_frames {
    host_frames base;
} copied_frames;

static void copied_free(host_frames *fr)
{
    if (fake_current)
        fake_current->frames_freed++;
    free(fr);
}

void fake_batch(fake_ingest *f, const char *rid, const ifd_proto_batch *bh, ingest_span *frames,
                int nframes)
{
    ifd_ingest *g = f->g;
    producer_rid from = rid_of(rid);
    int k, skip;
    producer *p = ingest_batch_begin(g, &from, bh, "BATCH", &k);
    if (p == NULL)
        return;
    char msg[IFD_ERROR_MSG_MAX];
    int code = ingest_batch_check(&g->pr, bh, k, frames, nframes, msg, sizeof msg);
    if (code) {
        ingest_batch_reject(g, p, &from, k, code, bh->seq, msg);
        return;
    }
    if (ingest_batch_sequence(g, p, &from, bh, k, &skip))
        return;
    copied_frames *c = calloc(1, sizeof *c);
    c->base.free = copied_free;
    for (int i = 0; i < nframes; i++) {
        c->base.copy_len[i] = frames[i].len;
        c->base.data[i] = c->base.copies[i] =
            ingest_copy_aligned(g, i, frames[i].data, frames[i].len);
    }
    ingest_batch_accept(g, p, &from, bh, k, skip, &c->base, IFD_OK, -1);
    ingest_fifo_flush(g);
}

void fake_end(fake_ingest *f, const char *rid)
{
    producer_rid from = rid_of(rid);
    ingest_handle_end(f->g, &from);
}

const fake_reply *fake_last(fake_ingest *f, const char *rid)
{
    for (int i = f->nreplies - 1; i >= 0; i--)
        if (f->replies[i].rid_len == strlen(rid) &&
            memcmp(f->replies[i].rid, rid, f->replies[i].rid_len) == 0)
            return &f->replies[i];
    return NULL;
}

int fake_release(fake_ingest *f, int lane)
{
    ifd_batch_source src = ifd_ingest_source(f->g);
    ifd_batch *b;
    ifd_error err;
    int n = 0;
    while ((lane < 0 ? src.ops->try_next(src.ctx, &b, &err)
                     : src.ops->try_next_for(src.ctx, lane, &b, &err)) == IFD_OK) {
        b->release(b, b->release_arg);
        n++;
    }
    return n;
}

int fake_consume(fake_ingest *f, int lane)
{
    int n = fake_release(f, lane);
    ingest_send_acks(f->g);
    return n;
}
