/* Host calls (concatenation in replica order, metrics) and the summary sinks. */
#include "outfeed/outfeed_thread.h"
#include "outfeed/hostcall.h"
#include "outfeed/step_tensors.h"
#include "tests/util/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

START_TEST(concat_in_replica_order)
{
    ifd_rng rng;
    ifd_rng_seed(&rng, 10 + (uint64_t)_i);
    int r = 1 + (int)ifd_rng_below(&rng, 8);
    ifd_outfeed_rec recs[8];
    for (int i = 0; i < r; i++) {
        recs[i].step = 5;
        recs[i].out.loss = (float)ifd_rng_uniform(&rng);
        recs[i].out.correct = (float)ifd_rng_below(&rng, 10);
        recs[i].out.count = 10.0f + (float)i;
    }
    float buf[3 * 8];
    ifd_tensor t[IFD_OUT_NTENSORS];
    ifd_outfeed_concat(recs, r, buf, t);
    for (int k = 0; k < IFD_OUT_NTENSORS; k++) {
        ck_assert_int_eq(t[k].shape.rank, 1);
        ck_assert_int_eq(t[k].shape.dims[0], r);
        ck_assert_int_eq(t[k].dtype, IFD_F32);
    }
    for (int i = 0; i < r; i++) {
        ck_assert_float_eq(((float *)t[IFD_OUT_LOSS].data)[i], recs[i].out.loss);
        ck_assert_float_eq(((float *)t[IFD_OUT_CORRECT].data)[i], recs[i].out.correct);
        ck_assert_float_eq(((float *)t[IFD_OUT_COUNT].data)[i], recs[i].out.count);
    }
    ifd_metrics m = {0};
    ifd_error err;
    ck_assert_int_eq(ifd_metrics_host_call(&m, t, &err), IFD_OK);
    ck_assert_int_eq(ifd_metrics_host_call(&m, t, &err), IFD_OK);
    double loss = 0, correct = 0, count = 0;
    for (int i = 0; i < r; i++) {
        loss += recs[i].out.loss;
        correct += recs[i].out.correct;
        count += recs[i].out.count;
    }
    ck_assert_int_eq(m.steps, 2);
    ck_assert_double_eq_tol(m.loss_sum, 2 * loss, 1e-6);
    ck_assert_double_eq_tol(m.correct, 2 * correct, 1e-9);
    ck_assert_double_eq_tol(m.count, 2 * count, 1e-9);
    recs[r - 1].out.loss = NAN;
    ifd_outfeed_concat(recs, r, buf, t);
    ck_assert_int_eq(ifd_metrics_host_call(&m, t, &err), IFD_ENUMERIC);
    char want[64];
    snprintf(want, sizeof want, "replica %d's loss is nan", r - 1);
    ck_assert_msg(strstr(err.msg, want), "%s", err.msg);
}
END_TEST

START_TEST(jsonl_sink_appends_lines)
{
    char path[] = "/tmp/ifd-test-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ifd_sink *s;
    ifd_error err;
    ck_assert_int_eq(ifd_sink_jsonl_create(&s, path, &err), IFD_OK);
    ifd_summary_writer w = {0};
    ck_assert_int_eq(ifd_summary_writer_add(&w, s), IFD_OK);
    for (int i = 0; i < 5; i++) {
        json_t *j = json_object();
        json_object_set_new(j, "event", json_string("train"));
        json_object_set_new(j, "global_step", json_integer(i));
        ck_assert_int_eq(ifd_summary_emit(&w, j, &err), IFD_OK);
    }
    /* Flushed after every summary: readable before the sink is closed. */
    FILE *f = fopen(path, "r");
    char line[256];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        ck_assert_msg(j != NULL, "line %d: %s", n, line);
        ck_assert_int_eq(json_integer_value(json_object_get(j, "global_step")), n);
        json_decref(j);
        n++;
    }
    fclose(f);
    ck_assert_int_eq(n, 5);
    ifd_sink_destroy(s);
    unlink(path);

    ck_assert_int_eq(ifd_sink_jsonl_create(&s, "/nonexistent-dir/x.jsonl", &err), IFD_EIO);
    ck_assert_ptr_null(s);
    ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent-dir/x.jsonl"));
}
END_TEST

static int failing_write(void *ctx, const char *json, size_t len, ifd_error *err)
{
    (void)ctx;
    (void)json;
    (void)len;
    return ifd_error_set(err, IFD_EIO, "disk full");
}

static const ifd_sink_ops failing_ops = {.write = failing_write};

