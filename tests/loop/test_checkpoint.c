/* Checkpoints: the file format (round trips, every corruption), the folder (latest, pruning,
 * atomic writes), the hook (when it writes, what it keeps) and resuming a session from one. */
#include "core/thread.h"
#include "infeed/checkpoint.h"
#include "loop/checkpoint_internal.h" /* tests set a checkpoint's step in place */
#include "tests/util/testutil.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* ---- helpers ------------------------------------------------------------------------------- */

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*len + 1);
    ck_assert_uint_eq(fread(b, 1, *len, f), *len);
    fclose(f);
    return b;
}

static void spit(const char *path, const uint8_t *b, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(b, 1, len, f), len);
    fclose(f);
}

/* A random config: linear or softmax over random sizes, a random optimizer. */
static void random_config(ifd_config *cfg, ifd_rng *rng)
{
    ifd_config_defaults(cfg);
    cfg->program = rand_between(rng, 0, 1) ? "softmax" : "linear";
    cfg->settings.features = rand_between(rng, 1, 40);
    cfg->settings.classes = rand_between(rng, 2, 12);
    cfg->optimizer.kind = (ifd_optimizer_kind)rand_between(rng, 0, 2);
    cfg->optimizer.learning_rate = (float)rand_between(rng, 1, 1000) / 1000.0f;
    cfg->num_steps = 1;
}

static float rand_float(ifd_rng *rng)
{
    return (float)((double)ifd_rng_below(rng, 1u << 24) / (double)(1u << 23) - 1.0);
}

static ifd_checkpoint *random_checkpoint(const ifd_config *cfg, ifd_rng *rng)
{
    ifd_program p;
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&p, cfg->program, &cfg->settings, &err), IFD_OK);
    int64_t n = p.nparam_floats, ns = n * (cfg->optimizer.kind == IFD_OPT_ADAM       ? 2
                                           : cfg->optimizer.kind == IFD_OPT_MOMENTUM ? 1
                                                                                     : 0);
    float *params = malloc(sizeof(float) * (size_t)n),
          *slots = malloc(sizeof(float) * (size_t)(ns + 1));
    for (int64_t i = 0; i < n; i++)
        params[i] = rand_float(rng);
    for (int64_t i = 0; i < ns; i++)
        slots[i] = rand_float(rng);
    ifd_checkpoint *c;
    int rc = ifd_checkpoint_create(&c, cfg, rand_between(rng, 0, INT64_C(1) << 40),
                                   rand_between(rng, 0, 1 << 30), params, slots, &err);
    ck_assert_msg(rc == IFD_OK, "%s", err.msg);
    /* a third of them of several hosts, each with its own producers */
    int hosts = rand_between(rng, 0, 2) == 0 ? (int)rand_between(rng, 2, 5) : 1;
    ck_assert_int_eq(ifd_checkpoint_set_hosts(c, hosts, &err), IFD_OK);
    for (int h = 0; h < hosts; h++) {
        ck_assert_int_eq(ifd_checkpoint_select_host(c, h, &err), IFD_OK);
        int np = (int)rand_between(rng, 0, 12);
        for (int i = 0; i < np; i++) {
            char name[IFD_CHECKPOINT_NAME_MAX + 1];
            int len = (int)rand_between(rng, 1, IFD_CHECKPOINT_NAME_MAX);
            for (int j = 0; j < len; j++)
                name[j] = (char)rand_between(rng, 'a', 'z');
            name[len] = '\0';
            ck_assert_int_eq(
                ifd_checkpoint_set_producer(c, name, rand_between(rng, 0, INT64_MAX), &err),
                IFD_OK);
        }
    }
    ck_assert_int_eq(ifd_checkpoint_select_host(c, hosts, &err), IFD_EINVAL);
    ck_assert_int_eq(ifd_checkpoint_select_host(c, 0, &err), IFD_OK);
    free(params);
    free(slots);
    return c;
}

