/*
 * The ingest protocol's rules (docs/protocol.md) on byte spans, without a socket: the header and
 * frame counts, HELLO's JSON, keys and schema, BATCH's checks in the documented order (the
 * several-steps form and BATCH_SHM's included), duplicates and next_seq, the step views of an
 * accepted message and the program's checks of its values. Programs, shapes, input modes,
 * names and sequence numbers are random; the seed is in every failure.
 */
#include "host/ingest/protocol.h"

#include "core/wire.h"
#include "tests/util/testutil.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct run {
    ifd_program prog;
    ingest_proto pr;
    ifd_rng rng;
} run;

static const ifd_input_mode modes[] = {IFD_INPUT_PER_HOST, IFD_INPUT_PER_HOST_V2,
                                       IFD_INPUT_PER_CORE, IFD_INPUT_BROADCAST};

static ifd_mode random_mode(ifd_rng *rng)
{
    static const ifd_mode m[] = {IFD_MODE_TRAIN, IFD_MODE_EVAL, IFD_MODE_PREDICT};
    return m[rand_between(rng, 0, 2)];
}

/* A random softmax run in mode (predict, train, eval, or ANY_MODE: one of them) and a random
 * input mode. */
#define ANY_MODE ((ifd_mode)-1)
static void run_init(run *r, ifd_mode mode)
{
    seed_rng(&r->rng);
    if (mode == ANY_MODE)
        mode = random_mode(&r->rng);
    ifd_program_settings st = {.features = rand_between(&r->rng, 1, 40),
                               .classes = rand_between(&r->rng, 2, 12)};
    ifd_error err;
    RC_OK(ifd_program_init(&r->prog, "softmax", &st, &err), err);
    ingest_proto *pr = &r->pr;
    memset(pr, 0, sizeof *pr);
    pr->mode = mode;
    pr->input_mode = modes[rand_between(&r->rng, 0, 3)];
    pr->replicas = (int)rand_between(&r->rng, 1, 4);
    pr->batch_size = pr->replicas * rand_between(&r->rng, 1, 16);
    pr->batch_rows = ifd_input_batch_rows(pr->input_mode, pr->batch_size, pr->replicas);
    pr->max_steps = mode == IFD_MODE_PREDICT ? 1 : (int)rand_between(&r->rng, 1, 4);
    pr->credit = (int)rand_between(&r->rng, pr->max_steps, 32);
    pr->check_finite = 1;
    ingest_proto_attach(pr, &r->prog);
}

/* ck_assert that err holds code and a sentence containing part. */
#define EXPECT_ERR(rc, err, code, part)                                                            \
    do {                                                                                           \
        RASSERT((rc) == (code), "expected %s, got %s (%s)", ifd_errname(code), ifd_errname(rc),    \
                ifd_error_text(&(err)));                                                           \
        RASSERT(strstr((err).msg, (part)) != NULL, "expected '%s' in '%s'", (part), (err).msg);    \
    } while (0)

/* ---- the header --------------------------------------------------------------------------- */

static ingest_span hdr_span(uint8_t *h, int type)
{
    ifd_proto_header(h, type);
    return (ingest_span){h, IFD_PROTO_HDR};
}

START_TEST(header_is_checked_before_its_type)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_error e;
    uint8_t h[IFD_PROTO_HDR];
    int type;
    EXPECT_ERR(ingest_message_check((ingest_span){0}, 0, &type, &e), e, IFD_EPROTO,
               "message: expected a header frame, got none");
    size_t short_len = (size_t)rand_between(&rng, 0, IFD_PROTO_HDR - 1);
    hdr_span(h, IFD_MSG_HELLO);
    EXPECT_ERR(ingest_message_check((ingest_span){h, short_len}, 2, &type, &e), e, IFD_EPROTO,
               "header: expected at least 8 bytes");
    h[rand_between(&rng, 0, 3)] ^= (uint8_t)rand_between(&rng, 1, 255);
    EXPECT_ERR(ingest_message_check((ingest_span){h, IFD_PROTO_HDR}, 2, &type, &e), e, IFD_EPROTO,
               "header: magic: expected the bytes 'IFDP'");
    hdr_span(h, IFD_MSG_HELLO);
    unsigned v = (unsigned)rand_between(&rng, 2, 65535);
    ifd_put_u16(h + 4, (uint16_t)v);
    char want[64];
    snprintf(want, sizeof want, "header: protocol version: expected %d, got %u",
             IFD_PROTOCOL_VERSION, v);
    EXPECT_ERR(ingest_message_check((ingest_span){h, IFD_PROTO_HDR}, 2, &type, &e), e, IFD_EPROTO,
               want);
}
END_TEST

