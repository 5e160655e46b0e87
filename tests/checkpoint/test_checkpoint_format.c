/* The checkpoint file format (infeed/checkpoint.h): random checkpoints round trip; every
 * corruption (cut, a flipped byte, another magic or version, shapes of too many floats, bad host
 * tables) is refused with a sentence naming the file; a config that does not fit is named. */
#include "tests/util/testutil.h"

#include <infeed/checkpoint.h>
#include "checkpoint/object.h" /* tests set a checkpoint's step in place */
#include "tests/util/checkpoints.h"
#include "tests/util/files.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

START_TEST(round_trip)
{
    ifd_rng rng;
    seed_rng(&rng);
    char *dir = tu_tmp_dir("ifd-ckpt-test");
    for (int iter = 0; iter < 20; iter++) {
        ifd_config cfg;
        tu_ckpt_random_config(&cfg, &rng);
        ifd_checkpoint *c = tu_ckpt_random(&cfg, &rng), *back = NULL;
        char path[512];
        ifd_error err;
        int rc = ifd_checkpoint_save(c, dir, 100, path, sizeof path, &err);
        RASSERT(rc == IFD_OK, "save: %s", err.msg);
        rc = ifd_checkpoint_load(path, &back, &err);
        RASSERT(rc == IFD_OK, "load: %s", err.msg);
        tu_ckpt_assert_same(c, back);
        RASSERT(ifd_checkpoint_check(back, &cfg, &err) == IFD_OK, "check: %s", err.msg);
        /* producers are sorted and findable */
        for (int i = 1; i < ifd_checkpoint_producer_count(back); i++)
            ck_assert_int_lt(strcmp(ifd_checkpoint_producer_name(back, i - 1),
                                    ifd_checkpoint_producer_name(back, i)),
                             0);
        int64_t seq;
        if (ifd_checkpoint_producer_count(back)) {
            ck_assert_int_eq(
                ifd_checkpoint_find_producer(back, ifd_checkpoint_producer_name(back, 0), &seq),
                IFD_OK);
            ck_assert_int_eq(seq, ifd_checkpoint_producer_seq(back, 0));
        }
        ck_assert_int_eq(ifd_checkpoint_find_producer(back, "not-there-0", &seq), IFD_ENOTFOUND);
        ifd_checkpoint_free(c);
        ifd_checkpoint_free(back);
    }
    tu_rm_dir(dir);
}
END_TEST

/* The file of one random checkpoint, and its layout. */
typedef struct sample {
    char *dir;
    char path[512];
    uint8_t *bytes;
    size_t len;
    uint32_t hlen;
} sample;

static void sample_make(sample *s, ifd_rng *rng)
{
    ifd_config cfg;
    tu_ckpt_random_config(&cfg, rng);
    ifd_checkpoint *c = tu_ckpt_random(&cfg, rng);
    s->dir = tu_tmp_dir("ifd-ckpt-test");
    ifd_error err;
    ck_assert_int_eq(ifd_checkpoint_save(c, s->dir, 1, s->path, sizeof s->path, &err), IFD_OK);
    ifd_checkpoint_free(c);
    s->bytes = tu_slurp(s->path, &s->len);
    s->hlen = (uint32_t)s->bytes[12] | (uint32_t)s->bytes[13] << 8 | (uint32_t)s->bytes[14] << 16 |
              (uint32_t)s->bytes[15] << 24;
}

static void sample_free(sample *s)
{
    free(s->bytes);
    tu_rm_dir(s->dir);
}

/* Loads bytes written to the sample's path; expects IFD_EPROTO with every fragment in the
 * sentence. */
static void expect_bad(const sample *s, const uint8_t *b, size_t len, const char *what,
                       const char *frag1, const char *frag2)
{
    tu_spit(s->path, b, len);
    ifd_checkpoint *c = NULL;
    ifd_error err;
    ifd_error_clear(&err);
    int rc = ifd_checkpoint_load(s->path, &c, &err);
    RASSERT(rc == IFD_EPROTO && c == NULL, "%s: expected EPROTO, got %s (%s)", what,
            ifd_errname(rc), err.msg);
    RASSERT(strstr(err.msg, s->path) != NULL, "%s: the sentence does not name the file: %s", what,
            err.msg);
    RASSERT(frag1 == NULL || strstr(err.msg, frag1), "%s: expected '%s' in: %s", what, frag1,
            err.msg);
    RASSERT(frag2 == NULL || strstr(err.msg, frag2), "%s: expected '%s' in: %s", what, frag2,
            err.msg);
}