static void assert_same(const ifd_checkpoint *a, const ifd_checkpoint *b)
{
    ck_assert_str_eq(ifd_checkpoint_program(a), ifd_checkpoint_program(b));
    ck_assert_int_eq(ifd_checkpoint_global_step(a), ifd_checkpoint_global_step(b));
    ck_assert_int_eq(ifd_checkpoint_opt_step(a), ifd_checkpoint_opt_step(b));
    ck_assert_mem_eq(ifd_checkpoint_settings(a), ifd_checkpoint_settings(b),
                     sizeof(ifd_program_settings));
    const ifd_optimizer *oa = ifd_checkpoint_optimizer(a), *ob = ifd_checkpoint_optimizer(b);
    ck_assert_int_eq(oa->kind, ob->kind);
    ck_assert_float_eq(oa->learning_rate, ob->learning_rate);
    int64_t n = ifd_checkpoint_nparam_floats(a);
    ck_assert_int_eq(n, ifd_checkpoint_nparam_floats(b));
    ck_assert_int_eq(ifd_checkpoint_slot_count(a), ifd_checkpoint_slot_count(b));
    ck_assert_mem_eq(ifd_checkpoint_params(a), ifd_checkpoint_params(b), sizeof(float) * (size_t)n);
    if (ifd_checkpoint_slot_count(a))
        ck_assert_mem_eq(ifd_checkpoint_slots(a), ifd_checkpoint_slots(b),
                         sizeof(float) * (size_t)n * (size_t)ifd_checkpoint_slot_count(a));
    /* every host's producers (the selection is put back to host 0) */
    ck_assert_int_eq(ifd_checkpoint_hosts(a), ifd_checkpoint_hosts(b));
    ifd_checkpoint *ma = (ifd_checkpoint *)a, *mb = (ifd_checkpoint *)b;
    ifd_error err;
    for (int h = ifd_checkpoint_hosts(a) - 1; h >= 0; h--) {
        ck_assert_int_eq(ifd_checkpoint_select_host(ma, h, &err), IFD_OK);
        ck_assert_int_eq(ifd_checkpoint_select_host(mb, h, &err), IFD_OK);
        ck_assert_int_eq(ifd_checkpoint_producer_count(a), ifd_checkpoint_producer_count(b));
        for (int i = 0; i < ifd_checkpoint_producer_count(a); i++) {
            ck_assert_str_eq(ifd_checkpoint_producer_name(a, i),
                             ifd_checkpoint_producer_name(b, i));
            ck_assert_int_eq(ifd_checkpoint_producer_seq(a, i), ifd_checkpoint_producer_seq(b, i));
        }
    }
}

/* ---- the format ---------------------------------------------------------------------------- */

