/*
 * bench_overhead: the host overhead per step of the runtime on the cpu backend, and the loop
 * length the session chooses itself against a sweep of fixed ones.
 *
 * A tiny program (linear, D = K = 1, one row per replica) runs cfg.steps steps at
 * iterations_per_loop 1, 10, 100, 1000 and 10000 and at auto (loop_kind IFD_LOOP_AUTO, the
 * default bound of 0.5 s) with R = 1 and 2, the runs of one repeat side by side (each repeat
 * runs every length once, in turn). The batch source hands out one prebuilt batch, so no producer
 * or allocation is measured. The compute of one replica's step (the same program step and
 * optimizer, called directly in a loop) is measured in the same run; the overhead per step is the
 * session's wall time per step minus that compute time. Each row gives the median run and the
 * fastest (on a shared machine, the least disturbed); a line after auto's row gives its mean loop
 * length and its steps/s over the best fixed length's, by either measure.
 *
 *   bench_overhead [--steps N] [--repeat N]
 */
#include "bench/bench_util.h"
#include "core/thread.h"
#include "device/step.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct static_source {
    ifd_batch batch;
    float x[8], y[8];
} static_source;

static void source_init(static_source *s, int rows)
{
    memset(s, 0, sizeof *s);
    ifd_batch_init(&s->batch);
    s->batch.rows = rows;
    s->batch.ntensors = 2;
    for (int i = 0; i < rows; i++) {
        s->x[i] = 0.5f + 0.1f * (float)i;
        s->y[i] = 1.0f;
    }
    int64_t dims[2] = {rows, 1};
    ifd_tensor_init(&s->batch.tensors[0], IFD_F32, 2, dims, s->x);
    ifd_tensor_init(&s->batch.tensors[1], IFD_F32, 2, dims, s->y);
    s->batch.refs = 1; /* owned here: never released */
}

/* ipl 0: auto */
static void config_for(ifd_config *cfg, int replicas, int64_t ipl, int64_t steps)
{
    ifd_config_defaults(cfg);
    cfg->program = "linear";
    cfg->settings.features = 1;
    cfg->settings.classes = 1;
    cfg->replicas = replicas;
    cfg->batch_size = replicas;
    cfg->iterations_per_loop = ipl > 0 ? ipl : 1;
    cfg->loop_kind = ipl > 0 ? IFD_LOOP_STEPS : IFD_LOOP_AUTO;
    cfg->steps = steps;
    cfg->optimizer.learning_rate = 0.01f;
    cfg->summary_every = 0;
}

/* Seconds per step of a whole session; *loops (when not NULL): the loops it ran. */
static double session_step_seconds(int replicas, int64_t ipl, int64_t steps, int64_t *loops)
{
    ifd_config cfg;
    config_for(&cfg, replicas, ipl, steps);
    static_source src;
    source_init(&src, replicas);
    ifd_session *s;
    ifd_error err;
    if (ifd_session_create(&s, &cfg, bench_repeat_source(&src.batch), &err)) {
        fprintf(stderr, "bench_overhead: %s\n", ifd_error_text(&err));
        exit(1);
    }
    int64_t t0 = ifd_clock_ns();
    int rc = ifd_session_run(s, &err);
    int64_t t1 = ifd_clock_ns();
    if (rc || ifd_session_global_step(s) != steps) {
        fprintf(stderr, "bench_overhead: run failed: %s\n", ifd_error_text(&err));
        exit(1);
    }
    if (loops)
        *loops = ifd_session_loop_index(s) + 1; /* the index of the last loop, from 0 */
    ifd_session_destroy(s);
    return (double)(t1 - t0) * 1e-9 / (double)steps;
}

static int noop_allreduce(void *ctx, float *buf, int64_t n, ifd_error *err)
{
    (void)ctx;
    (void)buf;
    (void)n;
    (void)err;
    return IFD_OK;
}