START_TEST(a_producer_sends_four_types_only)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_error e;
    uint8_t h[IFD_PROTO_HDR];
    int type;
    const int daemons[] = {IFD_MSG_WELCOME, IFD_MSG_CREDIT,     IFD_MSG_ACK,
                           IFD_MSG_ERROR,   IFD_MSG_PREDICTION, IFD_MSG_BYE};
    int t = (int)rand_between(&rng, 0, 1) ? daemons[rand_between(&rng, 0, 5)]
                                          : (int)rand_between(&rng, 11, 65535);
    EXPECT_ERR(ingest_message_check(hdr_span(h, t), 1, &type, &e), e, IFD_EPROTO,
               "header: type: expected HELLO (1), BATCH (3), END (6) or BATCH_SHM (10)");
    int frames = (int)rand_between(&rng, 0, 40);
    RC_OK(ingest_message_check(hdr_span(h, IFD_MSG_BATCH), 1 + frames, &type, &e), e);
    ck_assert_int_eq(type, IFD_MSG_BATCH);
    RC_OK(ingest_message_check(hdr_span(h, IFD_MSG_BATCH_SHM), 1 + frames, &type, &e), e);
    ck_assert_int_eq(type, IFD_MSG_BATCH_SHM);
}
END_TEST

START_TEST(hello_and_end_have_their_frame_counts)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_error e;
    uint8_t h[IFD_PROTO_HDR];
    int type;
    RC_OK(ingest_message_check(hdr_span(h, IFD_MSG_HELLO), 2, &type, &e), e);
    ck_assert_int_eq(type, IFD_MSG_HELLO);
    RC_OK(ingest_message_check(hdr_span(h, IFD_MSG_END), 1, &type, &e), e);
    ck_assert_int_eq(type, IFD_MSG_END);
    int n = (int)rand_between(&rng, 0, 1) ? 1 : (int)rand_between(&rng, 3, 30);
    char want[64];
    snprintf(want, sizeof want, "HELLO: expected 2 frames (header, JSON), got %d", n);
    EXPECT_ERR(ingest_message_check(hdr_span(h, IFD_MSG_HELLO), n, &type, &e), e, IFD_EPROTO, want);
    n = (int)rand_between(&rng, 2, 30);
    snprintf(want, sizeof want, "END: expected 1 frame (header), got %d", n);
    EXPECT_ERR(ingest_message_check(hdr_span(h, IFD_MSG_END), n, &type, &e), e, IFD_EPROTO, want);
}
END_TEST

/* ---- HELLO -------------------------------------------------------------------------------- */

/* Parses text as a HELLO of r; the root is freed (h's strings die with it). */
static int hello(run *r, const char *text, ingest_hello *h, ifd_error *e)
{
    json_t *root;
    int rc = ingest_hello_parse(&r->pr, (ingest_span){text, strlen(text)}, &root, h, e);
    RASSERT((rc == IFD_OK) == (root != NULL), "root %p with %s", (void *)root, ifd_errname(rc));
    json_decref(root);
    return rc;
}

/* A HELLO of r's input mode with extra JSON members (",\"key\": v" or ""). */
static char *hello_text(run *r, const char *extra)
{
    static char buf[2048];
    if (r->pr.input_mode == IFD_INPUT_PER_CORE)
        snprintf(buf, sizeof buf, "{\"replica\": %d%s}",
                 (int)rand_between(&r->rng, 0, r->pr.replicas - 1), extra);
    else
        snprintf(buf, sizeof buf, "{\"replica\": null%s}", extra);
    return buf;
}

static void random_name(ifd_rng *rng, char *out, int len)
{
    for (int i = 0; i < len; i++)
        out[i] = (char)('a' + rand_between(rng, 0, 25));
    out[len] = '\0';
}

START_TEST(hello_json_is_one_object_of_known_keys)
{
    run r;
    run_init(&r, ANY_MODE);
    ingest_hello h;
    ifd_error e;
    RC_OK(hello(&r, hello_text(&r, ""), &h, &e), e);
    ck_assert_ptr_null(h.name);
    ck_assert_int_eq(h.first_seq, 0);
    ck_assert_int_eq(h.want_shm, 0);
    size_t big = IFD_PROTO_HELLO_JSON_MAX + (size_t)rand_between(&r.rng, 1, 100);
    char *text = malloc(big + 1);
    memset(text, ' ', big);
    text[0] = '{';
    text[big - 1] = '}';
    text[big] = '\0';
    EXPECT_ERR(hello(&r, text, &h, &e), e, IFD_EPROTO, "HELLO: JSON: expected at most 65536 bytes");
    free(text);
    EXPECT_ERR(hello(&r, "{\"name\": ", &h, &e), e, IFD_EPROTO, "HELLO: JSON: line 1, column");
    EXPECT_ERR(hello(&r, "{\"name\": \"a\", \"name\": \"b\"}", &h, &e), e, IFD_EPROTO,
               "HELLO: JSON: line");
    /* JSON text is an object or an array (JSON_DECODE_ANY is off): a scalar is not JSON here */
    const char *scalars[] = {"\"loader\"", "17", "null"};
    EXPECT_ERR(hello(&r, scalars[rand_between(&r.rng, 0, 2)], &h, &e), e, IFD_EPROTO,
               "HELLO: JSON: line 1");
    const char *arrays[] = {"[1, 2]", "[]", "[{\"name\": \"x\"}]"};
    EXPECT_ERR(hello(&r, arrays[rand_between(&r.rng, 0, 2)], &h, &e), e, IFD_EPROTO,
               "HELLO: expected a JSON object, got");
    char key[20], extra[64], want[96];
    random_name(&r.rng, key, (int)rand_between(&r.rng, 1, 12));
    key[0] = 'z'; /* none of the six */
    snprintf(extra, sizeof extra, ", \"%s\": 1", key);
    snprintf(want, sizeof want,
             "HELLO: unknown key '%s' (expected name, schema, first_seq, replica, shm, role)", key);
    EXPECT_ERR(hello(&r, hello_text(&r, extra), &h, &e), e, IFD_EINVAL, want);
ifd_program_free(&r.prog);
}
END_TEST