START_TEST(round_trip)
{
    ifd_rng rng;
    seed_rng(&rng);
    char *dir = tu_tmp_dir();
    for (int iter = 0; iter < 20; iter++) {
        ifd_config cfg;
        random_config(&cfg, &rng);
        ifd_checkpoint *c = random_checkpoint(&cfg, &rng), *back = NULL;
        char path[512];
        ifd_error err;
        int rc = ifd_checkpoint_save(c, dir, 100, path, sizeof path, &err);
        RASSERT(rc == IFD_OK, "save: %s", err.msg);
        rc = ifd_checkpoint_load(path, &back, &err);
        RASSERT(rc == IFD_OK, "load: %s", err.msg);
        assert_same(c, back);
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
    random_config(&cfg, rng);
    ifd_checkpoint *c = random_checkpoint(&cfg, rng);
    s->dir = tu_tmp_dir();
    ifd_error err;
    ck_assert_int_eq(ifd_checkpoint_save(c, s->dir, 1, s->path, sizeof s->path, &err), IFD_OK);
    ifd_checkpoint_free(c);
    s->bytes = slurp(s->path, &s->len);
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
    spit(s->path, b, len);
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
        spit(s.path, b, s.len);
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

/* Found while writing fuzz_checkpoint (fuzz/README.md): each dimension was checked against
 * 2^40 alone, and their product overflowed int64 (undefined behaviour) before the count was
 * compared. */
START_TEST(shape_of_too_many_floats)
{
    ifd_rng rng;
    seed_rng(&rng);
    sample s;
    sample_make(&s, &rng);
    json_t *h = json_loadb((const char *)s.bytes + 16, s.hlen, 0, NULL);
    ck_assert_ptr_nonnull(h);
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
        size_t len;
        uint8_t *bytes = with_header(&s, h, &len);
        char what[96], frag[96];
        snprintf(what, sizeof what, "shape [%lld, %lld]", (long long)shapes[i][0],
                 (long long)shapes[i][1]);
        snprintf(frag, sizeof frag, "got dimension 1 of %lld after %lld floats",
                 (long long)shapes[i][1], (long long)shapes[i][0]);
        expect_bad(&s, bytes, len, what, "'params[0].shape': expected at most 2^40 floats", frag);
        free(bytes);
    }
    /* The same header with the original shape still loads. */
    json_decref(h);
    h = json_loadb((const char *)s.bytes + 16, s.hlen, 0, NULL);
    size_t len;
    uint8_t *bytes = with_header(&s, h, &len);
    spit(s.path, bytes, len);
    ifd_checkpoint *ck = NULL;
    ifd_error err;
    RASSERT(ifd_checkpoint_load(s.path, &ck, &err) == IFD_OK, "the rewritten header: %s", err.msg);
    ifd_checkpoint_free(ck);
    free(bytes);
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
    json_t *h = json_loadb((const char *)s.bytes + 16, s.hlen, 0, NULL);
    ck_assert_ptr_nonnull(h);
    int hosts = (int)rand_between(&rng, 2, 6);
    json_object_set_new(h, "hosts", json_integer(hosts));
    json_object_del(h, "host_producers"); /* the sample may be of several hosts */
    /* no array, one table short, one too many, a table that is not a map, a bad seq */
    json_t *tables = json_array();
    for (int i = 0; i < hosts; i++)
        json_array_append_new(tables,
                              json_pack("{s:I}", "p", (json_int_t)rand_between(&rng, 0, 99)));
    size_t len;
    uint8_t *bytes = with_header(&s, h, &len);
    expect_bad(&s, bytes, len, "no host_producers", "'host_producers': expected an array", NULL);
    free(bytes);
    json_t *shorter = json_deep_copy(tables);
    json_array_remove(shorter, 0);
    json_object_set_new(h, "host_producers", shorter);
    bytes = with_header(&s, h, &len);
    char frag[64];
    snprintf(frag, sizeof frag, "expected %d objects", hosts);
    expect_bad(&s, bytes, len, "one table short", frag, NULL);
    free(bytes);
    int at = (int)rand_between(&rng, 0, hosts - 1);
    json_t *bad = json_deep_copy(tables);
    json_array_set_new(bad, (size_t)at, json_string("x"));
    json_object_set_new(h, "host_producers", bad);
    bytes = with_header(&s, h, &len);
    snprintf(frag, sizeof frag, "'host_producers[%d]': expected an object", at);
    expect_bad(&s, bytes, len, "a table that is not a map", frag, NULL);
    free(bytes);
    bad = json_deep_copy(tables);
    json_object_set_new(json_array_get(bad, (size_t)at), "q", json_integer(-1));
    json_object_set_new(h, "host_producers", bad);
    bytes = with_header(&s, h, &len);
    snprintf(frag, sizeof frag, "host_producers[%d]", at);
    expect_bad(&s, bytes, len, "a negative seq", frag, "expected >= 0");
    free(bytes);
    json_object_set_new(h, "hosts", json_integer(0));
    bytes = with_header(&s, h, &len);
    expect_bad(&s, bytes, len, "0 hosts", "'hosts'", NULL);
    free(bytes);
    /* the right tables load, each host's own */
    json_object_set_new(h, "hosts", json_integer(hosts));
    json_object_set(h, "host_producers", tables);
    bytes = with_header(&s, h, &len);
    spit(s.path, bytes, len);
    ifd_checkpoint *ck = NULL;
    ifd_error err;
    RASSERT(ifd_checkpoint_load(s.path, &ck, &err) == IFD_OK, "good tables: %s", err.msg);
    ck_assert_int_eq(ifd_checkpoint_hosts(ck), hosts);
    for (int i = 0; i < hosts; i++) {
        ck_assert_int_eq(ifd_checkpoint_select_host(ck, i, &err), IFD_OK);
        int64_t seq;
        ck_assert_int_eq(ifd_checkpoint_find_producer(ck, "p", &seq), IFD_OK);
        ck_assert_int_eq(
            seq, json_integer_value(json_object_get(json_array_get(tables, (size_t)i), "p")));
    }
    ifd_checkpoint_free(ck);
    free(bytes);
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
    random_config(&cfg, &rng);
    cfg.program = "softmax";
    cfg.optimizer.kind = IFD_OPT_ADAM;
    ifd_checkpoint *c = random_checkpoint(&cfg, &rng);
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

/* ---- the folder ---------------------------------------------------------------------------- */

START_TEST(latest_and_prune)
{
    ifd_rng rng;
    seed_rng(&rng);
    char *dir = tu_tmp_dir();
    char path[512];
    ifd_error err;
    ck_assert_int_eq(ifd_checkpoint_latest(dir, path, sizeof path, &err), IFD_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(err.msg, "no checkpoint"));
    ck_assert_int_eq(ifd_checkpoint_latest("/nonexistent/ifd", path, sizeof path, &err),
                     IFD_ENOTFOUND);
    ifd_config cfg;
    random_config(&cfg, &rng);
    ifd_checkpoint *c;
    ck_assert_int_eq(ifd_checkpoint_create(&c, &cfg, 0, 0, NULL, NULL, &err), IFD_OK);
    /* steps in random order, beyond the 12 digits of the name too; junk and a killed write's
     * temporary file beside them */
    int64_t steps[] = {700, 5, INT64_C(2000000000000), 31, 1200, 64};
    char junk[600];
    snprintf(junk, sizeof junk, "%s/ckpt-12x.ifdckpt", dir);
    spit(junk, (const uint8_t *)"x", 1);
    snprintf(junk, sizeof junk, "%s/.ckpt-000000009999.ifdckpt.tmp-1", dir);
    spit(junk, (const uint8_t *)"partial", 7);
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        c->global_step = steps[i];
        ck_assert_int_eq(ifd_checkpoint_save(c, dir, 100, NULL, 0, &err), IFD_OK);
    }
    ifd_checkpoint_free(c);
    ck_assert_int_eq(ifd_checkpoint_latest(dir, path, sizeof path, &err), IFD_OK);
    ck_assert_ptr_nonnull(strstr(path, "ckpt-2000000000000.ifdckpt"));
    /* the temporary file went with the first prune */
    ck_assert_int_ne(access(junk, F_OK), 0);
    ck_assert_int_eq(ifd_checkpoint_prune(dir, 2, &err), IFD_OK);
    int64_t left[16];
    ck_assert_int_eq(tu_checkpoint_steps(dir, left, 16), 2);
    ck_assert_int_eq(left[0], 1200);
    ck_assert_int_eq(left[1], INT64_C(2000000000000));
    ck_assert_int_eq(ifd_checkpoint_prune(dir, 0, &err), IFD_EINVAL);
    ck_assert_int_eq(ifd_checkpoint_latest(dir, path, 10, &err), IFD_ERANGE);
    tu_rm_dir(dir);
}
END_TEST

typedef struct atomic_args {
    const char *dir;
    ifd_checkpoint *c;
    int saves;
    int done; /* atomic */
} atomic_args;

static void *writer(void *arg)
{
    atomic_args *a = arg;
    ifd_error err;
    for (int i = 1; i <= a->saves; i++) {
        a->c->global_step = i;
        ck_assert_int_eq(ifd_checkpoint_save(a->c, a->dir, 2, NULL, 0, &err), IFD_OK);
    }
    __atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Readers never see a partial checkpoint: every file under a checkpoint name loads, while
 * another thread writes large ones and prunes. */
START_TEST(atomic_writes)
{
    char *dir = tu_tmp_dir();
    ifd_config cfg;
    ifd_config_defaults(&cfg);
    cfg.program = "linear";
    cfg.settings.features = 1024;
    cfg.settings.classes = 256; /* 256 Ki floats, 3 MiB with Adam's slots */
    cfg.optimizer.kind = IFD_OPT_ADAM;
    ifd_error err;
    atomic_args a = {.dir = dir, .saves = 30};
    ck_assert_int_eq(ifd_checkpoint_create(&a.c, &cfg, 0, 0, NULL, NULL, &err), IFD_OK);
    ifd_thread t;
    ck_assert_int_eq(ifd_thread_start(&t, "ckpt-writer", writer, &a), 0);
    int loads = 0;
    while (!__atomic_load_n(&a.done, __ATOMIC_ACQUIRE)) {
        char path[512];
        if (ifd_checkpoint_latest(dir, path, sizeof path, &err) != IFD_OK)
            continue;
        ifd_checkpoint *c;
        int rc = ifd_checkpoint_load(path, &c, &err);
        /* pruned between the listing and the load is fine; a partial file is not */
        ck_assert_msg(rc == IFD_OK || rc == IFD_ENOTFOUND, "%s", err.msg);
        if (rc == IFD_OK) {
            loads++;
            ifd_checkpoint_free(c);
        }
    }
    ifd_thread_join(&t);
    ck_assert_int_gt(loads, 0);
    int64_t left[8];
    ck_assert_int_eq(tu_checkpoint_steps(dir, left, 8), 2);
    ck_assert_int_eq(left[1], 30);
    ifd_checkpoint_free(a.c);
    tu_rm_dir(dir);
}
END_TEST

/* Damages the file at path: cut at a random length, or one random byte changed to another. */
static void damage(const char *path, ifd_rng *rng, char *what, size_t len)
{
    size_t n;
    uint8_t *b = slurp(path, &n);
    if (rand_between(rng, 0, 1)) {
        size_t cut = (size_t)rand_between(rng, 0, (int64_t)n - 1);
        snprintf(what, len, "cut to %zu of %zu bytes", cut, n);
        spit(path, b, cut);
    } else {
        size_t at = (size_t)rand_between(rng, 0, (int64_t)n - 1);
        b[at] ^= (uint8_t)rand_between(rng, 1, 255);
        snprintf(what, len, "byte %zu of %zu changed", at, n);
        spit(path, b, n);
    }
    free(b);
}

/* Runs ifd_checkpoint_load_latest with stderr (the log) going to a file; returns the log. */
static char *load_latest_logged(const char *dir, int set_aside, ifd_checkpoint **c, char *path,
                                size_t len, ifd_error *err, int *rc)
{
    char log[600];
    snprintf(log, sizeof log, "%s.log", dir);
    fflush(stderr);
    int saved = dup(2), fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    dup2(fd, 2);
    close(fd);
    *rc = ifd_checkpoint_load_latest(dir, set_aside, c, path, len, err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    size_t n;
    char *text = (char *)slurp(log, &n);
    text[n] = '\0';
    unlink(log);
    return text;
}

/* The newest checkpoint that loads is taken; newer damaged ones are skipped with a warning
 * naming each and its problem, and set aside on request; when none loads, the error names the
 * newest and nothing is renamed. A killed writer's temporary file is never a candidate. */
START_TEST(latest_skips_damaged)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int trial = 0; trial < 12; trial++) {
        char *dir = tu_tmp_dir();
        ifd_config cfg;
        random_config(&cfg, &rng);
        ifd_checkpoint *c = random_checkpoint(&cfg, &rng);
        ifd_error err;
        int n = (int)rand_between(&rng, 1, 6), ndamaged = (int)rand_between(&rng, 0, n);
        int set_aside = (int)rand_between(&rng, 0, 1);
        int64_t steps[6];
        char paths[6][512];
        for (int i = 0; i < n; i++) {
            steps[i] = (i ? steps[i - 1] : 0) + rand_between(&rng, 1, 1000);
            c->global_step = steps[i];
            ck_assert_int_eq(ifd_checkpoint_save(c, dir, 100, paths[i], sizeof paths[i], &err),
                             IFD_OK);
        }
        /* a complete checkpoint, newer than all, under a temporary name */
        char tmp[600];
        snprintf(tmp, sizeof tmp, "%s/.ckpt-%012lld.ifdckpt.tmp-77", dir,
                 (long long)steps[n - 1] + 1);
        size_t len;
        uint8_t *whole = slurp(paths[n - 1], &len);
        spit(tmp, whole, len);
        free(whole);
        char what[6][96];
        for (int i = n - ndamaged; i < n; i++)
            damage(paths[i], &rng, what[i], sizeof what[i]);
        ifd_checkpoint *got = NULL;
        char path[512];
        int rc;
        char *log = load_latest_logged(dir, set_aside, &got, path, sizeof path, &err, &rc);
        char ctx[160];
        snprintf(ctx, sizeof ctx,
                 "trial %d: %d checkpoints, the newest %d damaged (%s), set_aside %d", trial, n,
                 ndamaged, ndamaged ? what[n - 1] : "-", set_aside);
        int good = n - ndamaged - 1;
        if (good < 0) {
            RASSERT(rc == IFD_EPROTO && got == NULL, "%s: expected EPROTO, got %s", ctx,
                    ifd_errname(rc));
            RASSERT(strstr(err.msg, n == 1 ? "its only checkpoint does not load" : "none of its") &&
                        strstr(err.msg, paths[n - 1]),
                    "%s: %s", ctx, err.msg);
            RASSERT(strstr(log, "damaged") == NULL, "%s: logged: %s", ctx, log);
            for (int i = 0; i < n; i++)
                RASSERT(access(paths[i], F_OK) == 0, "%s: '%s' was moved", ctx, paths[i]);
        } else {
            RASSERT(rc == IFD_OK, "%s: %s", ctx, err.msg);
            ck_assert_str_eq(path, paths[good]);
            ck_assert_int_eq(ifd_checkpoint_global_step(got), steps[good]);
            ck_assert_mem_eq(ifd_checkpoint_params(got), ifd_checkpoint_params(c),
                             sizeof(float) * (size_t)ifd_checkpoint_nparam_floats(c));
            for (int i = good + 1; i < n; i++) {
                char aside[600];
                snprintf(aside, sizeof aside, "%s" IFD_CHECKPOINT_DAMAGED, paths[i]);
                RASSERT(strstr(log, paths[i]) != NULL, "%s: no warning names '%s': %s", ctx,
                        paths[i], log);
                RASSERT((access(paths[i], F_OK) == 0) == !set_aside &&
                            (access(aside, F_OK) == 0) == set_aside,
                        "%s: '%s' %s", ctx, paths[i], set_aside ? "not set aside" : "moved");
            }
            RASSERT(ndamaged ? strstr(log, "warn") != NULL : strstr(log, "damaged") == NULL,
                    "%s: log: %s", ctx, log);
            int64_t latest;
            ck_assert_int_eq(ifd_checkpoint_latest_step(dir, &latest, &err), IFD_OK);
            ck_assert_int_eq(latest, set_aside ? steps[good] : steps[n - 1]);
            /* a second look finds the same, and with the damaged set aside, warns no more */
            ifd_checkpoint *again = NULL;
            char *log2 = load_latest_logged(dir, set_aside, &again, path, sizeof path, &err, &rc);
            ck_assert_int_eq(rc, IFD_OK);
            ck_assert_int_eq(ifd_checkpoint_global_step(again), steps[good]);
            RASSERT(!set_aside || strstr(log2, "damaged") == NULL, "%s: %s", ctx, log2);
            free(log2);
            ifd_checkpoint_free(again);
        }
        RASSERT(strstr(log, ".tmp-77") == NULL, "%s: the temporary file was looked at", ctx);
        ck_assert_int_eq(access(tmp, F_OK), 0); /* only a writer's prune removes them */
        free(log);
        ifd_checkpoint_free(got);
        ifd_checkpoint_free(c);
        /* rm_dir removes files, the .damaged ones too */
        tu_rm_dir(dir);
    }
}
END_TEST

/* ---- the hook and resuming ----------------------------------------------------------------- */

typedef struct positions {
    int calls;
} positions;

static int add_positions(void *arg, ifd_checkpoint *c, ifd_error *err)
{
    positions *p = arg;
    p->calls++;
    return ifd_checkpoint_set_producer(c, "loader-0", 100 + ifd_checkpoint_global_step(c), err);
}

/* Checkpoints at the first loop end at or past each multiple of every, and at the end; keep
 * the newest keep. */
START_TEST(hook_schedule)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int iter = 0; iter < 4; iter++) {
        int64_t ipl = rand_between(&rng, 1, 7), every = rand_between(&rng, 0, 12),
                steps = rand_between(&rng, 1, 40);
        int keep = (int)rand_between(&rng, 1, 4);
        ifd_config cfg;
        tu_config_train(&cfg, "softmax", IFD_OPT_MOMENTUM, 3, 2, 4, ipl, 7);
        cfg.num_steps = steps;
        tu_batch **bs = tu_batches_random(&cfg, steps, 11);
        char *dir = tu_tmp_dir();
        positions pos = {0};
        ifd_checkpoint_options o = {.dir = dir,
                                    .every = every,
                                    .keep = keep,
                                    .positions = add_positions,
                                    .positions_arg = &pos};
        ifd_hook h;
        ifd_error err;
        ck_assert_int_eq(ifd_hook_checkpoint(&h, &o, &err), IFD_OK);
        tu_result res;
        tu_run_hooks(&cfg, bs, steps, &h, 1, &res);
        RASSERT(res.rc == IFD_OK && res.global_step == steps, "run: %s", res.err.msg);
        /* what the schedule says */
        int64_t want[64];
        int nwant = 0;
        for (int64_t gs = 0, prev = 0; gs < steps; prev = gs) {
            gs = gs + ipl < steps ? gs + ipl : steps;
            if (every > 0 && gs / every > prev / every)
                want[nwant++] = gs;
        }
        if (nwant == 0 || want[nwant - 1] != steps)
            want[nwant++] = steps;
        RASSERT(pos.calls == nwant, "ipl %lld every %lld steps %lld: %d checkpoints, expected %d",
                (long long)ipl, (long long)every, (long long)steps, pos.calls, nwant);
        int64_t got[64];
        int ngot = tu_checkpoint_steps(dir, got, 64);
        int nkept = nwant < keep ? nwant : keep;
        RASSERT(ngot == nkept, "kept %d, expected %d", ngot, nkept);
        for (int i = 0; i < ngot; i++)
            RASSERT(got[i] == want[nwant - nkept + i], "kept step %lld, expected %lld",
                    (long long)got[i], (long long)want[nwant - nkept + i]);
        /* the last one is the run's end state */
        char path[512];
        ck_assert_int_eq(ifd_checkpoint_latest(dir, path, sizeof path, &err), IFD_OK);
        ifd_checkpoint *c;
        ck_assert_int_eq(ifd_checkpoint_load(path, &c, &err), IFD_OK);
        ck_assert_int_eq(ifd_checkpoint_global_step(c), steps);
        ck_assert_int_eq(ifd_checkpoint_opt_step(c), steps);
        ck_assert_mem_eq(ifd_checkpoint_params(c), res.params, sizeof(float) * (size_t)res.nparams);
        int64_t seq;
        ck_assert_int_eq(ifd_checkpoint_find_producer(c, "loader-0", &seq), IFD_OK);
        ck_assert_int_eq(seq, 100 + steps);
        ifd_checkpoint_free(c);
        tu_result_free(&res);
        tu_batches_free(bs, steps);
        tu_rm_dir(dir);
    }
}
END_TEST

