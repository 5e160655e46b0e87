/*
 * bench_outfeed: what a program's outfeed tensors cost on the cpu backend (issue 21's target: at
 * most 10 % fewer steps/s with 16 floats a row outfed).
 *
 * The program is softmax over D = 16 features and K = 10 classes that also outfeeds its x, 16
 * floats a row ("x16"), beside softmax's class, confidence and label. Every run trains it at
 * batch 256 on R = 2 replicas (per-host), iterations_per_loop 100, from one prebuilt batch (no
 * producer, no allocation measured), in two ways side by side, each repeat running both in turn:
 *
 *   none     nobody takes the outfeed tensors: the steps get no outfeeds and write none
 *   taken    a tensor sink takes every step's tensors: every step writes x16 (and class,
 *            confidence, label), the backend copies them out with the record and the outfeed
 *            thread concatenates both replicas' (the sink itself does nothing)
 *
 * It prints the median and the fastest steps/s of each and the ratios taken / none.
 *
 *   bench_outfeed [--steps N] [--repeat N]
 */
#include "core/rng.h"
#include "bench/static_source.h"
#include "core/thread.h"
#include <infeed/infeed.h>
#include <infeed/program.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROWS 256
#define D 16
#define K 10

typedef struct static_source {
    ifd_batch batch;
    float x[ROWS * D];
    int32_t y[ROWS];
} static_source;

static void source_init(static_source *s)
{
    memset(s, 0, sizeof *s);
    ifd_batch_init(&s->batch);
    ifd_rng rng;
    ifd_rng_seed(&rng, 21);
    for (int i = 0; i < ROWS * D; i++)
        s->x[i] = (float)(2.0 * ifd_rng_uniform(&rng) - 1.0);
    for (int i = 0; i < ROWS; i++)
        s->y[i] = (int32_t)ifd_rng_below(&rng, K);
    s->batch.rows = ROWS;
    s->batch.ntensors = 2;
    int64_t xd[2] = {ROWS, D}, yd[1] = {ROWS};
    ifd_tensor_init(&s->batch.tensors[0], IFD_F32, 2, xd, s->x);
    ifd_tensor_init(&s->batch.tensors[1], IFD_I32, 1, yd, s->y);
    s->batch.refs = 1; /* owned here: never released */
}

/* ---- softmax that also outfeeds x ------------------------------------------------------------ */

static int wide_setup(ifd_program *p, ifd_error *err)
{
    int rc = ifd_program_find("softmax")->setup(p, err);
    int64_t d = D;
    if (rc == IFD_OK && ifd_program_add_outfeed(p, "x16", IFD_F32, 1, 1, &d))
        rc = ifd_error_set(err, IFD_EINTERNAL, "bench_outfeed: x16");
    return rc;
}

static int wide_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                     ifd_error *err)
{
    int rc = ifd_program_find("softmax")->train_step(p, ops, a, err);
    if (rc == IFD_OK && a->outfeeds)
        ops->copy(ops->ctx, a->outfeeds[3], a->inputs[0].data, a->rows * D * 4);
    return rc;
}

static int taken(void *ctx, const ifd_step_tensors *t, ifd_error *err)
{
    (void)t;
    (void)err;
    ++*(int64_t *)ctx;
    return IFD_OK;
}

/* Steps/s of one session; take: with a tensor sink. */
static double steps_per_sec(int take, int64_t steps)
{
    ifd_config cfg;
    ifd_config_defaults(&cfg);
    cfg.program = "wide";
    cfg.settings.features = D;
    cfg.settings.classes = K;
    cfg.replicas = 2;
    cfg.batch_size = ROWS;
    cfg.iterations_per_loop = 100;
    cfg.steps = steps;
    cfg.summary_every = 0;
    static static_source src;
    source_init(&src);
    ifd_session *s;
    ifd_error err;
    ifd_batch_source one = {&ifd_bench_static_ops, &src.batch};
    int64_t seen = 0;
    ifd_tensor_sink sink = {taken, &seen};
    if (ifd_session_create(&s, &cfg, one, &err) ||
        (take && ifd_session_add_tensor_sink(s, &sink))) {
        fprintf(stderr, "bench_outfeed: %s\n", ifd_error_text(&err));
        exit(1);
    }
    int64_t t0 = ifd_clock_ns();
    int rc = ifd_session_run(s, &err);
    int64_t t1 = ifd_clock_ns();
    if (rc || ifd_session_global_step(s) != steps || seen != (take ? steps : 0)) {
        fprintf(stderr, "bench_outfeed: run failed (%lld steps taken): %s\n", (long long)seen,
                ifd_error_text(&err));
        exit(1);
    }
    ifd_session_destroy(s);
    return (double)steps / ((double)(t1 - t0) * 1e-9);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int64_t steps = 3000;
    int repeat = 7;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--steps") == 0)
            steps = atoll(argv[i + 1]);
        else if (strcmp(argv[i], "--repeat") == 0)
            repeat = atoi(argv[i + 1]);
    }
    if (steps < 1 || repeat < 1 || repeat > 100) {
        fprintf(stderr, "usage: bench_outfeed [--steps N >= 1] [--repeat 1..100]\n");
        return 2;
    }
    static ifd_program_class wide;
    wide = *ifd_program_find("softmax");
    wide.name = "wide";
    wide.setup = wide_setup;
    wide.train_step = wide_step;
    if (ifd_program_register(&wide)) {
        fprintf(stderr, "bench_outfeed: cannot register the program\n");
        return 1;
    }
    ifd_log_set_level(IFD_LOG_WARN);
    double v[2][100];
    for (int r = 0; r < repeat; r++)
        for (int take = 0; take < 2; take++)
            v[take][r] = steps_per_sec(take, steps);
    printf("softmax D=%d K=%d, batch %d, R = 2, ipl 100, %lld steps, %d repeats; x16: %d floats a "
           "row outfed\n",
           D, K, ROWS, (long long)steps, repeat, D);
    double med[2], best[2];
    for (int take = 0; take < 2; take++) {
        qsort(v[take], (size_t)repeat, sizeof(double), cmp_double);
        med[take] = v[take][repeat / 2];
        best[take] = v[take][repeat - 1];
        printf("  %-6s median %9.0f steps/s, fastest %9.0f\n", take ? "taken" : "none", med[take],
               best[take]);
    }
    printf("  taken / none: %.3f (median), %.3f (fastest)\n", med[1] / med[0], best[1] / best[0]);
    return 0;
}
