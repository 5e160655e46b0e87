#include "outfeed/step_tensors.h"

#include <infeed/hosts.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const runtime_names[IFD_OUTFEED_TENSORS_RUNTIME] = {
    "loss", "correct", "count", "grad_norm", "param_norm", "learning_rate"};

/* The runtime's value of tensor k (0 to IFD_OUTFEED_TENSORS_RUNTIME - 1) in a record. */
static float runtime_value(const ifd_step_out *o, int k)
{
    const float v[IFD_OUTFEED_TENSORS_RUNTIME] = {o->loss,      o->correct,    o->count,
                                                  o->grad_norm, o->param_norm, o->learning_rate};
    return v[k];
}

/* Tensors that cross hosts: the program's and loss, correct, count (the per-step ones are the
 * same on every host). */
static int exchanged(const ifd_outfeed_tensors *c, int i)
{
    return i < c->program->noutfeeds + 3;
}

int ifd_outfeed_tensors_init(ifd_outfeed_tensors *c, const ifd_program *p, ifd_mode mode,
                             int replicas, int64_t max_shard_rows, const struct ifd_hosts *hosts)
{
    memset(c, 0, sizeof *c);
    c->program = p;
    c->replicas = replicas;
    c->max_shard_rows = max_shard_rows;
    c->hosts = ifd_hosts_many(hosts) ? hosts : NULL;
    memset(c->need, 1, sizeof c->need);
    int nhosts = c->hosts ? c->hosts->size : 1;
    ifd_program_outfeed_layout(p, max_shard_rows, c->offs);
    int nrt = mode == IFD_MODE_TRAIN ? IFD_OUTFEED_TENSORS_RUNTIME : 3;
    c->ntensors = p->noutfeeds + nrt;
    size_t host_bytes = 2 * sizeof(int64_t); /* the host's rows and replica-steps */
    for (int i = 0; i < c->ntensors; i++) {
        int64_t values; /* the most one host has */
        if (i < p->noutfeeds) {
            c->names[i] = p->outfeeds[i].name;
            c->per_row[i] = p->outfeeds[i].per_row;
            c->value_bytes[i] = ifd_program_outfeed_value_bytes(p, i);
            values = c->per_row[i] ? replicas * max_shard_rows : replicas;
        } else {
            int k = i - p->noutfeeds;
            c->names[i] = runtime_names[k];
            c->value_bytes[i] = sizeof(float);
            values = k < 3 ? replicas : 1;
        }
        int64_t bytes = values * c->value_bytes[i];
        if (exchanged(c, i)) {
            host_bytes += (size_t)bytes;
            bytes *= nhosts;
        }
        c->bufs[i] = malloc((size_t)bytes + 1);
        if (c->bufs[i] == NULL)
            goto fail;
    }
    if (c->hosts) {
        c->host_bytes = host_bytes;
        c->send = malloc(host_bytes);
        c->recv = malloc(host_bytes * (size_t)nhosts);
        if (c->send == NULL || c->recv == NULL)
            goto fail;
    }
    return IFD_OK;
fail:
    ifd_outfeed_tensors_fini(c);
    return IFD_ENOMEM;
}

void ifd_outfeed_tensors_fini(ifd_outfeed_tensors *c)
{
    for (int i = 0; i < IFD_OUTFEED_TENSORS_MAX; i++) {
        free(c->bufs[i]);
        c->bufs[i] = NULL;
    }
    free(c->send);
    free(c->recv);
    c->send = c->recv = NULL;
}

/* Tensor i's view over its buffer: values values (rows, replica-steps or 1) of its shape. */
static void view(ifd_outfeed_tensors *c, int i, int64_t values)
{
    int64_t dims[IFD_MAX_RANK] = {values};
    int rank = 1;
    ifd_dtype dt = IFD_F32;
    if (i < c->program->noutfeeds) {
        const ifd_outfeed_spec *o = &c->program->outfeeds[i];
        dt = o->dtype;
        for (int d = 0; d < o->rank; d++)
            dims[rank++] = o->dims[d];
    }
    ifd_tensor_init(&c->tensors[i], dt, rank, dims, c->bufs[i]);
}

/* This host's step: each tensor's values in replica order; returns the rows, and in *kept the
 * replica-steps that count (a record of a padding batch, eval on several hosts, has none: its
 * rows and its per-replica-step values are left out). */