START_TEST(hello_name_of_1_to_63_bytes_is_taken)
{
    run r;
    run_init(&r, ANY_MODE);
    ingest_hello h;
    ifd_error e;
    char name[IFD_PROTO_NAME_MAX + 2], extra[128];
    int len = (int)rand_between(&r.rng, 1, IFD_PROTO_NAME_MAX);
    random_name(&r.rng, name, len);
    snprintf(extra, sizeof extra, ", \"name\": \"%s\"", name);
    json_t *root;
    const char *text = hello_text(&r, extra);
    RC_OK(ingest_hello_parse(&r.pr, (ingest_span){text, strlen(text)}, &root, &h, &e), e);
    ck_assert_str_eq(h.name, name);
    json_decref(root);
ifd_program_free(&r.prog);
}
END_TEST

/* role: "eval" marks an eval producer; "train" or no key a train producer. */
START_TEST(hello_role_train_or_eval_is_taken)
{
    run r;
    run_init(&r, ANY_MODE);
    ingest_hello h;
    ifd_error e;
    const char *extras[] = {"", ", \"role\": \"train\"", ", \"role\": \"eval\""};
    int i = (int)rand_between(&r.rng, 0, 2);
    RC_OK(hello(&r, hello_text(&r, extras[i]), &h, &e), e);
    ck_assert_int_eq(h.eval, i == 2);
ifd_program_free(&r.prog);
}
END_TEST

START_TEST(hello_first_seq_from_0_is_taken)
{
    run r;
    run_init(&r, ANY_MODE);
    ingest_hello h;
    ifd_error e;
    char extra[64];
    int64_t seq = rand_between(&r.rng, 0, INT64_MAX);
    snprintf(extra, sizeof extra, ", \"first_seq\": %" PRId64, seq);
    RC_OK(hello(&r, hello_text(&r, extra), &h, &e), e);
    ck_assert_int_eq(h.first_seq, seq);
ifd_program_free(&r.prog);
}
END_TEST

/* A key of the wrong type or range: its sentence names it and what was expected. */
typedef struct key_rule {
    const char *key;
    const char *bad[5];
    const char *sentence;
} key_rule;
static const key_rule key_rules[] = {
    {"name",
     {"\"\"", "17", "null", "[\"a\"]",
      "\"a123456789b123456789c123456789d123456789e123456789f1234567890123\""},
     "HELLO: name: expected a string of 1 to 63 bytes, got"},
    {"first_seq",
     {"-1", "1.5", "\"3\"", "true", "-9223372036854775808"},
     "HELLO: first_seq: expected an integer >= 0, got"},
    {"shm", {"1", "\"true\"", "null", "0", "{}"}, "HELLO: shm: expected true or false, got"},
    {"role",
     {"\"Eval\"", "1", "null", "\"predict\"", "[\"eval\"]"},
     "HELLO: role: expected \"train\" or \"eval\", got"},
};

START_TEST(hello_key_of_the_wrong_type_is_named)
{
    run r;
    run_init(&r, ANY_MODE);
    const key_rule *k = &key_rules[_i % (int)(sizeof key_rules / sizeof key_rules[0])];
    ingest_hello h;
    ifd_error e;
    char extra[128];
    snprintf(extra, sizeof extra, ", \"%s\": %s", k->key, k->bad[rand_between(&r.rng, 0, 4)]);
    EXPECT_ERR(hello(&r, hello_text(&r, extra), &h, &e), e, IFD_EINVAL, k->sentence);
ifd_program_free(&r.prog);
}
END_TEST