/* Seconds per step of one replica's compute alone: program step, optimizer, step counter. */
static double compute_step_seconds(int64_t steps)
{
    ifd_config cfg;
    config_for(&cfg, 1, 1, steps);
    ifd_program p;
    ifd_error err;
    ifd_program_init(&p, "linear", &cfg.settings, &err);
    float params[2] = {0.1f, 0.0f}, grads[2], s0[2], s1[2], ws[4];
    int64_t step = 0, opt_step = 0;
    ifd_replica_state st = {params, grads, s0, s1, ws, &step, &opt_step, NULL, NULL, 0};
    ifd_ops ops;
    ifd_cpu_ops_init(&ops, NULL);
    ifd_step_ops sops;
    ifd_cpu_step_ops_init(&sops);
    sops.allreduce_sum = noop_allreduce;
    static_source src;
    source_init(&src, 1);
    ifd_step_out out;
    int64_t t0 = ifd_clock_ns();
    for (int64_t i = 0; i < steps; i++)
        ifd_step_train(&p, &ops, &sops, NULL, &st, &cfg.optimizer, 1.0f, src.batch.tensors, 1, &out,
                       &err);
    int64_t t1 = ifd_clock_ns();
    ifd_program_free(&p);
    return (double)(t1 - t0) * 1e-9 / (double)steps;
}

int main(int argc, char **argv)
{
    int64_t steps = 200000;
    int repeat = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--steps") == 0)
            steps = strtoll(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--repeat") == 0)
            repeat = atoi(argv[i + 1]);
    }
    if (steps < 100 || repeat < 1 || repeat > 64) {
        fprintf(stderr, "usage: bench_overhead [--steps N >= 100] [--repeat 1..64]\n");
        return 2;
    }
    double samples[64];
    for (int k = 0; k < repeat; k++)
        samples[k] = compute_step_seconds(steps);
    double compute = bench_median(samples, repeat);
    printf("compute of one replica's step (tiny linear program): %.3f us\n", compute * 1e6);
    printf("%-9s %-4s %12s %12s %12s %14s %10s\n", "ipl", "R", "steps/s", "best_steps/s", "us/step",
           "overhead_us", "vs_ipl1");
    enum { NFIXED = 5, NRUNS = NFIXED + 1 };
    const int64_t ipls[NRUNS] = {1, 10, 100, 1000, 10000, 0}; /* 0: auto */
    for (int r = 1; r <= 2; r++) {
        double per[NRUNS][64];
        int64_t loops[64];
        for (int k = 0; k < repeat; k++)
            for (int i = 0; i < NRUNS; i++) {
                /* ipl 1 pays a loop round trip per step; fewer steps keep it short. */
                int64_t n = ipls[i] == 1 ? steps / 10 : steps;
                per[i][k] = session_step_seconds(r, ipls[i], n, ipls[i] ? NULL : &loops[k]);
            }
        /* [0]: the median run, [1]: the fastest (the least disturbed on a shared machine) */
        double med[NRUNS], fast[NRUNS], best[2] = {0, 0};
        int64_t best_ipl[2] = {0, 0};
        for (int i = 0; i < NRUNS; i++) {
            med[i] = bench_median(per[i], repeat);
            fast[i] = per[i][0]; /* bench_median() sorted the runs */
            for (int m = 0; m < 2 && i < NFIXED; m++) {
                double v = m ? fast[i] : med[i];
                if (best[m] == 0 || v < best[m]) {
                    best[m] = v;
                    best_ipl[m] = ipls[i];
                }
            }
            char name[32];
            if (ipls[i])
                snprintf(name, sizeof name, "%lld", (long long)ipls[i]);
            else
                snprintf(name, sizeof name, "auto");
            printf("%-9s %-4d %12.0f %12.0f %12.3f %14.3f %9.1fx\n", name, r, 1.0 / med[i],
                   1.0 / fast[i], med[i] * 1e6, (med[i] - compute) * 1e6, med[0] / med[i]);
        }
        double mean_loops = 0;
        for (int k = 0; k < repeat; k++)
            mean_loops += (double)loops[k] / repeat;
        printf("R %d: auto ran %.0f steps a loop on average (%.0f loops); auto / best fixed: "
               "%.3f of its steps/s (median runs, best ipl %lld), %.3f (fastest runs, best ipl "
               "%lld)\n",
               r, (double)steps / mean_loops, mean_loops, best[0] / med[NFIXED],
               (long long)best_ipl[0], best[1] / fast[NFIXED], (long long)best_ipl[1]);
    }
    return 0;
}