static int64_t concat_local(ifd_outfeed_tensors *c, const ifd_outfeed_rec *recs, int n,
                            int64_t values[IFD_OUTFEED_TENSORS_MAX], int64_t *kept)
{
    const ifd_program *p = c->program;
    int64_t rows = 0, k_n = 0;
    for (int r = 0; r < n; r++)
        if (!recs[r].from.padding) {
            rows += recs[r].rows;
            k_n++;
        }
    *kept = k_n;
    for (int i = 0; i < c->ntensors; i++) {
        if (i < p->noutfeeds && !c->need[i] && c->hosts == NULL) {
            values[i] = c->per_row[i] ? rows : k_n; /* nobody reads it this step: not copied */
        } else if (i < p->noutfeeds) {
            size_t off = 0;
            for (int r = 0; r < n; r++) {
                if (recs[r].from.padding)
                    continue;
                size_t b = (size_t)(c->value_bytes[i] * (c->per_row[i] ? recs[r].rows : 1));
                if (recs[r].outfeed) /* NULL: nobody takes them this run (zeros) */
                    memcpy(c->bufs[i] + off, (const unsigned char *)recs[r].outfeed + c->offs[i],
                           b);
                else
                    memset(c->bufs[i] + off, 0, b);
                off += b;
            }
            values[i] = c->per_row[i] ? rows : k_n;
        } else {
            int k = i - p->noutfeeds;
            float *f = (float *)(void *)c->bufs[i];
            values[i] = 0;
            for (int r = 0; r < (k < 3 ? n : 1); r++)
                if (k >= 3 || !recs[r].from.padding)
                    f[values[i]++] = runtime_value(&recs[r].out, k);
        }
    }
    return rows;
}

/* Every host's part in rank order, into the tensors' buffers. */
static int concat_hosts(ifd_outfeed_tensors *c, int64_t rows, int64_t kept,
                        int64_t values[IFD_OUTFEED_TENSORS_MAX], int (*stop)(void *),
                        void *stop_arg, ifd_error *err)
{
    const ifd_hosts *h = c->hosts;
    unsigned char *at = c->send;
    memcpy(at, &rows, sizeof rows);
    at += sizeof rows;
    memcpy(at, &kept, sizeof kept);
    at += sizeof kept;
    for (int i = 0; i < c->ntensors && exchanged(c, i); i++) {
        size_t most = (size_t)(c->value_bytes[i] *
                               (c->per_row[i] ? c->replicas * c->max_shard_rows : c->replicas));
        memcpy(at, c->bufs[i], (size_t)(values[i] * c->value_bytes[i]));
        at += most;
    }
    int rc = h->ops->allgather(h->ctx, IFD_HOSTS_OUTFEED, c->send, c->recv, c->host_bytes, stop,
                               stop_arg, err);
    if (rc)
        return ifd_error_prefix(err, "outfeed tensors of %d hosts", h->size);
    for (int i = 0; i < c->ntensors && exchanged(c, i); i++)
        values[i] = 0;
    for (int k = 0; k < h->size; k++) {
        const unsigned char *from = c->recv + (size_t)k * c->host_bytes;
        int64_t hrows, hkept;
        memcpy(&hrows, from, sizeof hrows);
        from += sizeof hrows;
        memcpy(&hkept, from, sizeof hkept);
        from += sizeof hkept;
        for (int i = 0; i < c->ntensors && exchanged(c, i); i++) {
            int64_t hv = c->per_row[i] ? hrows : hkept;
            size_t most = (size_t)(c->value_bytes[i] *
                                   (c->per_row[i] ? c->replicas * c->max_shard_rows : c->replicas));
            memcpy(c->bufs[i] + values[i] * c->value_bytes[i], from,
                   (size_t)(hv * c->value_bytes[i]));
            values[i] += hv;
            from += most;
        }
    }
    return IFD_OK;
}

int ifd_outfeed_tensors_step(ifd_outfeed_tensors *c, const ifd_outfeed_rec *recs, int n,
                             int (*stop)(void *), void *stop_arg, ifd_error *err)
{
    int64_t values[IFD_OUTFEED_TENSORS_MAX], kept;
    int64_t rows = concat_local(c, recs, n, values, &kept);
    if (c->hosts) {
        int rc = concat_hosts(c, rows, kept, values, stop, stop_arg, err);
        if (rc)
            return rc;
    }
    for (int i = 0; i < c->ntensors; i++)
        view(c, i, values[i]);
    return IFD_OK;
}

void ifd_outfeed_tensors_row(const ifd_outfeed_tensors *c, int i, ifd_dtype *dt, ifd_shape *row)
{
    memset(row, 0, sizeof *row);
    *dt = IFD_F32;
    if (i < c->program->noutfeeds) {
        const ifd_outfeed_spec *o = &c->program->outfeeds[i];
        *dt = o->dtype;
        row->rank = o->rank;
        for (int d = 0; d < o->rank; d++)
            row->dims[d] = o->dims[d];
    }
}

const char *ifd_outfeed_tensors_names(const ifd_outfeed_tensors *c, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < c->ntensors && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? ", " : "", c->names[i]);
    return buf;
}

int ifd_outfeed_tensors_find(const ifd_outfeed_tensors *c, const char *name)
{
    for (int i = 0; i < c->ntensors; i++)
        if (strcmp(c->names[i], name) == 0)
            return i;
    return -1;
}