START_TEST(one_failing_sink_does_not_starve_the_others)
{
    ifd_sink *bad, *good;
    ck_assert_int_eq(ifd_sink_create(&bad, &failing_ops, NULL), IFD_OK);
    ck_assert_int_eq(ifd_sink_memory_create(&good), IFD_OK);
    ifd_summary_writer w = {0};
    ifd_summary_writer_add(&w, bad);
    ifd_summary_writer_add(&w, good);
    ifd_error err;
    json_t *j = json_pack("{s:s, s:i}", "event", "end", "global_step", 3);
    ck_assert_int_eq(ifd_summary_emit(&w, j, &err), IFD_EIO);
    ck_assert_str_eq(err.msg, "disk full");
    ck_assert_uint_eq(ifd_sink_memory_count(good), 1);
    char *line = ifd_sink_memory_get(good, 0);
    ck_assert_str_eq(line, "{\"event\":\"end\",\"global_step\":3}");
    free(line);
    ck_assert_ptr_null(ifd_sink_memory_get(good, 1));
    ifd_sink_destroy(bad);
    ifd_sink_destroy(good);
}
END_TEST

/* Eval on several hosts: the records of a padding batch's shards (from.padding) count nothing in
 * a step's concatenated tensors: no row of a per-row tensor, no value of a per-replica-step one
 * (the program's and the runtime's loss, correct, count); the others' come in replica order. */
START_TEST(padding_records_are_left_out_of_the_step)
{
    ifd_rng rng;
    ifd_rng_seed(&rng, 40 + (uint64_t)_i);
    ifd_program p;
    memset(&p, 0, sizeof p);
    int64_t w = 1 + (int64_t)ifd_rng_below(&rng, 4), dims[1] = {w};
    ck_assert_int_eq(ifd_program_add_outfeed(&p, "row", IFD_F32, 1, 1, dims), IFD_OK);
    ck_assert_int_eq(ifd_program_add_outfeed(&p, "rs", IFD_I32, 0, 0, NULL), IFD_OK);
    int R = 2 + (int)ifd_rng_below(&rng, 5);
    int64_t max_rows = 1 + (int64_t)ifd_rng_below(&rng, 9);
    int64_t offs[IFD_MAX_OUTFEEDS];
    int64_t area = ifd_program_outfeed_layout(&p, max_rows, offs);
    unsigned char *mem = calloc((size_t)R, (size_t)area);
    ifd_outfeed_rec recs[6];
    memset(recs, 0, sizeof recs);
    float want_rows[6 * 9 * 4];
    int32_t want_rs[6];
    float want_loss[6];
    int64_t nrows = 0, nkept = 0;
    for (int r = 0; r < R; r++) {
        ifd_outfeed_rec *rec = &recs[r];
        rec->from.padding = r == 0 ? 0 : ifd_rng_below(&rng, 2) == 0; /* replica 0 counts */
        rec->rows = 1 + (int64_t)ifd_rng_below(&rng, (uint64_t)max_rows);
        rec->out.loss = (float)ifd_rng_uniform(&rng);
        rec->out.count = (float)rec->rows;
        rec->outfeed = mem + (size_t)r * (size_t)area;
        float *row = (float *)(void *)(mem + (size_t)r * (size_t)area + offs[0]);
        int32_t *rs = (int32_t *)(void *)(mem + (size_t)r * (size_t)area + offs[1]);
        for (int64_t k = 0; k < rec->rows * w; k++)
            row[k] = (float)(r * 1000 + k);
        *rs = 7 * r + 1;
        if (rec->from.padding)
            continue;
        memcpy(want_rows + nrows * w, row, (size_t)(rec->rows * w) * sizeof(float));
        nrows += rec->rows;
        want_rs[nkept] = *rs;
        want_loss[nkept++] = rec->out.loss;
    }
    ifd_outfeed_tensors c;
    ck_assert_int_eq(ifd_outfeed_tensors_init(&c, &p, IFD_MODE_EVAL, R, max_rows, NULL), IFD_OK);
    ifd_error err;
    ck_assert_int_eq(ifd_outfeed_tensors_step(&c, recs, R, NULL, NULL, &err), IFD_OK);
    int row = ifd_outfeed_tensors_find(&c, "row"), rs = ifd_outfeed_tensors_find(&c, "rs"),
        loss = ifd_outfeed_tensors_find(&c, "loss");
    ck_assert_int_eq(c.tensors[row].shape.dims[0], nrows);
    ck_assert_int_eq(c.tensors[rs].shape.dims[0], nkept);
    ck_assert_int_eq(c.tensors[loss].shape.dims[0], nkept);
    ck_assert(memcmp(c.tensors[row].data, want_rows, (size_t)(nrows * w) * sizeof(float)) == 0);
    ck_assert(memcmp(c.tensors[rs].data, want_rs, (size_t)nkept * sizeof(int32_t)) == 0);
    ck_assert(memcmp(c.tensors[loss].data, want_loss, (size_t)nkept * sizeof(float)) == 0);
    ifd_outfeed_tensors_fini(&c);
    free(mem);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("outfeed");
    TCase *tc = tcase_create("outfeed");
    tcase_set_timeout(tc, 30);
    tcase_add_loop_test(tc, concat_in_replica_order, 0, 10);
    tcase_add_loop_test(tc, padding_records_are_left_out_of_the_step, 0, 20);
    tcase_add_test(tc, jsonl_sink_appends_lines);
    tcase_add_test(tc, one_failing_sink_does_not_starve_the_others);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