/* Interrupted at a checkpoint and resumed from it, a run ends with the same bits as one that
 * was not: the parameters, the optimizer slots and its update count, the global step. */
START_TEST(resume_equals_uninterrupted)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_optimizer_kind kind = (ifd_optimizer_kind)_i;
    int replicas = (int)rand_between(&rng, 1, 3);
    int64_t total = rand_between(&rng, 6, 30), cut = rand_between(&rng, 1, total - 1);
    ifd_config cfg;
    tu_config_train(&cfg, rand_between(&rng, 0, 1) ? "softmax" : "linear", kind,
                    rand_between(&rng, 1, 6), rand_between(&rng, 2, 5), 2 * replicas * 3,
                    rand_between(&rng, 1, 5), 3);
    cfg.replicas = replicas;
    cfg.num_steps = 0;
    cfg.last_step = total;
    tu_batch **bs = tu_batches_random(&cfg, total, 5);
    tu_result full;
    tu_run(&cfg, bs, total, &full);
    RASSERT(full.rc == IFD_OK && full.global_step == total, "%s", full.err.msg);

    /* the first part ends at cut with a checkpoint */
    char *dir = tu_tmp_dir();
    ifd_checkpoint_options o = {.dir = dir, .every = 0, .keep = 1};
    ifd_hook h;
    ifd_error err;
    ck_assert_int_eq(ifd_hook_checkpoint(&h, &o, &err), IFD_OK);
    ifd_config first = cfg;
    first.last_step = cut;
    tu_result a;
    tu_run_hooks(&first, bs, cut, &h, 1, &a);
    RASSERT(a.rc == IFD_OK && a.global_step == cut, "%s", a.err.msg);
    char path[512];
    ck_assert_int_eq(ifd_checkpoint_latest(dir, path, sizeof path, &err), IFD_OK);
    ifd_checkpoint *c;
    ck_assert_int_eq(ifd_checkpoint_load(path, &c, &err), IFD_OK);
    ck_assert_int_eq(ifd_checkpoint_global_step(c), cut);

    /* the rest from the checkpoint, with num_steps counting from it */
    ifd_config second = cfg;
    second.last_step = 0;
    second.num_steps = total - cut;
    second.restore = c;
    ck_assert_int_eq(ifd_hook_checkpoint(&h, &o, &err), IFD_OK);
    tu_result b;
    tu_run_hooks(&second, bs + cut, total - cut, &h, 1, &b);
    RASSERT(b.rc == IFD_OK && b.global_step == total, "%s", b.err.msg);
    RASSERT(memcmp(b.params, full.params, sizeof(float) * (size_t)full.nparams) == 0,
            "%s, %d replicas, cut at %lld of %lld: resumed params differ (max rel diff %g)",
            ifd_optimizer_name(kind), replicas, (long long)cut, (long long)total,
            tu_max_rel_diff(b.params, full.params, full.nparams, 1e-6));
    ck_assert(b.mirrors_identical);
    /* the final checkpoint has the slots an uninterrupted run would have: compare to a run
     * that checkpoints at its end */
    ifd_checkpoint *end, *ref;
    ck_assert_int_eq(ifd_checkpoint_latest(dir, path, sizeof path, &err), IFD_OK);
    ck_assert_int_eq(ifd_checkpoint_load(path, &end, &err), IFD_OK);
    ck_assert_int_eq(ifd_checkpoint_global_step(end), total);
    ck_assert_int_eq(ifd_checkpoint_opt_step(end), total);
    char *dir2 = tu_tmp_dir();
    o.dir = dir2;
    ck_assert_int_eq(ifd_hook_checkpoint(&h, &o, &err), IFD_OK);
    tu_result again;
    tu_run_hooks(&cfg, bs, total, &h, 1, &again);
    ck_assert_int_eq(ifd_checkpoint_latest(dir2, path, sizeof path, &err), IFD_OK);
    ck_assert_int_eq(ifd_checkpoint_load(path, &ref, &err), IFD_OK);
    assert_same(end, ref);
    /* the end summary counts the steps of this run */
    json_t *last = json_loads(b.summaries[b.nsummaries - 1], 0, NULL);
    ck_assert_str_eq(json_string_value(json_object_get(last, "event")), "end");
    ck_assert_int_eq(json_integer_value(json_object_get(last, "global_step")), total);
    ck_assert_int_eq(json_integer_value(json_object_get(last, "steps")), total - cut);
    json_decref(last);
    ifd_checkpoint_free(c);
    ifd_checkpoint_free(end);
    ifd_checkpoint_free(ref);
    tu_result_free(&full);
    tu_result_free(&a);
    tu_result_free(&b);
    tu_result_free(&again);
    tu_batches_free(bs, total);
    tu_rm_dir(dir);
    tu_rm_dir(dir2);
}
END_TEST

