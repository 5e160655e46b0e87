#include "tests/util/testutil.h"

#include "device/step.h"

#include "core/thread.h"

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void tu_release(ifd_batch *b, void *arg)
{
    (void)arg;
    tu_batch *tb = (tu_batch *)b;
    if (tb->released)
        __atomic_add_fetch(tb->released, 1, __ATOMIC_RELAXED);
    tu_batch_free(tb);
}

void tu_batch_free(tu_batch *tb)
{
    if (tb == NULL)
        return;
    for (int i = 0; i < IFD_MAX_INPUTS; i++)
        free(tb->data[i]);
    free(tb);
}

tu_batch *tu_batch_random(const ifd_program *p, int64_t rows, int64_t seq, ifd_rng *rng)
{
    tu_batch *tb = calloc(1, sizeof *tb);
    ifd_batch_init(&tb->b);
    tb->b.seq = seq;
    tb->b.rows = rows;
    tb->b.ntensors = p->ninputs;
    tb->b.producer = "test";
    tb->b.release = tu_release;
    for (int i = 0; i < p->ninputs; i++) {
        const ifd_input_spec *in = &p->inputs[i];
        int64_t dims[IFD_MAX_RANK] = {rows};
        int64_t per = 1;
        for (int d = 0; d < in->rank; d++) {
            dims[d + 1] = in->dims[d];
            per *= in->dims[d];
        }
        size_t n = (size_t)(rows * per);
        tb->data[i] = malloc((n ? n : 1) * ifd_dtype_size(in->dtype));
        if (in->dtype == IFD_F32) {
            float *f = tb->data[i];
            for (size_t j = 0; j < n; j++)
                f[j] = (float)(2.0 * ifd_rng_uniform(rng) - 1.0);
        } else if (in->dtype == IFD_I32) {
            int32_t *v = tb->data[i];
            for (size_t j = 0; j < n; j++)
                v[j] = (int32_t)ifd_rng_below(
                    rng,
                    (uint64_t)(p->input_limit[i] > 0 ? p->input_limit[i] : p->settings.classes));
        } else {
            memset(tb->data[i], 0, n * ifd_dtype_size(in->dtype));
        }
        ifd_tensor_init(&tb->b.tensors[i], in->dtype, in->rank + 1, dims, tb->data[i]);
    }
    return tb;
}

tu_batch *tu_batch_clone(const tu_batch *src)
{
    tu_batch *tb = malloc(sizeof *tb);
    *tb = *src;
    for (int i = 0; i < src->b.ntensors; i++) {
        size_t n = ifd_tensor_nbytes(&src->b.tensors[i]);
        tb->data[i] = malloc(n ? n : 1);
        memcpy(tb->data[i], src->data[i], n);
        tb->b.tensors[i].data = tb->data[i];
    }
    tb->b.refs = 0;
    return tb;
}

struct tu_producer {
    pthread_t t;
    ifd_batch_queue *q;
    tu_batch **batches;
    int64_t n, pushed;
    int keep_open;
};

static void *producer_main(void *arg)
{
    tu_producer *p = arg;
    for (int64_t i = 0; i < p->n; i++) {
        if (ifd_batch_queue_push(p->q, &p->batches[i]->b) != IFD_OK)
            break;
        p->pushed++;
    }
    if (!p->keep_open)
        ifd_batch_queue_close(p->q);
    return NULL;
}

tu_producer *tu_producer_start(ifd_batch_queue *q, tu_batch **batches, int64_t n, int keep_open)
{
    tu_producer *p = calloc(1, sizeof *p);
    p->q = q;
    p->batches = batches;
    p->n = n;
    p->keep_open = keep_open;
    pthread_create(&p->t, NULL, producer_main, p);
    return p;
}

int64_t tu_producer_join(tu_producer *p)
{
    pthread_join(p->t, NULL);
    for (int64_t i = p->pushed; i < p->n; i++)
        tu_batch_free(p->batches[i]);
    int64_t pushed = p->pushed;
    free(p);
    return pushed;
}

