/* Helpers shared by the test suites: random valid batches for a program, a producer thread that
 * streams them through a batch queue, and a one-call session runner. */
#ifndef IFD_TESTUTIL_H
#define IFD_TESTUTIL_H

#include "core/rng.h"
#include <infeed/infeed.h>

#include <check.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>

/* A batch that owns its bytes; released (freed) when the runtime is done with it. */
typedef struct tu_batch {
    ifd_batch b;
    void *data[IFD_MAX_INPUTS];
    int *released; /* incremented on release when not NULL */
} tu_batch;

/* Random data shaped for p: float inputs uniform in [-1, 1), int32 labels uniform in [0, K). */
tu_batch *tu_batch_random(const ifd_program *p, int64_t rows, int64_t seq, ifd_rng *rng);
/* A deep copy (same values), so several runs can consume the same data. */
tu_batch *tu_batch_clone(const tu_batch *src);
void tu_batch_free(tu_batch *tb);
/* Drops the label tensors (the last inputs of the dense programs): a predict-mode batch. */
void tu_strip_labels(const ifd_program *p, tu_batch *tb);

/* A producer thread that pushes batches[0..n) into a batch queue, then closes it (unless
 * keep_open). Takes ownership of the batches it pushes. */
typedef struct tu_producer tu_producer;
tu_producer *tu_producer_start(ifd_batch_queue *q, tu_batch **batches, int64_t n, int keep_open);
/* Joins; batches not pushed are freed. Returns how many were pushed. */
int64_t tu_producer_join(tu_producer *p);

/* The training config the replication and cuda-vs-cpu suites compare runs with: program over d
 * features and k classes, global batch b, 20 steps of ipl steps per loop, a summary every step,
 * optimizer opt at learning rate 0.1 (Adam 0.01), parameters from seed; the rest defaults (backend
 * cpu, one replica). */
void tu_config_train(ifd_config *cfg, const char *program, ifd_optimizer_kind opt, int64_t d,
                     int64_t k, int64_t b, int64_t ipl, uint64_t seed);
/* n random batches of cfg->batch_size rows for cfg's program, the same for the same seed. */
tu_batch **tu_batches_random(const ifd_config *cfg, int64_t n, uint64_t seed);
/* As tu_batches_random, for a program whose inputs are x float32 [D] and y int32 (softmax, mlp),
 * with each row's label from a random linear teacher (argmax over k of x . T[:, k], T from
 * seed): data that training learns, so the loss falls and runs that differ by rounding stay
 * close instead of drifting apart as they do on labels that are noise. */
tu_batch **tu_batches_teacher(const ifd_config *cfg, int64_t n, uint64_t seed);
void tu_batches_free(tu_batch **bs, int64_t n);

/* Runs a whole session over clones of batches[0..n) and returns its result. */
typedef struct tu_result {
    int rc;
    ifd_error err;
    int64_t global_step;
    ifd_end_reason reason;
    float *params; /* replica 0's, malloc'd */
    int64_t nparams;
    int mirrors_identical; /* every replica's params equal replica 0's, bit for bit */
    char **summaries;      /* every summary line, malloc'd */
    size_t nsummaries;
    int released; /* batches released */
} tu_result;

void tu_run(const ifd_config *cfg, tu_batch **batches, int64_t n, tu_result *res);
/* A session over src (cfg must be valid) with a new memory sink (*sink, for tu_result_collect),
 * the prediction sink pred (may be NULL) and hooks[0..nhooks) added. */
ifd_session *tu_session_create(const ifd_config *cfg, ifd_batch_source src,
                               const ifd_prediction_sink *pred, const ifd_hook *hooks, int nhooks,
                               ifd_sink **sink, tu_result *res);
/* After ifd_session_run (res->rc and res->err filled): the rest of res from s (replicas
 * replicas) and the memory sink; destroys s and sink. */