/* A session refuses a checkpoint that does not fit, before it opens anything. */
START_TEST(session_refuses_a_misfit)
{
    ifd_config cfg;
    tu_config_train(&cfg, "softmax", IFD_OPT_SGD, 4, 3, 4, 2, 1);
    ifd_checkpoint *c;
    ifd_error err;
    ck_assert_int_eq(ifd_checkpoint_create(&c, &cfg, 10, 10, NULL, NULL, &err), IFD_OK);
    ifd_batch_queue *q;
    ck_assert_int_eq(ifd_batch_queue_create(&q, 1), IFD_OK);
    ifd_session *s = NULL;
    ifd_config other = cfg;
    other.settings.features = 5;
    other.restore = c;
    ck_assert_int_eq(ifd_session_create(&s, &other, ifd_batch_queue_source(q), &err), IFD_EINVAL);
    ck_assert_ptr_null(s);
    ck_assert_msg(strstr(err.msg, "settings.features"), "%s", err.msg);
    other = cfg;
    other.restore = c;
    other.initial_global_step = 3;
    ck_assert_int_eq(ifd_session_create(&s, &other, ifd_batch_queue_source(q), &err), IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, "initial_global_step"), "%s", err.msg);
    other.initial_global_step = 10;
    ck_assert_int_eq(ifd_session_create(&s, &other, ifd_batch_queue_source(q), &err), IFD_OK);
    ck_assert_int_eq(ifd_session_global_step(s), 10);
    ifd_session_destroy(s);
    ifd_batch_queue_destroy(q);
    ifd_checkpoint_free(c);
}
END_TEST

