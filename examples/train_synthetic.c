/*
 * infeed-demo: trains the softmax program in-process on a synthetic, linearly separable problem,
 * streaming batches from a producer thread through a bounded batch queue, and prints every
 * summary as it arrives.
 *
 *   infeed-demo [--replicas N] [--steps N] [--batch-size N] [--iterations-per-loop N]
 */
#define _POSIX_C_SOURCE 200809L /* rand_r */

#include "infeed/infeed.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define D 16
#define K 10

typedef struct demo_batch {
    ifd_batch b;
    float *x;
    int32_t *y;
} demo_batch;

typedef struct producer {
    ifd_batch_queue *q;
    int64_t batches, batch_size;
    float centers[K][D];
    unsigned seed;
} producer;

static float frand(unsigned *s)
{
    return (float)rand_r(s) / (float)RAND_MAX;
}

static void release_batch(ifd_batch *b, void *arg)
{
    (void)arg;
    demo_batch *db = (demo_batch *)b;
    free(db->x);
    free(db->y);
    free(db);
}

static void *produce(void *arg)
{
    producer *p = arg;
    for (int64_t i = 0; i < p->batches; i++) {
        demo_batch *db = calloc(1, sizeof *db);
        db->x = malloc(sizeof(float) * (size_t)(p->batch_size * D));
        db->y = malloc(sizeof(int32_t) * (size_t)p->batch_size);
        for (int64_t r = 0; r < p->batch_size; r++) {
            int c = rand_r(&p->seed) % K;
            db->y[r] = c;
            for (int j = 0; j < D; j++)
                db->x[r * D + j] = p->centers[c][j] + 2.0f * (frand(&p->seed) - 0.5f);
        }
        ifd_batch_init(&db->b);
        db->b.seq = i;
        db->b.rows = p->batch_size;
        db->b.ntensors = 2;
        db->b.producer = "demo";
        int64_t xd[2] = {p->batch_size, D}, yd[1] = {p->batch_size};
        ifd_tensor_init(&db->b.tensors[0], IFD_F32, 2, xd, db->x);
        ifd_tensor_init(&db->b.tensors[1], IFD_I32, 1, yd, db->y);
        db->b.release = release_batch;
        if (ifd_batch_queue_push(p->q, &db->b) != IFD_OK) {
            release_batch(&db->b, NULL);
            break;
        }
    }
    ifd_batch_queue_close(p->q);
    return NULL;
}

static int print_write(void *ctx, const char *json, size_t len, ifd_error *err)
{
    (void)ctx;
    (void)err;
    fwrite(json, 1, len, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    return IFD_OK;
}

static const ifd_sink_ops print_ops = {.write = print_write};

static int64_t arg_int(int argc, char **argv, const char *name, int64_t def)
{
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return strtoll(argv[i + 1], NULL, 10);
    return def;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: infeed-demo [--replicas N (2)] [--steps N (300)] [--batch-size N (64)]"
                   " [--iterations-per-loop N (50)]\n");
            return 0;
        }
    }
    ifd_config cfg;
    ifd_config_defaults(&cfg);
    cfg.replicas = (int)arg_int(argc, argv, "--replicas", 2);
    cfg.steps = arg_int(argc, argv, "--steps", 300);
    cfg.batch_size = arg_int(argc, argv, "--batch-size", 64);
    cfg.iterations_per_loop = arg_int(argc, argv, "--iterations-per-loop", 50);
    cfg.program = "softmax";
    cfg.settings.features = D;
    cfg.settings.classes = K;
    cfg.optimizer.kind = IFD_OPT_MOMENTUM;
    cfg.optimizer.learning_rate = 0.02f;
    cfg.summary_every = 50;

    producer p = {.batches = cfg.steps, .batch_size = cfg.batch_size, .seed = 7};
    for (int c = 0; c < K; c++)
        for (int j = 0; j < D; j++)
            p.centers[c][j] = frand(&p.seed) * 2.0f - 1.0f;

    ifd_error err;
    ifd_batch_queue *q;
    ifd_sink *sink;
    ifd_session *s;
    if (ifd_batch_queue_create(&q, 8) || ifd_sink_create(&sink, &print_ops, NULL)) {
        fprintf(stderr, "infeed-demo: out of memory\n");
        return 1;
    }
    if (ifd_session_create(&s, &cfg, ifd_batch_queue_source(q), &err)) {
        fprintf(stderr, "infeed-demo: %s\n", ifd_error_text(&err));
        return 2;
    }
    p.q = q;
    ifd_session_add_sink(s, sink);
    pthread_t t;
    pthread_create(&t, NULL, produce, &p);
    int rc = ifd_session_run(s, &err);
    ifd_batch_queue_close(q); /* a producer still pushing gets IFD_ECLOSED and stops */
    pthread_join(t, NULL);
    ifd_session_destroy(s);
    ifd_batch_queue_destroy(q);
    ifd_sink_destroy(sink);
    if (rc) {
        fprintf(stderr, "infeed-demo: %s\n", ifd_error_text(&err));
        return 1;
    }
    return 0;
}
