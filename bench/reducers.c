/*
 * bench_reducers: what each built-in host call (outfeed/reducers.c) costs the outfeed thread a
 * step, at issue 21's benchmark shape: float32 values of 16 a row, 256 rows a step (for the
 * classifier metrics int32 predicted classes and labels [256] over 10 classes, for top_k scores
 * [256, 10], for auc scores [256] in [0, 1]). Each spec adds the same step over and over for
 * about --seconds after a warm-up, --repeat times; a row gives the median ns a step, the values a
 * second, and its ns a value over those of a plain double sum over the step's floats measured the
 * same way (the least any host call over those values costs). ifd_reducer_value is called once a
 * run (a summary), outside the timing.
 *
 *   bench_reducers [--rows N] [--cols N] [--seconds S] [--repeat N]
 */
#include "core/rng.h"
#include "core/thread.h"
#include "outfeed/reducers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static volatile double sink;

/* ns a step of the plain sum over t's floats, one run. */
static double plain_sum_ns(const ifd_tensor *t, double seconds)
{
    const float *x = t->data;
    int64_t n = ifd_tensor_numel(t), steps = 0;
    int64_t t0 = ifd_clock_ns(), stop = t0 + (int64_t)(seconds * 1e9);
    double s = 0;
    while (ifd_clock_ns() < stop) {
        for (int i = 0; i < 64; i++, steps++)
            for (int64_t k = 0; k < n; k++)
                s += x[k];
    }
    sink = s;
    return (double)(ifd_clock_ns() - t0) / (double)steps;
}

/* ns a step of spec over t (and label), one run; -1 on an error (printed). */
static double reducer_ns(const char *spec, const ifd_tensor *t, const ifd_tensor *label,
                         double seconds)
{
    ifd_reducer *r;
    ifd_error err = {0};
    if (ifd_reducer_create(&r, "x", spec, 10, &err) != IFD_OK) {
        fprintf(stderr, "bench_reducers: %s\n", ifd_error_text(&err));
        return -1;
    }
    int64_t steps = 0;
    for (int i = 0; i < 64; i++) /* warm-up */
        ifd_reducer_add(r, t, label, &err);
    int64_t t0 = ifd_clock_ns(), stop = t0 + (int64_t)(seconds * 1e9);
    int rc = IFD_OK;
    while (rc == IFD_OK && ifd_clock_ns() < stop)
        for (int i = 0; i < 64 && rc == IFD_OK; i++, steps++)
            rc = ifd_reducer_add(r, t, label, &err);
    double ns = (double)(ifd_clock_ns() - t0) / (double)steps;
    json_t *v = ifd_reducer_value(r);
    json_decref(v);
    ifd_reducer_destroy(r);
    if (rc != IFD_OK) {
        fprintf(stderr, "bench_reducers: %s: %s\n", spec, ifd_error_text(&err));
        return -1;
    }
    return ns;
}

