#include "host/ingest/protocol.h"
#include "host/config.h"

#include "device/batch_check.h"
#include "device/step.h"
#include "intake/inputs.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

void ingest_proto_attach(ingest_proto *pr, const ifd_program *program)
{
    pr->program = program;
    int idx[IFD_MAX_INPUTS];
    pr->nin = ifd_step_inputs(program, pr->mode, idx);
    for (int i = 0; i < pr->nin; i++)
        pr->in[i] = &program->inputs[idx[i]];
}

const char *ingest_dims_format(int rank, const int64_t *dims, char *buf, size_t len)
{
    ifd_shape s = {.rank = rank};
    for (int i = 0; i < rank && i < IFD_MAX_RANK; i++)
        s.dims[i] = dims[i];
    return ifd_shape_format(&s, buf, len);
}

/* ---- HELLO ---------------------------------------------------------------------------------- */

/* "x float32 [64], y int32 []": the program's inputs, for the schema sentences. */
static const char *schema_want(const ingest_proto *pr, char *want, size_t len)
{
    want[0] = '\0';
    for (int i = 0; i < pr->nin; i++) {
        char shape[96];
        size_t n = strlen(want);
        snprintf(want + n, len - n, "%s%s %s %s", i ? ", " : "", pr->in[i]->name,
                 ifd_dtype_name(pr->in[i]->dtype),
                 ingest_dims_format(pr->in[i]->rank, pr->in[i]->dims, shape, sizeof shape));
    }
    return want;
}

/* Schema entry i against the program's input i. */
static int check_tensor(const ingest_proto *pr, int i, json_t *t, const char *want, ifd_error *e)
{
    const ifd_input_spec *in = pr->in[i];
    json_t *name = NULL, *dtype = NULL, *shape = NULL;
    json_error_t je;
    if (json_unpack_ex(t, &je, JSON_STRICT, "{s:o, s:o, s:o}", "name", &name, "dtype", &dtype,
                       "shape", &shape) != 0 ||
        !json_is_string(name) || !json_is_string(dtype) || !json_is_array(shape))
        return ifd_error_set(e, IFD_EINVAL,
                             "schema: tensor %d: expected an object with exactly the keys "
                             "name (string), dtype (string) and shape (array of integers)",
                             i);
    if (strcmp(json_string_value(name), in->name) != 0)
        return ifd_error_set(e, IFD_ESHAPE,
                             "schema: tensor %d: expected name '%s' (program '%s' takes %s), "
                             "got '%s'",
                             i, in->name, pr->program->cls->name, want, json_string_value(name));
    ifd_dtype dt;
    if (ifd_dtype_parse(json_string_value(dtype), &dt))
        return ifd_error_set(e, IFD_EDTYPE,
                             "schema: tensor %d '%s': dtype: expected one of float32, int32, "
                             "int64, uint8, got '%s'",
                             i, in->name, json_string_value(dtype));
    if (dt != in->dtype)
        return ifd_error_set(e, IFD_EDTYPE, "schema: tensor %d '%s': expected dtype %s, got %s", i,
                             in->name, ifd_dtype_name(in->dtype), ifd_dtype_name(dt));
    int rank = (int)json_array_size(shape);
    int64_t dims[IFD_MAX_RANK];
    int ok = rank <= IFD_MAX_RANK;
    for (int d = 0; ok && d < rank; d++) {
        json_t *v = json_array_get(shape, (size_t)d);
        ok = json_is_integer(v) && json_integer_value(v) >= 0;
        if (ok)
            dims[d] = json_integer_value(v);
    }
    if (!ok)
        return ifd_error_set(e, IFD_ESHAPE,
                             "schema: tensor %d '%s': shape: expected at most %d "
                             "non-negative integers",
                             i, in->name, IFD_MAX_RANK);
    int same = rank == in->rank;
    for (int d = 0; same && d < rank; d++)
        same = dims[d] == in->dims[d];
    if (!same) {
        char a[96], b[96];
        return ifd_error_set(e, IFD_ESHAPE,
                             "schema: tensor %d '%s': expected per-row shape %s, got %s", i,
                             in->name, ingest_dims_format(in->rank, in->dims, a, sizeof a),
                             ingest_dims_format(rank, dims, b, sizeof b));
    }
    return IFD_OK;
}