void tu_result_collect(tu_result *res, ifd_session *s, int replicas, ifd_sink *sink);
/* As tu_run, with a prediction sink (predict mode) when pred is not NULL. */
void tu_run_predict(const ifd_config *cfg, tu_batch **batches, int64_t n,
                    const ifd_prediction_sink *pred, tu_result *res);
/* As tu_run, with hooks added to the session (copied; the session destroys them). */
void tu_run_hooks(const ifd_config *cfg, tu_batch **batches, int64_t n, const ifd_hook *hooks,
                  int nhooks, tu_result *res);
void tu_result_free(tu_result *res);

/* The number of threads in this process (from /proc/self/task). */
int tu_thread_count(void);
/* Waits up to 2 s for the thread count to drop to want and returns the last count: a joined
 * thread can stay listed in /proc/self/task for a moment after pthread_join returns (the kernel
 * wakes the joiner before it unhashes the task). */
int tu_thread_count_settle(int want);
/* Max over i of |a-b| / max(|b|, floor). */
double tu_max_rel_diff(const float *a, const float *b, int64_t n, double floor);

/* A program class that is softmax in all but its step (failure injection): registers a class
 * named name whose train_step is step; step may call tu_softmax_step. */
typedef int (*tu_step_fn)(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                          ifd_error *err);
int tu_register_softmax_like(const char *name, tu_step_fn step);
/* softmax under another name, its bias flagged IFD_PARAM_NO_DECAY (AdamW leaves it alone). */
int tu_register_softmax_nodecay(const char *name);
int tu_softmax_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                    ifd_error *err);

/* A hook that records every loop of a session: where it starts, its length, where it ends. */
#define TU_MAX_LOOPS 4096
typedef struct tu_loops {
    int n;
    int64_t start[TU_MAX_LOOPS], len[TU_MAX_LOOPS], end[TU_MAX_LOOPS];
} tu_loops;
/* Clears l and returns the hook that fills it. */
ifd_hook tu_loops_hook(tu_loops *l);

/* Random seeds that a failure names: IFD_TEST_SEED when set, else the clock. Each test runs in
 * its own forked process, so one global seed per process is enough. */
extern uint64_t g_seed;
void seed_rng(ifd_rng *rng);

/* ck_assert_msg that also names the seed. */
#define RASSERT(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            char rassert_msg_[1024];                                                               \
            snprintf(rassert_msg_, sizeof rassert_msg_, __VA_ARGS__);                              \
            ck_abort_msg("%s [seed %" PRIu64 "; rerun with IFD_TEST_SEED=%" PRIu64 "]",            \
                         rassert_msg_, g_seed, g_seed);                                            \
        }                                                                                          \
    } while (0)

/* Fails (naming the seed) unless call returns IFD_OK; the message has err's sentence. */
#define RC_OK(call, err)                                                                           \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        RASSERT(rc_ == IFD_OK, "%s returned %s: %s", #call, ifd_errname(rc_),                      \
                ifd_error_text(&(err)));                                                           \
    } while (0)

/* Random integer in [lo, hi] (any lo <= hi, INT64_MIN and INT64_MAX included: the span is
 * computed in unsigned arithmetic). */
static inline int64_t rand_between(ifd_rng *rng, int64_t lo, int64_t hi)
{
    uint64_t span = (uint64_t)hi - (uint64_t)lo;
    uint64_t r = span == UINT64_MAX ? ifd_rng_next(rng) : ifd_rng_below(rng, span + 1);
    return (int64_t)((uint64_t)lo + r);
}

#define MS (INT64_C(1000000))

/* A test case named name with a timeout of timeout_s seconds, added to s. */
TCase *tu_tcase(Suite *s, const char *name, int timeout_s);
/* Standard main: runs the suite in fork mode. */
int tu_run_suite(Suite *s);
/* As tu_run_suite, in fork mode fs (CK_NOFORK: every test in this process, for a suite whose
 * setup is too costly to repeat a test, such as initialising CUDA). */
int tu_run_suite_as(Suite *s, enum fork_status fs);

#endif