START_TEST(hello_replica_is_for_per_core_only)
{
    run r;
    run_init(&r, ANY_MODE);
    ingest_hello h;
    ifd_error e;
    char text[128];
    int rep = (int)rand_between(&r.rng, 0, r.pr.replicas - 1);
    snprintf(text, sizeof text, "{\"replica\": %d}", rep);
    if (r.pr.input_mode == IFD_INPUT_PER_CORE) {
        RC_OK(hello(&r, text, &h, &e), e);
        ck_assert_int_eq(h.replica, rep);
        EXPECT_ERR(hello(&r, "{}", &h, &e), e, IFD_EINVAL,
                   "naming the replica this producer feeds, got no key");
        int out = rand_between(&r.rng, 0, 1) ? -1 - (int)rand_between(&r.rng, 0, 9)
                                             : r.pr.replicas + (int)rand_between(&r.rng, 0, 9);
        snprintf(text, sizeof text, "{\"replica\": %d}", out);
        EXPECT_ERR(hello(&r, text, &h, &e), e, IFD_EINVAL, "HELLO: replica: per-core input with");
        EXPECT_ERR(hello(&r, "{\"replica\": null}", &h, &e), e, IFD_EINVAL, "expected an integer");
        /* an eval producer feeds the one eval set: it may name no replica (or one) */
        RC_OK(hello(&r,
                    rand_between(&r.rng, 0, 1) ? "{\"role\": \"eval\"}"
                                               : "{\"role\": \"eval\", \"replica\": null}",
                    &h, &e),
              e);
        ck_assert_int_eq(h.replica, -1);
        ck_assert_int_eq(h.eval, 1);
        snprintf(text, sizeof text, "{\"role\": \"eval\", \"replica\": %d}", rep);
        RC_OK(hello(&r, text, &h, &e), e);
        ck_assert_int_eq(h.replica, rep);
        EXPECT_ERR(hello(&r, "{\"role\": \"train\"}", &h, &e), e, IFD_EINVAL,
                   "naming the replica this producer feeds, got no key");
    } else {
        EXPECT_ERR(hello(&r, text, &h, &e), e, IFD_EINVAL,
                   "which takes no replica; expected null or no key");
        RC_OK(hello(&r, "{}", &h, &e), e);
        ck_assert_int_eq(h.replica, -1);
    }
ifd_program_free(&r.prog);
}
END_TEST

START_TEST(hello_shm_true_asks_for_a_pool)
{
    run r;
    run_init(&r, ANY_MODE);
    ingest_hello h;
    ifd_error e;
    int want = (int)rand_between(&r.rng, 0, 1);
    RC_OK(hello(&r, hello_text(&r, want ? ", \"shm\": true" : ", \"shm\": false"), &h, &e), e);
    ck_assert_int_eq(h.want_shm, want);
ifd_program_free(&r.prog);
}
END_TEST

/* r's own schema as JSON text, with entry i changed by edit (NULL: unchanged). */
static char *schema_text(run *r, int i, void (*edit)(json_t *t, ifd_rng *rng))
{
    json_t *s = ingest_schema_json(&r->pr);
    if (edit)
        edit(json_array_get(s, (size_t)i), &r->rng);
    char *text = json_dumps(s, JSON_COMPACT);
    json_decref(s);
    static char buf[1024];
    snprintf(buf, sizeof buf, ", \"schema\": %s", text);
    free(text);
    return buf;
}

static void rename_tensor(json_t *t, ifd_rng *rng)
{
    char n[16];
    random_name(rng, n, 9);
    json_object_set_new(t, "name", json_string(n));
}
static void unknown_dtype(json_t *t, ifd_rng *rng)
{
    (void)rng;
    json_object_set_new(t, "dtype", json_string("float16"));
}
static void other_dtype(json_t *t, ifd_rng *rng)
{
    const char *d = json_string_value(json_object_get(t, "dtype"));
    const char *all[] = {"float32", "int32", "int64", "uint8"};
    const char *pick;
    do
        pick = all[rand_between(rng, 0, 3)];
    while (strcmp(pick, d) == 0);
    json_object_set_new(t, "dtype", json_string(pick));
}
static void other_shape(json_t *t, ifd_rng *rng)
{
    json_t *shape = json_object_get(t, "shape");
    json_array_append_new(shape, json_integer(rand_between(rng, 1, 9)));
}
static void negative_dim(json_t *t, ifd_rng *rng)
{
    json_object_set_new(t, "shape", json_pack("[I]", (json_int_t)-rand_between(rng, 1, 9)));
}
static void extra_key(json_t *t, ifd_rng *rng)
{
    (void)rng;
    json_object_set_new(t, "order", json_string("C"));
}