START_TEST(truncated)
{
    ifd_rng rng;
    seed_rng(&rng);
    sample s;
    sample_make(&s, &rng);
    size_t cuts[] = {0,
                     7,
                     19,
                     16 + s.hlen / 2,
                     16 + s.hlen + 3,
                     s.len - 5,
                     s.len - 1,
                     (size_t)rand_between(&rng, 0, (int64_t)s.len - 1)};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "cut at %zu of %zu", cuts[i], s.len);
        expect_bad(&s, s.bytes, cuts[i], what, "truncated", NULL);
    }
    uint8_t *longer = malloc(s.len + 3);
    memcpy(longer, s.bytes, s.len);
    memset(longer + s.len, 0, 3);
    expect_bad(&s, longer, s.len + 3, "3 bytes appended", "trailing bytes", NULL);
    free(longer);
    sample_free(&s);
}
END_TEST

START_TEST(flipped_byte)
{
    ifd_rng rng;
    seed_rng(&rng);
    sample s;
    sample_make(&s, &rng);
    uint8_t *b = malloc(s.len);
    for (int iter = 0; iter < 40; iter++) {
        memcpy(b, s.bytes, s.len);
        /* anywhere after the magic and version (those have their own sentences) */
        size_t at = (size_t)rand_between(&rng, 12, (int64_t)s.len - 1);
        b[at] ^= (uint8_t)(1u << rand_between(&rng, 0, 7));
        char what[64];
        snprintf(what, sizeof what, "byte %zu of %zu flipped", at, s.len);
        /* the header length, a header byte or the data: a size, JSON or checksum error */
        tu_spit(s.path, b, s.len);
        ifd_checkpoint *c = NULL;
        ifd_error err;
        int rc = ifd_checkpoint_load(s.path, &c, &err);
        RASSERT(rc == IFD_EPROTO && c == NULL, "%s: expected EPROTO, got %s", what,
                ifd_errname(rc));
        if (at >= 16 + s.hlen)
            RASSERT(strstr(err.msg, "checksum") != NULL, "%s: %s", what, err.msg);
    }
    free(b);
    sample_free(&s);
}
END_TEST

START_TEST(wrong_magic_and_version)
{
    ifd_rng rng;
    seed_rng(&rng);
    sample s;
    sample_make(&s, &rng);
    uint8_t *b = malloc(s.len);
    memcpy(b, s.bytes, s.len);
    memcpy(b, "PK\x03\x04zip!", 8);
    expect_bad(&s, b, s.len, "a zip file", "magic", "IFDCKPT");
    memcpy(b, s.bytes, s.len);
    b[8] = 2;
    expect_bad(&s, b, s.len, "version 2", "version: expected 1, got 2", NULL);
    free(b);
    /* and a file that is not there */
    ifd_checkpoint *c;
    ifd_error err;
    char missing[600];
    snprintf(missing, sizeof missing, "%s/none.ifdckpt", s.dir);
    ck_assert_int_eq(ifd_checkpoint_load(missing, &c, &err), IFD_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(err.msg, "none.ifdckpt"));
    sample_free(&s);
}
END_TEST

/* The sample with its JSON header replaced by h's text, with a right size and checksum. */
static uint8_t *with_header(const sample *s, json_t *h, size_t *len)
{
    char *text = json_dumps(h, JSON_COMPACT);
    size_t hlen = strlen(text), data = s->len - 16 - s->hlen - 4;
    *len = 16 + hlen + data + 4;
    uint8_t *b = malloc(*len);
    memcpy(b, s->bytes, 12);
    for (int i = 0; i < 4; i++)
        b[12 + i] = (uint8_t)(hlen >> (8 * i));
    memcpy(b + 16, text, hlen);
    memcpy(b + 16 + hlen, s->bytes + 16 + s->hlen, data);
    uint32_t crc = (uint32_t)crc32(0, b, (uInt)(*len - 4));
    for (int i = 0; i < 4; i++)
        b[*len - 4 + i] = (uint8_t)(crc >> (8 * i));
    free(text);
    return b;
}

/* The sample's JSON header, parsed. */
static json_t *sample_header(const sample *s)
{
    json_t *h = json_loadb((const char *)s->bytes + 16, s->hlen, 0, NULL);
    ck_assert_ptr_nonnull(h);
    return h;
}

/* The sample with h as its header is refused (expect_bad). */
static void expect_bad_header(const sample *s, json_t *h, const char *what, const char *frag1,
                              const char *frag2)
{
    size_t len;
    uint8_t *bytes = with_header(s, h, &len);
    expect_bad(s, bytes, len, what, frag1, frag2);
    free(bytes);
}

/* The sample with h as its header, loaded (or the test fails, naming what). */
static ifd_checkpoint *load_with_header(const sample *s, json_t *h, const char *what)
{
    size_t len;
    uint8_t *bytes = with_header(s, h, &len);
    tu_spit(s->path, bytes, len);
    free(bytes);
    ifd_checkpoint *ck = NULL;
    ifd_error err;
    RASSERT(ifd_checkpoint_load(s->path, &ck, &err) == IFD_OK, "%s: %s", what, err.msg);
    return ck;
}