void tu_config_train(ifd_config *cfg, const char *program, ifd_optimizer_kind opt, int64_t d,
                     int64_t k, int64_t b, int64_t ipl, uint64_t seed)
{
    ifd_config_defaults(cfg);
    cfg->program = program;
    cfg->settings.features = d;
    cfg->settings.classes = k;
    cfg->batch_size = b;
    cfg->steps = 20;
    cfg->iterations_per_loop = ipl;
    cfg->optimizer.kind = opt;
    cfg->optimizer.learning_rate = opt == IFD_OPT_ADAM ? 0.01f : 0.1f;
    cfg->summary_every = 1;
    cfg->seed = seed;
}

tu_batch **tu_batches_random(const ifd_config *cfg, int64_t n, uint64_t seed)
{
    ifd_program p;
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&p, cfg->program, &cfg->settings, &err), IFD_OK);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    tu_batch **bs = calloc((size_t)n, sizeof *bs);
    ck_assert_ptr_nonnull(bs);
    for (int64_t i = 0; i < n; i++)
        bs[i] = tu_batch_random(&p, cfg->batch_size, i, &rng);
    ifd_program_free(&p);
    return bs;
}

tu_batch **tu_batches_teacher(const ifd_config *cfg, int64_t n, uint64_t seed)
{
    tu_batch **bs = tu_batches_random(cfg, n, seed);
    int64_t d = cfg->settings.features, k = cfg->settings.classes;
    ifd_rng rng;
    ifd_rng_seed(&rng, seed ^ 0x7eac4e7ULL);
    float *t = malloc(sizeof(float) * (size_t)(d * k));
    ck_assert_ptr_nonnull(t);
    for (int64_t i = 0; i < d * k; i++)
        t[i] = (float)(2.0 * ifd_rng_uniform(&rng) - 1.0);
    for (int64_t b = 0; b < n; b++) {
        ck_assert_int_eq(bs[b]->b.ntensors, 2);
        ck_assert_int_eq(bs[b]->b.tensors[0].dtype, IFD_F32);
        ck_assert_int_eq(bs[b]->b.tensors[1].dtype, IFD_I32);
        const float *x = bs[b]->data[0];
        int32_t *y = bs[b]->data[1];
        for (int64_t r = 0; r < bs[b]->b.rows; r++) {
            double best = -INFINITY;
            for (int64_t c = 0; c < k; c++) {
                double v = 0.0;
                for (int64_t j = 0; j < d; j++)
                    v += (double)x[r * d + j] * t[j * k + c];
                if (v > best) {
                    best = v;
                    y[r] = (int32_t)c;
                }
            }
        }
    }
    free(t);
    return bs;
}

void tu_batches_free(tu_batch **bs, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        tu_batch_free(bs[i]);
    free(bs);
}

ifd_session *tu_session_create(const ifd_config *cfg, ifd_batch_source src,
                               const ifd_prediction_sink *pred, const ifd_hook *hooks, int nhooks,
                               ifd_sink **sink, tu_result *res)
{
    ck_assert_int_eq(ifd_sink_memory_create(sink), IFD_OK);
    ifd_session *s;
    int rc = ifd_session_create(&s, cfg, src, &res->err);
    ck_assert_msg(rc == IFD_OK, "session_create: %s", ifd_error_text(&res->err));
    ck_assert_int_eq(ifd_session_add_sink(s, *sink), IFD_OK);
    if (pred)
        ck_assert_int_eq(ifd_session_add_prediction_sink(s, pred), IFD_OK);
    for (int i = 0; i < nhooks; i++)
        ck_assert_int_eq(ifd_session_add_hook(s, &hooks[i]), IFD_OK);
    return s;
}

/* tu_run, tu_run_predict and tu_run_hooks in one. */
static void run_full(const ifd_config *cfg, tu_batch **batches, int64_t n,
                     const ifd_prediction_sink *pred, const ifd_hook *hooks, int nhooks,
                     tu_result *res);