/* A run whose input ends early (or that is stopped) writes its state at the end all the same,
 * unless it ran no step. */
START_TEST(end_checkpoint_when_the_input_ends)
{
    ifd_rng rng;
    seed_rng(&rng);
    int64_t have = rand_between(&rng, 0, 12);
    ifd_config cfg;
    tu_config_train(&cfg, "linear", IFD_OPT_ADAM, 3, 2, 4, 5, 1);
    cfg.num_steps = 100;
    tu_batch **bs = tu_batches_random(&cfg, have, 1);
    char *dir = tu_tmp_dir();
    ifd_checkpoint_options o = {.dir = dir, .every = 0, .keep = 5};
    ifd_hook h;
    ifd_error err;
    ck_assert_int_eq(ifd_hook_checkpoint(&h, &o, &err), IFD_OK);
    tu_result res;
    tu_run_hooks(&cfg, bs, have, &h, 1, &res);
    ck_assert_int_eq(res.rc, IFD_OK);
    ck_assert_int_eq(res.reason, IFD_END_INPUT_ENDED);
    int64_t got[8];
    int n = tu_checkpoint_steps(dir, got, 8);
    RASSERT(n == (have > 0), "%lld batches: %d checkpoints", (long long)have, n);
    if (n)
        ck_assert_int_eq(got[0], have);
    tu_result_free(&res);
    tu_batches_free(bs, have);
    tu_rm_dir(dir);
}
END_TEST