int ingest_schema_check(const ingest_proto *pr, json_t *schema, ifd_error *e)
{
    if (schema == NULL || json_is_null(schema))
        return IFD_OK;
    char want[256], got[96];
    if (!json_is_array(schema))
        return ifd_error_set(e, IFD_EINVAL,
                             "HELLO: schema: expected an array of {name, dtype, shape}, got %s",
                             ifd_json_describe(schema, got, sizeof got));
    schema_want(pr, want, sizeof want);
    if ((int)json_array_size(schema) != pr->nin)
        return ifd_error_set(
            e, IFD_ESHAPE, "schema: expected %d tensors for program '%s' in %s mode (%s), got %zu",
            pr->nin, pr->program->cls->name, ifd_mode_name(pr->mode), want,
            json_array_size(schema));
    for (int i = 0; i < pr->nin; i++) {
        int rc = check_tensor(pr, i, json_array_get(schema, (size_t)i), want, e);
        if (rc)
            return rc;
    }
    return IFD_OK;
}

json_t *ingest_schema_json(const ingest_proto *pr)
{
    json_t *a = json_array();
    for (int i = 0; i < pr->nin; i++) {
        const ifd_input_spec *in = pr->in[i];
        json_t *shape = json_array();
        for (int d = 0; d < in->rank; d++)
            json_array_append_new(shape, json_integer(in->dims[d]));
        json_array_append_new(a, json_pack("{s:s, s:s, s:o}", "name", in->name, "dtype",
                                           ifd_dtype_name(in->dtype), "shape", shape));
    }
    return a;
}

static const char *const hello_keys[] = {"name", "schema", "first_seq", "replica", "shm"};

/* The first key of o that a HELLO does not have (json_unpack_ex's JSON_STRICT found one). */
static const char *unknown_key(json_t *o)
{
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v)
    {
        int known = 0;
        for (size_t i = 0; i < sizeof hello_keys / sizeof hello_keys[0]; i++)
            known |= strcmp(key, hello_keys[i]) == 0;
        if (!known)
            return key;
    }
    return "?";
}

/* The replica key: per-core input needs one in [0, replicas) (an eval producer may leave it out:
 * the eval set is one pool, h->eval is parsed first); the others take none. */
static int hello_replica(const ingest_proto *pr, json_t *v, ingest_hello *h, ifd_error *e)
{
    char got[96];
    int per_core = pr->input_mode == IFD_INPUT_PER_CORE;
    if (per_core && h->eval && (v == NULL || json_is_null(v)))
        return IFD_OK;
    if (!per_core) {
        if (v == NULL || json_is_null(v))
            return IFD_OK;
        return ifd_error_set(e, IFD_EINVAL,
                             "HELLO: replica: the input mode is %s, which takes no replica; "
                             "expected null or no key, got %s",
                             ifd_input_mode_name(pr->input_mode),
                             ifd_json_describe(v, got, sizeof got));
    }
    if (v == NULL)
        return ifd_error_set(e, IFD_EINVAL,
                             "HELLO: replica: per-core input with %d replicas: expected an integer "
                             "from 0 to %d naming the replica this producer feeds, got no key",
                             pr->replicas, pr->replicas - 1);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= pr->replicas)
        return ifd_error_set(e, IFD_EINVAL,
                             "HELLO: replica: per-core input with %d replicas: expected an "
                             "integer from 0 to %d, got %s",
                             pr->replicas, pr->replicas - 1, ifd_json_describe(v, got, sizeof got));
    h->replica = (int)json_integer_value(v);
    return IFD_OK;
}