/* Found while writing fuzz_checkpoint (fuzz/README.md): each dimension was checked against
 * 2^40 alone, and their product overflowed int64 (undefined behaviour) before the count was
 * compared. */
START_TEST(shape_of_too_many_floats)
{
    ifd_rng rng;
    seed_rng(&rng);
    sample s;
    sample_make(&s, &rng);
    json_t *h = sample_header(&s);
    json_t *p0 = json_array_get(json_object_get(h, "params"), 0);
    ck_assert_ptr_nonnull(p0);
    /* a product beyond 2^63, and one just beyond 2^40 */
    int64_t a = ((int64_t)1 << 40) - rand_between(&rng, 0, 1000);
    int64_t b = ((int64_t)1 << 40) - rand_between(&rng, 0, 1000);
    int64_t c = rand_between(&rng, 2, 1 << 20);
    int64_t shapes[2][2] = {{a, b}, {c, ((int64_t)1 << 40) / c + 1}};
    for (int i = 0; i < 2; i++) {
        json_object_set_new(
            p0, "shape", json_pack("[I, I]", (json_int_t)shapes[i][0], (json_int_t)shapes[i][1]));
        char what[96], frag[96];
        snprintf(what, sizeof what, "shape [%lld, %lld]", (long long)shapes[i][0],
                 (long long)shapes[i][1]);
        snprintf(frag, sizeof frag, "got dimension 1 of %lld after %lld floats",
                 (long long)shapes[i][1], (long long)shapes[i][0]);
        expect_bad_header(&s, h, what, "'params[0].shape': expected at most 2^40 floats", frag);
    }
    /* The same header with the original shape still loads. */
    json_decref(h);
    h = sample_header(&s);
    ifd_checkpoint_free(load_with_header(&s, h, "the rewritten header"));
    json_decref(h);
    sample_free(&s);
}
END_TEST

/* Several hosts' tables: "hosts" and "host_producers" must agree, each entry a producer map. */
START_TEST(bad_host_tables)
{
    ifd_rng rng;
    seed_rng(&rng);
    sample s;
    sample_make(&s, &rng);
    json_t *h = sample_header(&s);
    int hosts = (int)rand_between(&rng, 2, 6);
    json_object_set_new(h, "hosts", json_integer(hosts));
    json_object_del(h, "host_producers"); /* the sample may be of several hosts */
    /* no array, one table short, one too many, a table that is not a map, a bad seq */
    json_t *tables = json_array();
    for (int i = 0; i < hosts; i++)
        json_array_append_new(tables,
                              json_pack("{s:I}", "p", (json_int_t)rand_between(&rng, 0, 99)));
    expect_bad_header(&s, h, "no host_producers", "'host_producers': expected an array", NULL);
    json_t *shorter = json_deep_copy(tables);
    json_array_remove(shorter, 0);
    json_object_set_new(h, "host_producers", shorter);
    char frag[64];
    snprintf(frag, sizeof frag, "expected %d objects", hosts);
    expect_bad_header(&s, h, "one table short", frag, NULL);
    int at = (int)rand_between(&rng, 0, hosts - 1);
    json_t *bad = json_deep_copy(tables);
    json_array_set_new(bad, (size_t)at, json_string("x"));
    json_object_set_new(h, "host_producers", bad);
    snprintf(frag, sizeof frag, "'host_producers[%d]': expected an object", at);
    expect_bad_header(&s, h, "a table that is not a map", frag, NULL);
    bad = json_deep_copy(tables);
    json_object_set_new(json_array_get(bad, (size_t)at), "q", json_integer(-1));
    json_object_set_new(h, "host_producers", bad);
    snprintf(frag, sizeof frag, "host_producers[%d]", at);
    expect_bad_header(&s, h, "a negative seq", frag, "expected >= 0");
    json_object_set_new(h, "hosts", json_integer(0));
    expect_bad_header(&s, h, "0 hosts", "'hosts'", NULL);
    /* the right tables load, each host's own */
    json_object_set_new(h, "hosts", json_integer(hosts));
    json_object_set(h, "host_producers", tables);
    ifd_checkpoint *ck = load_with_header(&s, h, "good tables");
    ifd_error err;
    ck_assert_int_eq(ifd_checkpoint_hosts(ck), hosts);
    for (int i = 0; i < hosts; i++) {
        ck_assert_int_eq(ifd_checkpoint_select_host(ck, i, &err), IFD_OK);
        int64_t seq;
        ck_assert_int_eq(ifd_checkpoint_find_producer(ck, "p", &seq), IFD_OK);
        ck_assert_int_eq(
            seq, json_integer_value(json_object_get(json_array_get(tables, (size_t)i), "p")));
    }
    ifd_checkpoint_free(ck);
    json_decref(tables);
    json_decref(h);
    sample_free(&s);
}
END_TEST