/* per-host-v2: input that ends inside a step (its batches released untrained, but counted as
 * handed out by the source) writes no end checkpoint; input that ends between steps does. */
START_TEST(no_end_checkpoint_after_a_dropped_step)
{
    ifd_rng rng;
    seed_rng(&rng);
    int R = (int)rand_between(&rng, 2, 4);
    int64_t have = rand_between(&rng, 1, 12), per = rand_between(&rng, 1, 4);
    ifd_config cfg;
    tu_config_train(&cfg, "linear", IFD_OPT_SGD, 3, 2, per * R, rand_between(&rng, 1, 5), 1);
    cfg.replicas = R;
    cfg.input_mode = IFD_INPUT_PER_HOST_V2;
    cfg.num_steps = 100;
    ifd_program p;
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&p, cfg.program, &cfg.settings, &err), IFD_OK);
    tu_batch **bs = calloc((size_t)have, sizeof *bs);
    for (int64_t i = 0; i < have; i++)
        bs[i] = tu_batch_random(&p, per, i, &rng);
    char *dir = tu_tmp_dir();
    ifd_checkpoint_options o = {.dir = dir, .every = 0, .keep = 5};
    ifd_hook h;
    ck_assert_int_eq(ifd_hook_checkpoint(&h, &o, &err), IFD_OK);
    tu_result res;
    tu_run_hooks(&cfg, bs, have, &h, 1, &res);
    ck_assert_int_eq(res.rc, IFD_OK);
    int64_t got[8], steps = have / R;
    int n = tu_checkpoint_steps(dir, got, 8);
    int want = steps > 0 && have % R == 0;
    RASSERT(n == want, "R=%d, %lld batches: %d end checkpoints, expected %d", R, (long long)have, n,
            want);
    if (n)
        ck_assert_int_eq(got[0], steps);
    RASSERT(res.global_step == steps, "global step %lld, expected %lld", (long long)res.global_step,
            (long long)steps);
    tu_result_free(&res);
    tu_batches_free(bs, have);
    tu_rm_dir(dir);
}
END_TEST