/* The role key: "train" (the default) or "eval" (its batches are the eval set). */
static int hello_role(json_t *v, ingest_hello *h, ifd_error *e)
{
    char got[96];
    if (v == NULL || (json_is_string(v) && strcmp(json_string_value(v), "train") == 0))
        return IFD_OK;
    if (json_is_string(v) && strcmp(json_string_value(v), "eval") == 0) {
        h->eval = 1;
        return IFD_OK;
    }
    return ifd_error_set(e, IFD_EINVAL, "HELLO: role: expected \"train\" or \"eval\", got %s",
                         ifd_json_describe(v, got, sizeof got));
}

/* The keys' types and ranges, once json_unpack_ex took them out. */
static int hello_fields(const ingest_proto *pr, json_t *name, json_t *first_seq, json_t *replica,
                        json_t *shm, ingest_hello *h, ifd_error *e)
{
    char got[96];
    if (name) {
        if (!json_is_string(name) || json_string_length(name) == 0 ||
            json_string_length(name) > IFD_PROTO_NAME_MAX)
            return ifd_error_set(e, IFD_EINVAL,
                                 "HELLO: name: expected a string of 1 to %d bytes, got %s",
                                 IFD_PROTO_NAME_MAX, ifd_json_describe(name, got, sizeof got));
        h->name = json_string_value(name);
    }
    if (first_seq) {
        if (!json_is_integer(first_seq) || json_integer_value(first_seq) < 0)
            return ifd_error_set(e, IFD_EINVAL,
                                 "HELLO: first_seq: expected an integer >= 0, got %s",
                                 ifd_json_describe(first_seq, got, sizeof got));
        h->first_seq = json_integer_value(first_seq);
    }
    int rc = hello_replica(pr, replica, h, e);
    if (rc)
        return rc;
    if (shm) {
        if (!json_is_boolean(shm))
            return ifd_error_set(e, IFD_EINVAL, "HELLO: shm: expected true or false, got %s",
                                 ifd_json_describe(shm, got, sizeof got));
        h->want_shm = json_is_true(shm);
    }
    return ingest_schema_check(pr, h->schema, e);
}

int ingest_hello_parse(const ingest_proto *pr, ingest_span json, json_t **root, ingest_hello *h,
                       ifd_error *e)
{
    *root = NULL;
    *h = (ingest_hello){.replica = -1};
    if (json.len > IFD_PROTO_HELLO_JSON_MAX)
        return ifd_error_set(e, IFD_EPROTO, "HELLO: JSON: expected at most %d bytes, got %zu",
                             IFD_PROTO_HELLO_JSON_MAX, json.len);
    json_error_t je;
    json_t *j = json_loadb(json.data, json.len, JSON_REJECT_DUPLICATES, &je);
    if (j == NULL)
        return ifd_error_set(e, IFD_EPROTO, "HELLO: JSON: line %d, column %d: %s", je.line,
                             je.column, je.text);
    char got[96];
    int rc;
    json_t *name = NULL, *first_seq = NULL, *replica = NULL, *shm = NULL, *role = NULL;
    if (!json_is_object(j)) {
        rc = ifd_error_set(e, IFD_EPROTO, "HELLO: expected a JSON object, got %s",
                           ifd_json_describe(j, got, sizeof got));
    } else if (json_unpack_ex(j, &je, JSON_STRICT, "{s?o, s?o, s?o, s?o, s?o, s?o}", "name", &name,
                              "schema", &h->schema, "first_seq", &first_seq, "replica", &replica,
                              "shm", &shm, "role", &role) != 0) {
        rc = ifd_error_set(e, IFD_EINVAL,
                           "HELLO: unknown key '%s' (expected name, schema, first_seq, replica, "
                           "shm, role)",
                           unknown_key(j));
    } else {
        rc = hello_role(role, h, e);
        if (rc == IFD_OK)
            rc = hello_fields(pr, name, first_seq, replica, shm, h, e);
    }
    if (rc) {
        json_decref(j);
        *h = (ingest_hello){.replica = -1};
        return rc;
    }
    *root = j;
    return IFD_OK;
}

/* ---- messages ------------------------------------------------------------------------------- */

