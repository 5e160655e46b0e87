/*
 * Predict mode's end of input (the seed's _InputsWithStoppingSignals): a partial batch is padded
 * to the batch size with a padding mask, and one more batch, with the stopping signal, is appended
 * when the input ends. Both are runtime-made batches that own their bytes.
 */
#include "core/batch.h"
#include "intake/inputs.h"
#include "intake/shard.h"

#include <stdlib.h>
#include <string.h>

typedef struct made_batch {
    ifd_batch b;
    ifd_batch *orig; /* the padded batch's original, referenced until this one is released */
} made_batch;

static void release_made(ifd_batch *b, void *arg)
{
    (void)arg;
    made_batch *m = (made_batch *)b;
    ifd_batch *orig = m->orig;
    free(m); /* the tensors' bytes are in the same block */
    if (orig)
        ifd_batch_unref(orig);
}

/* A batch of `rows` rows shaped like the program's inputs for mode, zero-filled, in one block. */
static int make_batch(const ifd_program *p, ifd_mode mode, int64_t rows, made_batch **out,
                      ifd_error *err)
{
    int idx[IFD_MAX_INPUTS];
    int n = ifd_infeed_mode_inputs(p, mode, idx);
    size_t off = (sizeof(made_batch) + 63) & ~(size_t)63, bytes[IFD_MAX_INPUTS], total = off;
    for (int i = 0; i < n; i++) {
        const ifd_input_spec *in = &p->inputs[idx[i]];
        size_t row = ifd_dtype_size(in->dtype);
        for (int d = 0; d < in->rank; d++)
            row *= (size_t)in->dims[d];
        bytes[i] = row * (size_t)rows;
        total += (bytes[i] + 63) & ~(size_t)63;
    }
    unsigned char *mem = calloc(1, total);
    if (mem == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "predict: a padded batch of %lld rows (%zu bytes)",
                             (long long)rows, total);
    made_batch *m = (made_batch *)mem;
    ifd_batch_init(&m->b);
    m->b.rows = rows;
    m->b.ntensors = n;
    m->b.release = release_made;
    for (int i = 0; i < n; i++) {
        const ifd_input_spec *in = &p->inputs[idx[i]];
        int64_t dims[IFD_MAX_RANK];
        dims[0] = rows;
        for (int d = 0; d < in->rank; d++)
            dims[d + 1] = in->dims[d];
        ifd_tensor_init(&m->b.tensors[i], in->dtype, in->rank + 1, dims, mem + off);
        off += (bytes[i] + 63) & ~(size_t)63;
    }
    *out = m;
    return IFD_OK;
}

int ifd_infeed_pad_batch(const ifd_program *p, ifd_mode mode, ifd_batch *b, int64_t rows,
                         ifd_batch **out, ifd_error *err)
{
    made_batch *m;
    int rc = make_batch(p, mode, rows, &m, err);
    if (rc)
        return rc;
    for (int i = 0; i < b->ntensors; i++)
        memcpy(m->b.tensors[i].data, b->tensors[i].data, ifd_tensor_nbytes(&b->tensors[i]));
    m->b.seq = b->seq;
    m->b.flags = (b->flags & ~IFD_BATCH_PINNED) | IFD_BATCH_PADDED; /* a copy, in its memory */
    m->b.valid_rows = (b->flags & IFD_BATCH_PADDED) ? b->valid_rows : b->rows;
    m->b.replica = b->replica;
    m->b.producer = b->producer;
    m->b.user = b->user;
    ifd_batch_ref(b, 1);
    m->orig = b;
    ifd_batch_ref(&m->b, 1);
    *out = &m->b;
    return IFD_OK;
}

int ifd_infeed_padding_batch(const ifd_program *p, ifd_mode mode, int64_t rows, ifd_batch **out,
                             ifd_error *err)
{
    made_batch *m;
    int rc = make_batch(p, mode, rows, &m, err);
    if (rc)
        return rc;
    m->b.seq = -1;
    m->b.flags = IFD_BATCH_PADDED | IFD_BATCH_CHECKED;
    m->b.valid_rows = 0;
    m->b.producer = "(padding)";
    *out = &m->b;
    return IFD_OK;
}

int ifd_infeed_stop_batch(const ifd_program *p, ifd_mode mode, int64_t rows, ifd_batch **out,
                          ifd_error *err)
{
    int rc = ifd_infeed_padding_batch(p, mode, rows, out, err);
    if (rc)
        return rc;
    (*out)->flags = IFD_BATCH_STOP | IFD_BATCH_PADDED;
    (*out)->producer = "(stopping signal)";
    ifd_batch_ref(*out, 1);
    return IFD_OK;
}