/* A run that fails writes no checkpoint at its end (its state may be half a step). */
static int fail_at;
static int64_t calls; /* atomic */
static int failing_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                        ifd_error *err)
{
    if (__atomic_add_fetch(&calls, 1, __ATOMIC_ACQ_REL) == fail_at)
        return ifd_error_set(err, IFD_ENUMERIC, "injected");
    return tu_softmax_step(p, ops, a, err);
}

START_TEST(no_checkpoint_after_an_error)
{
    fail_at = 8;
    ifd_config cfg;
    tu_config_train(&cfg, "ckpt-fault", IFD_OPT_SGD, 3, 2, 4, 5, 1);
    cfg.num_steps = 20;
    tu_batch **bs = tu_batches_random(&cfg, 20, 1);
    char *dir = tu_tmp_dir();
    ifd_checkpoint_options o = {.dir = dir, .every = 5, .keep = 5};
    ifd_hook h;
    ifd_error err;
    ck_assert_int_eq(ifd_hook_checkpoint(&h, &o, &err), IFD_OK);
    tu_result res;
    tu_run_hooks(&cfg, bs, 20, &h, 1, &res);
    ck_assert_int_eq(res.rc, IFD_ENUMERIC);
    int64_t got[8];
    ck_assert_int_eq(tu_checkpoint_steps(dir, got, 8), 1);
    ck_assert_int_eq(got[0], 5);
    tu_result_free(&res);
    tu_batches_free(bs, 20);
    tu_rm_dir(dir);
}
END_TEST

int main(void)
{
    tu_register_softmax_like("ckpt-fault", failing_step);
    Suite *s = suite_create("checkpoint");
    TCase *tc = tcase_create("format");
    tcase_add_test(tc, round_trip);
    tcase_add_test(tc, truncated);
    tcase_add_test(tc, flipped_byte);
    tcase_add_test(tc, wrong_magic_and_version);
    tcase_add_test(tc, shape_of_too_many_floats);
    tcase_add_test(tc, bad_host_tables);
    tcase_add_test(tc, check_names_the_difference);
    suite_add_tcase(s, tc);
    tc = tcase_create("folder");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, latest_and_prune);
    tcase_add_test(tc, atomic_writes);
    tcase_add_test(tc, latest_skips_damaged);
    suite_add_tcase(s, tc);
    tc = tcase_create("hook");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, hook_schedule);
    tcase_add_loop_test(tc, resume_equals_uninterrupted, IFD_OPT_SGD, IFD_OPT_ADAM + 1);
    tcase_add_test(tc, session_refuses_a_misfit);
    tcase_add_test(tc, end_checkpoint_when_the_input_ends);
    tcase_add_loop_test(tc, no_end_checkpoint_after_a_dropped_step, 0, 8);
    tcase_add_test(tc, no_checkpoint_after_an_error);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