int ingest_message_check(ingest_span header, int total, int *type, ifd_error *e)
{
    if (total < 1)
        return ifd_error_set(e, IFD_EPROTO, "message: expected a header frame, got none");
    ifd_proto_header_info h;
    char why[200];
    if (ifd_proto_parse_header(header.data, header.len, &h, why, sizeof why))
        return ifd_error_set(e, IFD_EPROTO, "%s", why);
    *type = h.type;
    switch (h.type) {
    case IFD_MSG_HELLO:
        if (total != 2)
            return ifd_error_set(e, IFD_EPROTO, "HELLO: expected 2 frames (header, JSON), got %d",
                                 total);
        return IFD_OK;
    case IFD_MSG_END:
        if (total != 1)
            return ifd_error_set(e, IFD_EPROTO, "END: expected 1 frame (header), got %d", total);
        return IFD_OK;
    case IFD_MSG_BATCH:
    case IFD_MSG_BATCH_SHM: /* their frames are checked with the producer's credit */
        return IFD_OK;
    default:
        return ifd_error_set(e, IFD_EPROTO,
                             "header: type: expected HELLO (1), BATCH (3), END (6) or BATCH_SHM "
                             "(10) from a producer, got %u",
                             (unsigned)h.type);
    }
}

/* ---- BATCH ---------------------------------------------------------------------------------- */

int ingest_batch_steps(const ingest_proto *pr, int64_t rows)
{
    if (pr->max_steps > 1 && rows > pr->batch_rows && rows % pr->batch_rows == 0 &&
        rows / pr->batch_rows <= pr->max_steps)
        return (int)(rows / pr->batch_rows);
    return 1;
}

size_t ingest_tensor_bytes(const ingest_proto *pr, int i, int64_t rows)
{
    const ifd_input_spec *in = pr->in[i];
    size_t row = ifd_dtype_size(in->dtype);
    for (int d = 0; d < in->rank; d++)
        row *= (size_t)in->dims[d];
    return row * (size_t)rows;
}

/* The rows check: 0, or -1 with the sentence in msg. */
static int check_rows(const ingest_proto *pr, int64_t rows, char *msg, size_t len)
{
    int predict = pr->mode == IFD_MODE_PREDICT;
    if (predict ? rows >= 1 && rows <= pr->batch_rows
                : rows >= pr->batch_rows && rows % pr->batch_rows == 0 &&
                      rows / pr->batch_rows <= pr->max_steps)
        return 0;
    char per[96] = "the batch size";
    if (pr->input_mode != IFD_INPUT_PER_HOST)
        snprintf(per, sizeof per, "%s input: batch_size %" PRId64 " / %d replicas",
                 ifd_input_mode_name(pr->input_mode), pr->batch_size, pr->replicas);
    if (pr->max_steps > 1)
        snprintf(msg, len,
                 "rows: expected %" PRId64 " (%s) or a multiple of it up to %d x %" PRId64
                 " (max_steps_per_message: that many steps in one message), got %" PRId64,
                 pr->batch_rows, per, pr->max_steps, pr->batch_rows, rows);
    else
        snprintf(msg, len, "rows: expected %s%" PRId64 " (%s%s), got %" PRId64,
                 predict ? "1 to " : "", pr->batch_rows, per,
                 predict ? "; predict mode pads a partial batch" : "", rows);
    return -1;
}

/* Each frame's byte count: 0, or -1 with the sentence. */
static int check_bytes(const ingest_proto *pr, int64_t rows, const ingest_span *frames, int nframes,
                       char *msg, size_t len)
{
    for (int i = 0; i < nframes; i++) {
        const ifd_input_spec *in = pr->in[i];
        size_t want = ingest_tensor_bytes(pr, i, rows), got = frames[i].len;
        if (got != want) {
            char shape[96];
            snprintf(msg, len, "tensor '%s' is %zu bytes, expected %zu (%" PRId64 " rows of %s %s)",
                     in->name, got, want, rows,
                     ingest_dims_format(in->rank, in->dims, shape, sizeof shape),
                     ifd_dtype_name(in->dtype));
            return -1;
        }
    }
    return 0;
}