START_TEST(hello_schema_matches_the_program_exactly)
{
    run r;
    run_init(&r, ANY_MODE);
    ingest_hello h;
    ifd_error e;
    RC_OK(hello(&r, hello_text(&r, schema_text(&r, 0, NULL)), &h, &e), e);
    RC_OK(hello(&r, hello_text(&r, ", \"schema\": null"), &h, &e), e);
    int i = (int)rand_between(&r.rng, 0, r.pr.nin - 1);
    EXPECT_ERR(hello(&r, hello_text(&r, schema_text(&r, i, rename_tensor)), &h, &e), e, IFD_ESHAPE,
               "expected name");
    EXPECT_ERR(hello(&r, hello_text(&r, schema_text(&r, i, unknown_dtype)), &h, &e), e, IFD_EDTYPE,
               "dtype: expected one of float32, int32, int64, uint8, got 'float16'");
    EXPECT_ERR(hello(&r, hello_text(&r, schema_text(&r, i, other_dtype)), &h, &e), e, IFD_EDTYPE,
               "': expected dtype");
    EXPECT_ERR(hello(&r, hello_text(&r, schema_text(&r, i, other_shape)), &h, &e), e, IFD_ESHAPE,
               "': expected per-row shape");
    EXPECT_ERR(hello(&r, hello_text(&r, schema_text(&r, i, negative_dim)), &h, &e), e, IFD_ESHAPE,
               "shape: expected at most");
    EXPECT_ERR(hello(&r, hello_text(&r, schema_text(&r, i, extra_key)), &h, &e), e, IFD_EINVAL,
               "expected an object with exactly the keys name (string), dtype (string) and shape");
    EXPECT_ERR(hello(&r, hello_text(&r, ", \"schema\": {\"x\": 1}"), &h, &e), e, IFD_EINVAL,
               "HELLO: schema: expected an array of {name, dtype, shape}, got");
    char want[64];
    snprintf(want, sizeof want, "schema: expected %d tensors for program 'softmax'", r.pr.nin);
    EXPECT_ERR(hello(&r, hello_text(&r, ", \"schema\": []"), &h, &e), e, IFD_ESHAPE, want);
ifd_program_free(&r.prog);
}
END_TEST

/* Predict mode's batches carry no labels: the schema is the features alone. */
START_TEST(hello_schema_in_predict_mode_has_no_labels)
{
    run r;
    run_init(&r, IFD_MODE_PREDICT);
    ck_assert_int_eq(r.pr.nin, 1);
    run t = r;
    t.pr.mode = IFD_MODE_TRAIN;
    ingest_proto_attach(&t.pr, &t.prog);
    ck_assert_int_eq(t.pr.nin, 2);
    ingest_hello h;
    ifd_error e;
    EXPECT_ERR(hello(&r, hello_text(&r, schema_text(&t, 0, NULL)), &h, &e), e, IFD_ESHAPE,
               "schema: expected 1 tensors for program 'softmax' in predict mode");
ifd_program_free(&r.prog);
}
END_TEST

/* ---- BATCH --------------------------------------------------------------------------------
 */

/* A well-formed message of k steps (train, eval) or `rows` rows (predict): its header and
 * frames (random bytes, labels in range). */
typedef struct msg {
    ifd_proto_batch bh;
    int k;
    ingest_span frames[IFD_MAX_INPUTS];
    char *data[IFD_MAX_INPUTS];
} msg;

static void msg_make(run *r, msg *m, int k, int64_t rows)
{
    memset(m, 0, sizeof *m);
    m->k = k;
    m->bh.seq = rand_between(&r->rng, 0, INT64_MAX / 2);
    m->bh.rows = rows;
    m->bh.ntensors = (uint32_t)r->pr.nin;
    for (int i = 0; i < r->pr.nin; i++) {
        size_t n = ingest_tensor_bytes(&r->pr, i, rows);
        m->data[i] = aligned_alloc(64, (n + 63) / 64 * 64 + 64); /* a multiple of 64 */
        if (r->pr.in[i]->dtype == IFD_F32)
            for (size_t j = 0; j < n / 4; j++)
                ((float *)m->data[i])[j] = (float)ifd_rng_uniform(&r->rng);
        else
            for (size_t j = 0; j < n / 4; j++)
                ((int32_t *)m->data[i])[j] =
                    (int32_t)rand_between(&r->rng, 0, r->prog.settings.classes - 1);
        m->frames[i] = (ingest_span){m->data[i], n};
    }
}

static void msg_free(msg *m)
{
    for (int i = 0; i < IFD_MAX_INPUTS; i++)
        free(m->data[i]);
}

/* A run in train or eval mode whose messages may carry several steps. */
static void run_multi(run *r)
{
    run_init(r, IFD_MODE_TRAIN);
    r->pr.mode = rand_between(&r->rng, 0, 1) ? IFD_MODE_TRAIN : IFD_MODE_EVAL;
    r->pr.max_steps = (int)rand_between(&r->rng, 2, 4);
    r->pr.credit = (int)rand_between(&r->rng, r->pr.max_steps, 32);
}