static double median(double *x, int n)
{
    qsort(x, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    int64_t rows = 256, cols = 16;
    double seconds = 0.3;
    int repeat = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--rows") == 0)
            rows = atoll(argv[i + 1]);
        else if (strcmp(argv[i], "--cols") == 0)
            cols = atoll(argv[i + 1]);
        else if (strcmp(argv[i], "--seconds") == 0)
            seconds = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--repeat") == 0)
            repeat = atoi(argv[i + 1]);
        else
            break;
    }
    if (argc % 2 == 0 || rows < 1 || cols < 1 || seconds <= 0 || repeat < 1 || repeat > 99) {
        fprintf(stderr, "usage: bench_reducers [--rows N] [--cols N] [--seconds S] "
                        "[--repeat N]\n");
        return 2;
    }
    const int64_t k = 10;
    float *values = malloc(sizeof(float) * (size_t)(rows * cols)),
          *scores = malloc(sizeof(float) * (size_t)(rows * k)),
          *probs = malloc(sizeof(float) * (size_t)rows);
    int32_t *pred = malloc(sizeof(int32_t) * (size_t)rows),
            *labels = malloc(sizeof(int32_t) * (size_t)rows),
            *binary = malloc(sizeof(int32_t) * (size_t)rows);
    if (!values || !scores || !probs || !pred || !labels || !binary)
        return 1;
    ifd_rng rng;
    ifd_rng_seed(&rng, 1);
    for (int64_t i = 0; i < rows * cols; i++)
        values[i] = (float)(ifd_rng_uniform(&rng) * 4 - 2);
    for (int64_t i = 0; i < rows * k; i++)
        scores[i] = (float)ifd_rng_uniform(&rng);
    for (int64_t i = 0; i < rows; i++) {
        probs[i] = (float)ifd_rng_uniform(&rng);
        labels[i] = (int32_t)ifd_rng_below(&rng, (uint64_t)k);
        pred[i] = ifd_rng_below(&rng, 2) ? labels[i] : (int32_t)ifd_rng_below(&rng, (uint64_t)k);
        binary[i] = (int32_t)ifd_rng_below(&rng, 2);
    }
    ifd_tensor tv, ts, tp, tpred, tlab, tbin;
    int64_t dv[2] = {rows, cols}, ds[2] = {rows, k};
    ifd_tensor_init(&tv, IFD_F32, 2, dv, values);
    ifd_tensor_init(&ts, IFD_F32, 2, ds, scores);
    ifd_tensor_init(&tp, IFD_F32, 1, dv, probs);
    ifd_tensor_init(&tpred, IFD_I32, 1, dv, pred);
    ifd_tensor_init(&tlab, IFD_I32, 1, dv, labels);
    ifd_tensor_init(&tbin, IFD_I32, 1, dv, binary);

    static const struct {
        const char *spec;
        int data; /* 0: values; 1: classes and labels; 2: scores [rows, k]; 3: auc */
    } specs[] = {
        {"mean", 0},
        {"sum", 0},
        {"min", 0},
        {"max", 0},
        {"last", 0},
        {"histogram", 0},
        {"histogram:bins=30,range=-2:2", 0},
        {"quantiles", 0},
        {"confusion", 1},
        {"class_accuracy", 1},
        {"precision_recall", 1},
        {"top_k:5", 2},
        {"auc", 3},
    };
    double runs[99];
    for (int i = 0; i < repeat; i++)
        runs[i] = plain_sum_ns(&tv, seconds);
    double base = median(runs, repeat);
    printf("rows %lld, %lld floats a row (%lld values a step); median of %d runs of %.2f s\n",
           (long long)rows, (long long)cols, (long long)(rows * cols), repeat, seconds);
    printf("%-30s %12s %14s %10s\n", "host call", "ns/step", "Mvalues/s", "x sum");
    printf("%-30s %12.0f %14.1f %10.2f\n", "(plain double sum)", base,
           (double)(rows * cols) / base * 1e3, 1.0);
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        const ifd_tensor *t = specs[s].data == 0   ? &tv
                              : specs[s].data == 1 ? &tpred
                              : specs[s].data == 2 ? &ts
                                                   : &tp;
        const ifd_tensor *label = specs[s].data == 0 ? NULL : specs[s].data == 3 ? &tbin : &tlab;
        for (int i = 0; i < repeat; i++)
            runs[i] = reducer_ns(specs[s].spec, t, label, seconds);
        double ns = median(runs, repeat);
        if (ns < 0)
            return 1;
        int64_t n = ifd_tensor_numel(t);
        printf("%-30s %12.0f %14.1f %10.2f\n", specs[s].spec, ns, (double)n / ns * 1e3,
               ns / base * (double)(rows * cols) / (double)n);
    }
    free(values), free(scores), free(probs), free(pred), free(labels), free(binary);
    return 0;
}