int ingest_batch_check(const ingest_proto *pr, const ifd_proto_batch *bh, int k,
                       const ingest_span *frames, int nframes, char *msg, size_t len)
{
    if (frames && bh->ntensors != (uint32_t)nframes) {
        snprintf(msg, len, "header ntensors says %" PRIu32 ", but %d frames follow", bh->ntensors,
                 nframes);
        return IFD_EPROTO;
    }
    if (frames && nframes != pr->nin) {
        snprintf(msg, len, "expected %d tensor frames (the schema's tensors), got %d", pr->nin,
                 nframes);
        return IFD_ESHAPE;
    }
    if (bh->flags != 0) {
        snprintf(msg, len, "flags: expected 0 in %s mode, got 0x%" PRIx32, ifd_mode_name(pr->mode),
                 bh->flags);
        return IFD_EINVAL;
    }
    if (check_rows(pr, bh->rows, msg, len))
        return IFD_ESHAPE;
    if (frames && check_bytes(pr, bh->rows, frames, nframes, msg, len))
        return IFD_ESHAPE;
    if (bh->seq < 0 || bh->seq > INT64_MAX - (k - 1)) {
        if (k == 1)
            snprintf(msg, len, "seq: expected an integer >= 0, got %" PRId64, bh->seq);
        else
            snprintf(msg, len,
                     "seq: a message of %d steps takes seq to seq + %d: expected 0 to %" PRId64
                     ", got %" PRId64,
                     k, k - 1, INT64_MAX - (k - 1), bh->seq);
        return IFD_EINVAL;
    }
    return IFD_OK;
}

ingest_seq_verdict ingest_seq_classify(int64_t last_seq, int64_t acked_seq, int64_t seq, int k,
                                       int *skip)
{
    int64_t last = seq + (k - 1); /* step j of the message is the stream's batch seq + j */
    *skip = 0;
    if (seq > last_seq)
        return INGEST_SEQ_NEW;
    if (last <= last_seq) /* a resent message: dropped, its credit given back */
        return last <= acked_seq ? INGEST_SEQ_DUP_ACKED : INGEST_SEQ_DUP_INFLIGHT;
    /* a resent message whose first steps were taken before (a resume from a checkpoint written
     * between its steps): the rest are taken, those are not */
    *skip = (int)(last_seq - seq + 1);
    return INGEST_SEQ_NEW;
}

int64_t ingest_next_seq(int64_t last_seq)
{
    /* The sequence numbers end at INT64_MAX: after a batch with that seq, no later one exists
     * (every seq is a duplicate) and next_seq stays at INT64_MAX rather than overflowing. */
    return last_seq < INT64_MAX ? last_seq + 1 : INT64_MAX;
}

int ingest_view_tensors(const ingest_proto *pr, char *const *data, int64_t row0, int64_t rows,
                        ifd_tensor *out)
{
    for (int i = 0; i < pr->nin; i++) {
        const ifd_input_spec *in = pr->in[i];
        int64_t dims[IFD_MAX_RANK + 1];
        dims[0] = rows;
        for (int d = 0; d < in->rank; d++)
            dims[d + 1] = in->dims[d];
        int rc = ifd_tensor_init(&out[i], in->dtype, in->rank + 1, dims,
                                 data[i] + ingest_tensor_bytes(pr, i, row0));
        if (rc)
            return rc;
    }
    return IFD_OK;
}

int ingest_batch_check_values(const ingest_proto *pr, const ifd_batch *whole, ifd_error *e)
{
    int predict = pr->mode == IFD_MODE_PREDICT;
    int rc = ifd_program_check_batch(pr->program, whole, predict ? pr->batch_rows : whole->rows,
                                     pr->mode, e);
    if (rc == IFD_OK && pr->check_finite)
        rc = ifd_infeed_check_values(pr->program, whole, pr->mode, pr->max_abs_input, e);
    return rc;
}