START_TEST(batch_rows_are_k_batches_or_a_partial_in_predict)
{
    run r;
    run_init(&r, ANY_MODE);
    char why[512];
    msg m;
    int64_t b = r.pr.batch_rows;
    int k = (int)rand_between(&r.rng, 1, r.pr.max_steps);
    int64_t rows = r.pr.mode == IFD_MODE_PREDICT ? rand_between(&r.rng, 1, b) : k * b;
    msg_make(&r, &m, k, rows);
    ck_assert_int_eq(ingest_batch_steps(&r.pr, rows), r.pr.mode == IFD_MODE_PREDICT ? 1 : k);
    ck_assert_int_eq(ingest_batch_check(&r.pr, &m.bh, m.k, m.frames, r.pr.nin, why, sizeof why),
                     IFD_OK);
    /* wrong rows: 0, too many, or (train, eval) not a multiple */
    int pick = (int)rand_between(&r.rng, 0, b > 1 && r.pr.mode != IFD_MODE_PREDICT ? 2 : 1);
    int64_t bad[] = {0, b * (r.pr.max_steps + 1),
                     b > 1 ? b + 1 + rand_between(&r.rng, 0, b - 2) : 0};
    m.bh.rows = bad[pick];
    ck_assert_int_eq(ingest_batch_steps(&r.pr, m.bh.rows), 1);
    ck_assert_int_eq(ingest_batch_check(&r.pr, &m.bh, 1, NULL, 0, why, sizeof why), IFD_ESHAPE);
    char want[128];
    snprintf(want, sizeof want, "rows: expected %s%" PRId64,
             r.pr.mode == IFD_MODE_PREDICT ? "1 to " : "", b);
    RASSERT(strstr(why, want) && strstr(why, "got"), "'%s' lacks '%s'", why, want);
    msg_free(&m);
ifd_program_free(&r.prog);
}
END_TEST

/* docs/protocol.md's order: ntensors, tensor count, flags, rows, bytes, seq. A message with
 * every fault from a random one on is answered with that one. */
START_TEST(batch_checks_come_in_the_documented_order)
{
    run r;
    run_init(&r, ANY_MODE);
    char why[512];
    msg m;
    msg_make(&r, &m, 1, r.pr.mode == IFD_MODE_PREDICT ? 1 : r.pr.batch_rows);
    int first = (int)rand_between(&r.rng, 0, 5);
    int nframes = r.pr.nin;
    if (first <= 1) /* a frame too many: the count is wrong (and with it ntensors, or not) */
        nframes = r.pr.nin + 1;
    if (first <= 0)
        m.bh.ntensors = (uint32_t)r.pr.nin;
    else
        m.bh.ntensors = (uint32_t)nframes;
    m.frames[r.pr.nin] = m.frames[0];
    if (first <= 2)
        m.bh.flags = (uint32_t)rand_between(&r.rng, 1, 0xffffffff);
    if (first <= 3)
        m.bh.rows = 0;
    if (first <= 4)
        m.frames[0].len += (size_t)rand_between(&r.rng, 1, 7);
    m.bh.seq = -1 - rand_between(&r.rng, 0, 1000);
    static const int codes[] = {IFD_EPROTO, IFD_ESHAPE, IFD_EINVAL,
                                IFD_ESHAPE, IFD_ESHAPE, IFD_EINVAL};
    static const char *parts[] = {"header ntensors says", "tensor frames (the schema's tensors)",
                                  "flags: expected 0 in", "rows: expected",
                                  "bytes, expected",      "seq: expected an integer >= 0"};
    int rc = ingest_batch_check(&r.pr, &m.bh, 1, m.frames, nframes, why, sizeof why);
    RASSERT(rc == codes[first] && strstr(why, parts[first]),
            "fault %d: expected %s '%s', got %s '%s'", first, ifd_errname(codes[first]),
            parts[first], ifd_errname(rc), why);
    msg_free(&m);
ifd_program_free(&r.prog);
}
END_TEST

START_TEST(batch_frame_bytes_name_the_tensor)
{
    run r;
    run_init(&r, ANY_MODE);
    char why[512];
    msg m;
    msg_make(&r, &m, 1, r.pr.mode == IFD_MODE_PREDICT ? 1 : r.pr.batch_rows);
    int i = (int)rand_between(&r.rng, 0, r.pr.nin - 1);
    size_t want = m.frames[i].len;
    m.frames[i].len = want ? want - (size_t)rand_between(&r.rng, 1, (int64_t)want) : 1;
    ck_assert_int_eq(ingest_batch_check(&r.pr, &m.bh, 1, m.frames, r.pr.nin, why, sizeof why),
                     IFD_ESHAPE);
    char expect[128];
    snprintf(expect, sizeof expect, "tensor '%s' is %zu bytes, expected %zu (%" PRId64 " rows of",
             r.pr.in[i]->name, m.frames[i].len, want, m.bh.rows);
    RASSERT(strstr(why, expect), "'%s' lacks '%s'", why, expect);
    msg_free(&m);
ifd_program_free(&r.prog);
}
END_TEST