void tu_run(const ifd_config *cfg, tu_batch **batches, int64_t n, tu_result *res)
{
    run_full(cfg, batches, n, NULL, NULL, 0, res);
}

void tu_run_predict(const ifd_config *cfg, tu_batch **batches, int64_t n,
                    const ifd_prediction_sink *pred, tu_result *res)
{
    run_full(cfg, batches, n, pred, NULL, 0, res);
}

void tu_run_hooks(const ifd_config *cfg, tu_batch **batches, int64_t n, const ifd_hook *hooks,
                  int nhooks, tu_result *res)
{
    run_full(cfg, batches, n, NULL, hooks, nhooks, res);
}

static void run_full(const ifd_config *cfg, tu_batch **batches, int64_t n,
                     const ifd_prediction_sink *pred, const ifd_hook *hooks, int nhooks,
                     tu_result *res)
{
    memset(res, 0, sizeof *res);
    tu_batch **copies = calloc((size_t)(n ? n : 1), sizeof *copies);
    for (int64_t i = 0; i < n; i++) {
        copies[i] = tu_batch_clone(batches[i]);
        copies[i]->released = &res->released;
    }
    ifd_batch_queue *q;
    ck_assert_int_eq(ifd_batch_queue_create(&q, 4), IFD_OK);
    ifd_sink *sink;
    ifd_session *s =
        tu_session_create(cfg, ifd_batch_queue_source(q), pred, hooks, nhooks, &sink, res);
    tu_producer *p = tu_producer_start(q, copies, n, 0);
    res->rc = ifd_session_run(s, &res->err);
    ifd_batch_queue_close(q);
    tu_producer_join(p);
    tu_result_collect(res, s, cfg->replicas, sink);
    ifd_batch_queue_destroy(q);
    free(copies);
}

void tu_result_collect(tu_result *res, ifd_session *s, int replicas, ifd_sink *sink)
{
    res->global_step = ifd_session_global_step(s);
    res->reason = ifd_session_end_reason(s);
    const ifd_program *prog = ifd_session_program(s);
    res->nparams = prog->nparam_floats;
    res->params = malloc(sizeof(float) * (size_t)res->nparams);
    ck_assert_int_eq(ifd_session_read_params(s, 0, res->params), IFD_OK);
    res->mirrors_identical = 1;
    float *other = malloc(sizeof(float) * (size_t)res->nparams);
    for (int r = 1; r < replicas; r++) {
        ck_assert_int_eq(ifd_session_read_params(s, r, other), IFD_OK);
        if (memcmp(other, res->params, sizeof(float) * (size_t)res->nparams) != 0)
            res->mirrors_identical = 0;
    }
    free(other);
    ifd_session_destroy(s);
    res->nsummaries = ifd_sink_memory_count(sink);
    res->summaries = calloc(res->nsummaries + 1, sizeof *res->summaries);
    for (size_t i = 0; i < res->nsummaries; i++)
        res->summaries[i] = ifd_sink_memory_get(sink, i);
    ifd_sink_destroy(sink);
}

void tu_result_free(tu_result *res)
{
    free(res->params);
    for (size_t i = 0; i < res->nsummaries; i++)
        free(res->summaries[i]);
    free(res->summaries);
}

int tu_thread_count(void)
{
    /* OpenBLAS's worker pool is process-wide: set it as the first cpu backend that opens does
     * (ifd_cpu_replica_threads) before counting, so that a baseline taken before the first
     * session matches the count after it. */
    ifd_cpu_replica_threads(1, 0);
    DIR *d = opendir("/proc/self/task");
    if (d == NULL)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

int tu_thread_count_settle(int want)
{
    int n = tu_thread_count();
    for (int i = 0; i < 200 && n > want; i++) {
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
        n = tu_thread_count();
    }
    return n;
}

double tu_max_rel_diff(const float *a, const float *b, int64_t n, double floor)
{
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double den = fabs((double)b[i]);
        if (den < floor)
            den = floor;
        double d = fabs((double)a[i] - (double)b[i]) / den;
        if (d > worst || d != d)
            worst = d != d ? INFINITY : d;
    }
    return worst;
}