START_TEST(check_names_the_difference)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_config cfg;
    tu_ckpt_random_config(&cfg, &rng);
    cfg.program = "softmax";
    cfg.optimizer.kind = IFD_OPT_ADAM;
    ifd_checkpoint *c = tu_ckpt_random(&cfg, &rng);
    ifd_error err;
    ifd_config other = cfg;
    other.program = "linear";
    ck_assert_int_eq(ifd_checkpoint_check(c, &other, &err), IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, "program") && strstr(err.msg, "'softmax'") &&
                      strstr(err.msg, "'linear'"),
                  "%s", err.msg);
    other = cfg;
    other.settings.classes++;
    ck_assert_int_eq(ifd_checkpoint_check(c, &other, &err), IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, "settings.classes"), "%s", err.msg);
    other = cfg;
    other.optimizer.kind = IFD_OPT_MOMENTUM;
    ck_assert_int_eq(ifd_checkpoint_check(c, &other, &err), IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, "optimizer") && strstr(err.msg, "adam") &&
                      strstr(err.msg, "momentum"),
                  "%s", err.msg);
    /* eval takes the parameters only: another optimizer is fine, and so is a learning rate */
    other.mode = IFD_MODE_EVAL;
    ck_assert_int_eq(ifd_checkpoint_check(c, &other, &err), IFD_OK);
    other = cfg;
    other.optimizer.learning_rate *= 2;
    ck_assert_int_eq(ifd_checkpoint_check(c, &other, &err), IFD_OK);
    ifd_checkpoint_free(c);
}
END_TEST

/* Train mode continues the checkpoint's learning-rate schedule: another lr_schedule,
 * warmup_steps or decay_steps is refused with a sentence naming both; the rates, the decay and
 * the clipping may change, as the learning rate; eval and predict take any. */
START_TEST(check_refuses_another_schedule)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_config cfg;
    tu_ckpt_random_config(&cfg, &rng);
    cfg.optimizer.lr_schedule = (ifd_lr_schedule)rand_between(&rng, 1, 2);
    cfg.optimizer.warmup_steps = rand_between(&rng, 0, 50);
    cfg.optimizer.decay_steps = cfg.optimizer.warmup_steps + rand_between(&rng, 1, 1000);
    ifd_checkpoint *c = tu_ckpt_random(&cfg, &rng);
    ifd_error err;
    for (int change = 0; change < 3; change++) {
        ifd_config other = cfg;
        if (change == 0)
            other.optimizer.lr_schedule = IFD_LR_CONSTANT;
        else if (change == 1)
            other.optimizer.warmup_steps++;
        else
            other.optimizer.decay_steps += rand_between(&rng, 1, 9);
        RASSERT(ifd_checkpoint_check(c, &other, &err) == IFD_EINVAL, "change %d accepted", change);
        char want[128];
        snprintf(want, sizeof want, "schedule is %s with warmup_steps %lld and decay_steps %lld",
                 ifd_lr_schedule_name(cfg.optimizer.lr_schedule),
                 (long long)cfg.optimizer.warmup_steps, (long long)cfg.optimizer.decay_steps);
        RASSERT(strstr(err.msg, want) &&
                    strstr(err.msg, ifd_lr_schedule_name(other.optimizer.lr_schedule)),
                "change %d: '%s', want '%s'", change, err.msg, want);
        other.mode = IFD_MODE_EVAL;
        RASSERT(ifd_checkpoint_check(c, &other, &err) == IFD_OK, "eval: %s", err.msg);
    }
    ifd_config other = cfg;
    other.optimizer.min_learning_rate /= 2;
    other.optimizer.clip_norm += 1.0f;
    other.optimizer.weight_decay *= 3;
    RASSERT(ifd_checkpoint_check(c, &other, &err) == IFD_OK, "%s", err.msg);
    ifd_checkpoint_free(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("checkpoint_format");
    TCase *tc = tu_tcase(s, "format", 60);
    tcase_add_test(tc, round_trip);
    tcase_add_test(tc, truncated);
    tcase_add_test(tc, flipped_byte);
    tcase_add_test(tc, wrong_magic_and_version);
    tcase_add_test(tc, shape_of_too_many_floats);
    tcase_add_test(tc, bad_host_tables);
    tcase_add_test(tc, check_names_the_difference);
    tcase_add_test(tc, check_refuses_another_schedule);
    return tu_run_suite(s);
}