/* BATCH_SHM: the same checks, without ntensors (its first slot) and frames (the pool's). */
START_TEST(batch_shm_skips_the_frame_checks)
{
    run r;
    run_init(&r, ANY_MODE);
    char why[512];
    ifd_proto_batch bh = {.seq = rand_between(&r.rng, 0, 1 << 30),
                          .rows = r.pr.mode == IFD_MODE_PREDICT ? 1 : r.pr.batch_rows,
                          .ntensors = (uint32_t)rand_between(&r.rng, 0, 1 << 20)};
    ck_assert_int_eq(ingest_batch_check(&r.pr, &bh, 1, NULL, 0, why, sizeof why), IFD_OK);
    bh.flags = 1;
    ck_assert_int_eq(ingest_batch_check(&r.pr, &bh, 1, NULL, 0, why, sizeof why), IFD_EINVAL);
ifd_program_free(&r.prog);
}
END_TEST

/* Several steps: seq to seq + k - 1 must be representable; k steps cost k credits. */
START_TEST(a_message_of_k_steps_takes_k_sequence_numbers)
{
    run r;
    run_multi(&r);
    char why[512];
    int k = (int)rand_between(&r.rng, 2, r.pr.max_steps);
    msg m;
    msg_make(&r, &m, k, k * r.pr.batch_rows);
    ck_assert_int_eq(ingest_batch_steps(&r.pr, m.bh.rows), k);
    m.bh.seq = INT64_MAX - (k - 1);
    ck_assert_int_eq(ingest_batch_check(&r.pr, &m.bh, k, m.frames, r.pr.nin, why, sizeof why),
                     IFD_OK);
    m.bh.seq = INT64_MAX - rand_between(&r.rng, 0, k - 2);
    ck_assert_int_eq(ingest_batch_check(&r.pr, &m.bh, k, m.frames, r.pr.nin, why, sizeof why),
                     IFD_EINVAL);
    char want[64];
    snprintf(want, sizeof want, "seq: a message of %d steps takes seq to seq + %d", k, k - 1);
    RASSERT(strstr(why, want), "'%s' lacks '%s'", why, want);
    /* its steps are views of batch_size rows each, in order, over the message's bytes */
    ifd_tensor t[IFD_MAX_INPUTS];
    int j = (int)rand_between(&r.rng, 0, k - 1);
    ifd_error e;
    RC_OK(ingest_view_tensors(&r.pr, m.data, j * r.pr.batch_rows, r.pr.batch_rows, t), e);
    for (int i = 0; i < r.pr.nin; i++) {
        ck_assert_int_eq(t[i].shape.dims[0], r.pr.batch_rows);
        ck_assert_int_eq(t[i].shape.rank, r.pr.in[i]->rank + 1);
        ck_assert_ptr_eq(t[i].data, m.data[i] + ingest_tensor_bytes(&r.pr, i, j * r.pr.batch_rows));
    }
    msg_free(&m);
    ifd_program_free(&r.prog);
}
END_TEST

START_TEST(duplicates_are_acked_or_credited_and_a_resent_message_skips_its_taken_steps)
{
    ifd_rng rng;
    seed_rng(&rng);
    int skip;
    int64_t last = rand_between(&rng, 100, INT64_MAX / 2);
    int64_t acked = last - rand_between(&rng, 1, 10);
    int k = (int)rand_between(&rng, 1, 8);
    /* past the last accepted: new */
    ck_assert_int_eq(
        ingest_seq_classify(last, acked, last + 1 + rand_between(&rng, 0, 99), k, &skip),
        INGEST_SEQ_NEW);
    ck_assert_int_eq(skip, 0);
    /* every step consumed: ACK */
    int64_t seq = acked - (k - 1) - rand_between(&rng, 0, 50);
    ck_assert_int_eq(ingest_seq_classify(last, acked, seq, k, &skip), INGEST_SEQ_DUP_ACKED);
    /* the boundaries: its last step the last acknowledged, or one past it */
    ck_assert_int_eq(ingest_seq_classify(last, acked, acked - (k - 1), k, &skip),
                     INGEST_SEQ_DUP_ACKED);
    ck_assert_int_eq(ingest_seq_classify(last, acked, acked + 1 - (k - 1), k, &skip),
                     INGEST_SEQ_DUP_INFLIGHT);
    ck_assert_int_eq(ingest_seq_classify(last, acked, last + 1, k, &skip), INGEST_SEQ_NEW);
    /* all taken, the last not consumed: CREDIT */
    seq = last - (k - 1) - rand_between(&rng, 0, last - acked - 1);
    ck_assert_int_eq(ingest_seq_classify(last, acked, seq, k, &skip), INGEST_SEQ_DUP_INFLIGHT);
    /* its first steps taken before: the rest are new */
    if (k > 1) {
        int taken = (int)rand_between(&rng, 1, k - 1);
        ck_assert_int_eq(ingest_seq_classify(last, acked, last - taken + 1, k, &skip),
                         INGEST_SEQ_NEW);
        ck_assert_int_eq(skip, taken);
    }
    ck_assert_int_eq(ingest_next_seq(last), last + 1);
    ck_assert_int_eq(ingest_next_seq(INT64_MAX), INT64_MAX);
    ck_assert_int_eq(ingest_next_seq(-1), 0);
}
END_TEST

