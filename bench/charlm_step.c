/*
 * bench_charlm_step: the CPU cost of charlm's train step alone (the program's step through the
 * cpu op set: no daemon, no feed, no optimizer, no all-reduce), on the caller or on a team, so
 * that two builds can be compared by their CPU time a step on a machine others load (README.md,
 * "bench_charlm_step"). The BLAS kernel is chosen as infeedd's --blas-kernel auto does.
 *
 *   bench_charlm_step [--batch 32] [--block 128] [--threads 1] [--steps 10] [--repeat 3]
 *
 * Prints, for each repeat, the wall and the process's CPU milliseconds a step and the GFLOP/s of
 * the wall time by bench/peers.py's convention (6 N + 12 L T C a token, PaLM's), then the loss.
 */
#include "device/cpu/blas.h"
#include "device/cpu/team.h"
#include "device/step.h"
#include <infeed/program.h>

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double seconds(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    long batch = 32, block = 128, threads = 1, steps = 10, repeat = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        long v = strtol(argv[i + 1], NULL, 10);
        if (strcmp(argv[i], "--batch") == 0)
            batch = v;
        else if (strcmp(argv[i], "--block") == 0)
            block = v;
        else if (strcmp(argv[i], "--threads") == 0)
            threads = v;
        else if (strcmp(argv[i], "--steps") == 0)
            steps = v;
        else if (strcmp(argv[i], "--repeat") == 0)
            repeat = v;
        else
            v = -1;
        if (v < 1) {
            fprintf(stderr, "usage: bench_charlm_step [--batch N] [--block T] [--threads N] "
                            "[--steps N] [--repeat N] (each at least 1)\n");
            return 2;
        }
    }
    ifd_error err;
    ifd_error_clear(&err);
    char config[160], line[256];
    snprintf(config, sizeof config,
             "{\"layers\":2,\"heads\":4,\"width\":128,\"block\":%ld,\"vocab\":256}", block);
    ifd_program_settings s = {0, 0, 0, config};
    ifd_program p;
    ifd_team *team = NULL;
    if (ifd_blas_select("auto", &err) || ifd_program_init(&p, "charlm", &s, &err) ||
        (threads > 1 && ifd_team_create(&team, (int)threads, "bench-team"))) {
        fprintf(stderr, "bench_charlm_step: %s\n", ifd_error_text(&err));
        return 1;
    }
    openblas_set_num_threads(1); /* as the cpu backend runs it: the team splits the products */
    ifd_blas_info info;
    ifd_blas_info_get(&info);
    printf("charlm batch %ld block %ld, %ld thread(s); BLAS: %s\n", batch, block, threads,
           ifd_blas_describe(&info, line, sizeof line));
    int64_t rows = batch, tokens = batch * block, np = p.nparam_floats;
    float *params = malloc(sizeof(float) * (size_t)np), *grads = malloc(sizeof(float) * (size_t)np);
    float *ws = calloc((size_t)p.cls->workspace_floats(&p, rows), sizeof(float));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(2 * tokens));
    ifd_program_init_params(&p, params, 7);
    srand(3);
    for (int64_t i = 0; i < 2 * tokens; i++)
        ids[i] = rand() % 256;
    ifd_tensor in[2];
    memset(in, 0, sizeof in);
    in[0].data = ids;
    in[1].data = ids + tokens;
    ifd_ops ops;
    ifd_cpu_ops_init(&ops, team);
    ifd_step_out out;
    ifd_step_args a = {.inputs = in,
                       .rows = rows,
                       .params = params,
                       .grads = grads,
                       .workspace = ws,
                       .scale = 1.0f,
                       .out = &out};
    /* peers.py's flops_per_token: 6 N + 12 L T C, N the matrices' parameters */
    double c = 128.0, flops = 6.0 * (2 * 12 * c * c + c * 256) + 12.0 * 2 * (double)block * c;
    p.cls->train_step(&p, &ops, &a, &err); /* warm: pages, the scratch, the team */
    for (long r = 0; r < repeat; r++) {
        double w0 = seconds(CLOCK_MONOTONIC), c0 = seconds(CLOCK_PROCESS_CPUTIME_ID);
        for (long i = 0; i < steps; i++)
            p.cls->train_step(&p, &ops, &a, &err);
        double wall = (seconds(CLOCK_MONOTONIC) - w0) / (double)steps;
        double cpu = (seconds(CLOCK_PROCESS_CPUTIME_ID) - c0) / (double)steps;
        printf("wall %.2f ms a step, cpu %.2f ms a step, %.1f GFLOP/s (wall)\n", wall * 1e3,
               cpu * 1e3, flops * (double)tokens / wall * 1e-9);
    }
    printf("loss %.9g\n", (double)out.loss);
    ifd_team_destroy(team);
    ifd_program_free(&p);
    free(params);
    free(grads);
    free(ws);
    free(ids);
    return 0;
}