static int like_setup(ifd_program *p, ifd_error *err)
{
    const ifd_program_class *self = p->cls;
    int rc = ifd_program_find("softmax")->setup(p, err);
    p->cls = self;
    return rc;
}

static void like_init(const ifd_program *p, float *params, uint64_t seed)
{
    ifd_program_find("softmax")->init_params(p, params, seed);
}

static int64_t like_workspace(const ifd_program *p, int64_t rows)
{
    return ifd_program_find("softmax")->workspace_floats(p, rows);
}

int tu_softmax_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                    ifd_error *err)
{
    return ifd_program_find("softmax")->train_step(p, ops, a, err);
}

static int register_like(const char *name, int (*setup)(ifd_program *, ifd_error *),
                         tu_step_fn step)
{
    ifd_program_class *cls = calloc(1, sizeof *cls); /* lives as long as the registry */
    cls->name = name;
    cls->setup = setup;
    cls->init_params = like_init;
    cls->workspace_floats = like_workspace;
    cls->train_step = step;
    return ifd_program_register(cls);
}

int tu_register_softmax_like(const char *name, tu_step_fn step)
{
    return register_like(name, like_setup, step);
}

/* softmax's setup, with its rank-1 parameters (the bias) left out of weight decay */
static int nodecay_setup(ifd_program *p, ifd_error *err)
{
    int rc = like_setup(p, err);
    for (int i = 0; rc == IFD_OK && i < p->nparams; i++)
        if (p->params[i].rank == 1)
            p->params[i].flags |= IFD_PARAM_NO_DECAY;
    return rc;
}

int tu_register_softmax_nodecay(const char *name)
{
    return register_like(name, nodecay_setup, tu_softmax_step);
}

uint64_t g_seed;

void seed_rng(ifd_rng *rng)
{
    const char *env = getenv("IFD_TEST_SEED");
    if (env && *env)
        g_seed = strtoull(env, NULL, 0);
    else
        g_seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20) ^ (uint64_t)ifd_clock_ns();
    ifd_rng_seed(rng, g_seed);
}

TCase *tu_tcase(Suite *s, const char *name, int timeout_s)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, timeout_s);
    suite_add_tcase(s, tc);
    return tc;
}

int tu_run_suite(Suite *s)
{
    return tu_run_suite_as(s, CK_FORK);
}

int tu_run_suite_as(Suite *s, enum fork_status fs)
{
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, fs);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}

/* Drops the label tensors (the last inputs of the dense programs): a predict-mode batch. */
void tu_strip_labels(const ifd_program *p, tu_batch *tb)
{
    int keep = 0;
    for (int i = 0; i < p->ninputs; i++)
        keep += !(p->labels & (1u << i));
    for (int i = keep; i < IFD_MAX_INPUTS; i++) {
        free(tb->data[i]);
        tb->data[i] = NULL;
    }
    tb->b.ntensors = keep;
}

static int loops_before(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    (void)err;
    tu_loops *l = arg;
    ck_assert_int_lt(l->n, TU_MAX_LOOPS);
    l->start[l->n] = ifd_run_context_global_step(ctx);
    l->len[l->n] = ifd_run_context_loop_length(ctx);
    return IFD_OK;
}

static int loops_after(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    (void)err;
    tu_loops *l = arg;
    l->end[l->n++] = ifd_run_context_global_step(ctx);
    return IFD_OK;
}

ifd_hook tu_loops_hook(tu_loops *l)
{
    memset(l, 0, sizeof *l);
    return (ifd_hook){
        .name = "loops", .before_run = loops_before, .after_run = loops_after, .arg = l};
}