/* The program's checks of the values: labels in [0, classes), floats finite and within
 * max_abs_input; in predict mode no labels come. */
START_TEST(values_are_checked_by_the_program)
{
    run r;
    run_init(&r, ANY_MODE);
    msg m;
    int64_t rows =
        r.pr.mode == IFD_MODE_PREDICT ? rand_between(&r.rng, 1, r.pr.batch_rows) : r.pr.batch_rows;
    msg_make(&r, &m, 1, rows);
    ifd_batch whole;
    ifd_batch_init(&whole);
    whole.rows = rows;
    whole.ntensors = r.pr.nin;
    ifd_error e;
    RC_OK(ingest_view_tensors(&r.pr, m.data, 0, rows, whole.tensors), e);
    RC_OK(ingest_batch_check_values(&r.pr, &whole, &e), e);
    int64_t row = rand_between(&r.rng, 0, rows - 1);
    if (r.pr.mode != IFD_MODE_PREDICT) {
        int32_t *y = (int32_t *)m.data[1];
        int32_t old = y[row];
        y[row] = (int32_t)(rand_between(&r.rng, 0, 1) ? -1 : r.prog.settings.classes);
        EXPECT_ERR(ingest_batch_check_values(&r.pr, &whole, &e), e, IFD_ERANGE, "tensor 'y' row");
        y[row] = old;
    }
    float *x = (float *)m.data[0];
    int64_t at =
        row * r.prog.settings.features + rand_between(&r.rng, 0, r.prog.settings.features - 1);
    x[at] = rand_between(&r.rng, 0, 1) ? NAN : INFINITY;
    EXPECT_ERR(ingest_batch_check_values(&r.pr, &whole, &e), e, IFD_ERANGE,
               "expected a finite value");
    r.pr.check_finite = 0;
    RC_OK(ingest_batch_check_values(&r.pr, &whole, &e), e);
    r.pr.check_finite = 1;
    r.pr.max_abs_input = 10;
    x[at] = 11 + (float)rand_between(&r.rng, 0, 100);
    EXPECT_ERR(ingest_batch_check_values(&r.pr, &whole, &e), e, IFD_ERANGE, "tensor 'x' row");
    msg_free(&m);
ifd_program_free(&r.prog);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ingest_protocol");
    TCase *tc = tu_tcase(s, "header", 30);
    tcase_add_loop_test(tc, header_is_checked_before_its_type, 0, 20);
    tcase_add_loop_test(tc, a_producer_sends_four_types_only, 0, 20);
    tcase_add_loop_test(tc, hello_and_end_have_their_frame_counts, 0, 20);
    tc = tu_tcase(s, "hello", 30);
    tcase_add_loop_test(tc, hello_json_is_one_object_of_known_keys, 0, 20);
    tcase_add_loop_test(tc, hello_name_of_1_to_63_bytes_is_taken, 0, 20);
    tcase_add_loop_test(tc, hello_first_seq_from_0_is_taken, 0, 20);
    tcase_add_loop_test(tc, hello_role_train_or_eval_is_taken, 0, 12);
    tcase_add_loop_test(tc, hello_key_of_the_wrong_type_is_named, 0, 30);
    tcase_add_loop_test(tc, hello_replica_is_for_per_core_only, 0, 30);
    tcase_add_loop_test(tc, hello_shm_true_asks_for_a_pool, 0, 10);
    tcase_add_loop_test(tc, hello_schema_matches_the_program_exactly, 0, 30);
    tcase_add_loop_test(tc, hello_schema_in_predict_mode_has_no_labels, 0, 10);
    tc = tu_tcase(s, "batch", 30);
    tcase_add_loop_test(tc, batch_rows_are_k_batches_or_a_partial_in_predict, 0, 40);
    tcase_add_loop_test(tc, batch_checks_come_in_the_documented_order, 0, 60);
    tcase_add_loop_test(tc, batch_frame_bytes_name_the_tensor, 0, 30);
    tcase_add_loop_test(tc, batch_shm_skips_the_frame_checks, 0, 20);
    tcase_add_loop_test(tc, a_message_of_k_steps_takes_k_sequence_numbers, 0, 30);
    tcase_add_loop_test(
        tc, duplicates_are_acked_or_credited_and_a_resent_message_skips_its_taken_steps, 0, 40);
    tcase_add_loop_test(tc, values_are_checked_by_the_program, 0, 40);
    return tu_run_suite(s);
}
