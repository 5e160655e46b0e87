/* The cuda backend against the cpu backend: the same programs, optimizers, replica counts, loop
 * lengths, seeds and data through the public session API must end with the same parameters and
 * report the same losses and accuracies, with CUDA Graphs on and off, over 20 steps and over 400;
 * eval summaries and predictions must agree too. Exits 77 (CTest: skipped) where no GPU is
 * usable. */
#include "tests/gpu/gpu_probe.h"
#include "tests/util/numbers.h"
#include "tests/util/testutil.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REL_TOL 1e-4
/* LONG_STEPS steps on data that training learns (tu_batches_teacher), one train summary a step:
 * each step's loss within LONG_TOL_SOFTMAX (softmax) or LONG_TOL_MLP (mlp) of the cpu run's, and
 * the parameter vectors within the same relative L2 distance. Calibrated on the cpu backend,
 * where 1 and 3 replicas sum the batch in different orders (this test with the cpu backend on
 * both sides): softmax runs stayed within 1e-6; an mlp's ReLUs turn on or off at another step
 * when a pre-activation is within rounding of 0, so its runs drift apart: up to 1.2e-3 in loss
 * and 8e-4 in parameters in 100 runs, 2e-2 in loss once in 600 at 12 rows a batch (hence at
 * least 48 here); 0 failures in 800 runs with these bounds, and 0 in 800 again with the cpu
 * backend's BLAS kernel choice (--blas-kernel auto). One batch skipped halfway failed all 96
 * runs; two batches swapped halfway failed every softmax run and 40 of 48 mlp runs. */
#define LONG_STEPS 400
#define LONG_TOL_SOFTMAX 1e-4
#define LONG_TOL_MLP 5e-2

static int g_gpus;

static const char *const programs[] = {"linear", "softmax"};
static const ifd_optimizer_kind optimizers[] = {IFD_OPT_SGD, IFD_OPT_MOMENTUM, IFD_OPT_ADAM};

static int close_enough(double a, double e, double tol)
{
    return fabs(a - e) <= tol * (fabs(e) + 1e-3);
}

/* Summary i of both runs: same event and global step; loss and accuracy within tol. */
static void compare_summaries(const tu_result *gpu, const tu_result *cpu, const char *what,
                              double tol)
{
    ck_assert_msg(gpu->nsummaries == cpu->nsummaries, "%s: %zu summaries on cuda, %zu on cpu", what,
                  gpu->nsummaries, cpu->nsummaries);
    for (size_t i = 0; i < cpu->nsummaries; i++) {
        json_error_t je;
        json_t *g = json_loads(gpu->summaries[i], 0, &je);
        json_t *c = json_loads(cpu->summaries[i], 0, &je);
        ck_assert_ptr_nonnull(g);
        ck_assert_ptr_nonnull(c);
        ck_assert_str_eq(json_string_value(json_object_get(g, "event")),
                         json_string_value(json_object_get(c, "event")));
        ck_assert_int_eq(json_integer_value(json_object_get(g, "global_step")),
                         json_integer_value(json_object_get(c, "global_step")));
        static const char *const keys[] = {"loss", "accuracy"};
        for (int j = 0; j < 2; j++) {
            json_t *gv = json_object_get(g, keys[j]), *cv = json_object_get(c, keys[j]);
            ck_assert_msg((gv == NULL) == (cv == NULL), "%s: summary %zu: '%s' on one side only",
                          what, i, keys[j]);
            if (cv == NULL)
                continue;
            double a = json_number_value(gv), e = json_number_value(cv);
            /* cuBLAS and the CPU BLAS sum in different orders, so a row whose two largest logits
             * are within float rounding may take a different argmax: accuracy may differ by one
             * example of the window, plus the fraction tol (a real argmax or label bug moves
             * many). */
            double examples = (double)json_integer_value(json_object_get(c, "examples"));
            int ok = j == 1 && examples > 0 ? fabs(a - e) * examples <= 1.0 + tol * examples + 1e-6
                                            : close_enough(a, e, tol);
            ck_assert_msg(ok, "%s: summary %zu: %s %.9g on cuda, %.9g on cpu", what, i, keys[j], a,
                          e);
        }
        json_decref(g);
        json_decref(c);
    }
}

static void compare_runs(const tu_result *gpu, const tu_result *cpu, const char *what, double tol)
{
    ck_assert_msg(gpu->rc == IFD_OK, "%s: cuda run: %s", what, ifd_error_text(&gpu->err));
    ck_assert_msg(cpu->rc == IFD_OK, "%s: cpu run: %s", what, ifd_error_text(&cpu->err));
    ck_assert_int_eq(gpu->global_step, cpu->global_step);
    ck_assert_int_eq(gpu->reason, cpu->reason);
    ck_assert_int_eq(gpu->released, cpu->released);
    ck_assert_msg(gpu->mirrors_identical, "%s: the cuda replicas' parameters differ", what);
    double diff = tu_max_rel_diff(gpu->params, cpu->params, cpu->nparams, 1e-2);
    ck_assert_msg(diff <= tol, "%s: parameters differ from cpu by %g relative", what, diff);
    compare_summaries(gpu, cpu, what, tol);
}

/* cfg's run on cuda, with CUDA Graphs on or off. */
static void run_cuda(const ifd_config *cfg, tu_batch **bs, int64_t n, int graphs, tu_result *res)
{
    ifd_config c = *cfg;
    c.backend = "cuda";
    c.cuda_graphs = graphs;
    tu_run(&c, bs, n, res);
}

/* nb random batches (from data_seed) on cpu and on cuda (CUDA Graphs on or off): the runs must
 * agree. *gpu is the cuda run, for the caller to check further and free. */
static void run_both(const ifd_config *cfg, int64_t nb, uint64_t data_seed, int graphs,
                     const char *what, tu_result *gpu)
{
    tu_batch **bs = tu_batches_random(cfg, nb, data_seed);
    tu_result cpu;
    tu_run(cfg, bs, nb, &cpu);
    run_cuda(cfg, bs, nb, graphs, gpu);
    compare_runs(gpu, &cpu, what, REL_TOL);
    tu_result_free(&cpu);
    tu_batches_free(bs, nb);
}

/* _i picks the program and the optimizer; every replica count, loop length and graph setting
 * runs on the same random shapes and data. */
START_TEST(cuda_matches_cpu)
{
    const char *program = programs[_i % 2];
    ifd_optimizer_kind opt = optimizers[(_i / 2) % 3];
    ifd_rng rng;
    seed_rng(&rng);
    int64_t d = rand_between(&rng, 1, 40);
    int64_t k = rand_between(&rng, 2, 12);
    int64_t b = 12 * rand_between(&rng, 1, 8); /* divisible by 1..4 */
    static const int64_t ipls[] = {1, 50};
    int max_r = g_gpus < 4 ? g_gpus : 4;
    for (int r = 1; r <= max_r; r++) {
        for (int li = 0; li < 2; li++) {
            ifd_config cfg;
            tu_config_train(&cfg, program, opt, d, k, b, ipls[li], 99 + (uint64_t)_i);
            cfg.replicas = r;
            tu_batch **bs = tu_batches_random(&cfg, cfg.steps, g_seed + (uint64_t)r);
            tu_result cpu;
            tu_run(&cfg, bs, cfg.steps, &cpu);
            for (int graphs = 0; graphs <= 1; graphs++) {
                char what[160];
                snprintf(what, sizeof what, "%s/%s D=%lld K=%lld B=%lld R=%d ipl=%lld graphs=%d",
                         program, ifd_optimizer_name(opt), (long long)d, (long long)k, (long long)b,
                         r, (long long)cfg.iterations_per_loop, graphs);
                tu_result gpu;
                run_cuda(&cfg, bs, cfg.steps, graphs, &gpu);
                compare_runs(&gpu, &cpu, what, REL_TOL);
                tu_result_free(&gpu);
            }
            tu_result_free(&cpu);
            tu_batches_free(bs, cfg.steps);
        }
    }
}
END_TEST

/* AdamW with a bias left out of decay, clipping by global norm (the norm read on the device)
 * and a cosine or linear schedule warming up and decaying inside the run: cuda as cpu, with
 * and without graphs (the schedule's step is read on the device at every replay). */
START_TEST(optimizer_features_match_cpu)
{
    ifd_rng rng;
    seed_rng(&rng);
    int max_r = g_gpus < 2 ? g_gpus : 2;
    ifd_config cfg;
    tu_config_train(&cfg, "softmax-nodecay", IFD_OPT_ADAMW, rand_between(&rng, 1, 30),
                    rand_between(&rng, 2, 10), 12 * rand_between(&rng, 1, 4), 1 + 9 * (_i % 2),
                    5 + (uint64_t)_i);
    cfg.replicas = (int)rand_between(&rng, 1, max_r);
    cfg.steps = 40;
    cfg.optimizer.learning_rate = 0.01f;
    cfg.optimizer.weight_decay = (float)tu_urand(&rng, 0.01, 0.2);
    cfg.optimizer.clip_norm = (float)tu_urand(&rng, 0.05, 1.0);
    cfg.optimizer.lr_schedule = _i / 2 ? IFD_LR_LINEAR : IFD_LR_COSINE;
    cfg.optimizer.warmup_steps = rand_between(&rng, 0, 10);
    cfg.optimizer.decay_steps = cfg.optimizer.warmup_steps + rand_between(&rng, 1, 30);
    cfg.optimizer.min_learning_rate = 0.001f;
    for (int graphs = 0; graphs <= 1; graphs++) {
        char what[160];
        snprintf(what, sizeof what, "adamw/%s clip %g R=%d ipl=%lld graphs=%d",
                 ifd_lr_schedule_name(cfg.optimizer.lr_schedule), (double)cfg.optimizer.clip_norm,
                 cfg.replicas, (long long)cfg.iterations_per_loop, graphs);
        tu_result gpu;
        run_both(&cfg, cfg.steps, g_seed + (uint64_t)_i, graphs, what, &gpu);
        tu_result_free(&gpu);
    }
}
END_TEST

/* Batches with NaN in one row (a loss that is not finite) at random steps: the cuda run skips
 * the same steps as the cpu run (its guard and check kernels decide on the device, inside the
 * captured graph), ends with the same parameters and Adam count, and its summaries count and
 * name the same batches. */
START_TEST(skipped_steps_match_cpu)
{
    ifd_rng rng;
    seed_rng(&rng);
    const char *program = programs[_i % 2];
    int r = 1 + (int)rand_between(&rng, 0, (g_gpus < 4 ? g_gpus : 4) - 1);
    ifd_config cfg;
    tu_config_train(&cfg, program, IFD_OPT_ADAM, rand_between(&rng, 1, 30),
                    rand_between(&rng, 2, 10), 12 * rand_between(&rng, 1, 4),
                    rand_between(&rng, 1, 8), ifd_rng_next(&rng));
    cfg.replicas = r;
    cfg.max_skipped_steps = 0;
    tu_batch **bs = tu_batches_random(&cfg, cfg.steps, ifd_rng_next(&rng));
    int64_t bad = 0, cols = cfg.settings.features;
    for (int64_t i = 0; i < cfg.steps; i++)
        if (rand_between(&rng, 0, 3) == 0) {
            ((float *)bs[i]->data[0])[rand_between(&rng, 0, cfg.batch_size - 1) * cols] = NAN;
            bad++;
        }
    tu_result cpu, gpu;
    tu_run(&cfg, bs, cfg.steps, &cpu);
    run_cuda(&cfg, bs, cfg.steps, (int)rand_between(&rng, 0, 1), &gpu);
    char what[160];
    snprintf(what, sizeof what, "%s R=%d, %lld of %lld batches with a NaN", program, r,
             (long long)bad, (long long)cfg.steps);
    compare_runs(&gpu, &cpu, what, REL_TOL);
    for (size_t i = 0; i < cpu.nsummaries; i++) {
        json_t *g = json_loads(gpu.summaries[i], 0, NULL),
               *c = json_loads(cpu.summaries[i], 0, NULL);
        ck_assert_msg(
            json_equal(json_object_get(g, "skipped_steps"), json_object_get(c, "skipped_steps")) &&
                json_equal(json_object_get(g, "skipped_batches"),
                           json_object_get(c, "skipped_batches")),
            "%s: summary %zu: cuda %s, cpu %s", what, i, gpu.summaries[i], cpu.summaries[i]);
        json_decref(g);
        json_decref(c);
    }
    json_t *end = json_loads(cpu.summaries[cpu.nsummaries - 1], 0, NULL);
    ck_assert_int_eq(json_integer_value(json_object_get(end, "skipped_steps")), bad);
    json_decref(end);
    tu_result_free(&cpu);
    tu_result_free(&gpu);
    tu_batches_free(bs, cfg.steps);
}
END_TEST

/* Training over LONG_STEPS steps, one train summary a step: _i picks softmax or mlp and momentum
 * or Adam; shapes, loop length, replica count and graph setting are random. Every step's loss on
 * cuda within the program's tolerance of the cpu run's, the final parameters too, and both runs
 * learned. */
START_TEST(long_training_matches_cpu)
{
    const char *program = _i % 2 ? "mlp" : "softmax";
    ifd_optimizer_kind opt = _i / 2 ? IFD_OPT_ADAM : IFD_OPT_MOMENTUM;
    ifd_rng rng;
    seed_rng(&rng);
    int r = (int)rand_between(&rng, 1, g_gpus < 2 ? 1 : 2);
    int64_t d = rand_between(&rng, 4, 64), k = rand_between(&rng, 2, 10);
    int64_t b = 12 * rand_between(&rng, _i % 2 ? 4 : 1, 8); /* mlp: >= 48 rows, less noise */
    static const int64_t ipls[] = {1, 10, 100};
    int64_t ipl = ipls[rand_between(&rng, 0, 2)];
    int graphs = (int)rand_between(&rng, 0, 1);
    ifd_config cfg;
    tu_config_train(&cfg, program, opt, d, k, b, ipl, 31 + (uint64_t)_i);
    cfg.settings.hidden = rand_between(&rng, 8, 64);
    cfg.optimizer.learning_rate = opt == IFD_OPT_ADAM ? 0.003f : 0.05f;
    cfg.replicas = r;
    cfg.steps = LONG_STEPS;
    char what[160];
    snprintf(what, sizeof what,
             "%d steps %s/%s D=%lld H=%lld K=%lld B=%lld R=%d ipl=%lld graphs=%d", LONG_STEPS,
             program, ifd_optimizer_name(opt), (long long)d, (long long)cfg.settings.hidden,
             (long long)k, (long long)b, r, (long long)ipl, graphs);
    double tol = _i % 2 ? LONG_TOL_MLP : LONG_TOL_SOFTMAX;
    tu_batch **bs = tu_batches_teacher(&cfg, LONG_STEPS, g_seed + 17 * (uint64_t)_i);
    tu_result cpu, gpu;
    tu_run(&cfg, bs, LONG_STEPS, &cpu);
    run_cuda(&cfg, bs, LONG_STEPS, graphs, &gpu);
    ck_assert_msg(gpu.rc == IFD_OK, "%s: cuda run: %s", what, ifd_error_text(&gpu.err));
    ck_assert_msg(cpu.rc == IFD_OK, "%s: cpu run: %s", what, ifd_error_text(&cpu.err));
    ck_assert_int_eq(gpu.global_step, LONG_STEPS);
    ck_assert_int_eq(cpu.global_step, LONG_STEPS);
    ck_assert_msg(gpu.mirrors_identical, "%s: the cuda replicas' parameters differ", what);
    compare_summaries(&gpu, &cpu, what, tol);
    /* the parameters as one vector: a few weights near 0 may end far apart in relative terms
     * (an mlp's hidden units drift along flat directions), the vector may not */
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < cpu.nparams; i++) {
        double e = (double)gpu.params[i] - (double)cpu.params[i];
        num += e * e;
        den += (double)cpu.params[i] * cpu.params[i];
    }
    double pdiff = sqrt(num / (den > 0 ? den : 1.0));
    ck_assert_msg(pdiff <= tol, "%s: parameters differ from cpu by %g (relative L2 norm)", what,
                  pdiff);
    /* one train summary a step (and the end summary), and the loss of the last 20 steps well
     * below that of the first 20 on both */
    double first = 0.0, last = 0.0;
    int64_t ntrain = 0;
    for (size_t i = 0; i < cpu.nsummaries; i++) {
        json_error_t je;
        json_t *c = json_loads(cpu.summaries[i], 0, &je);
        ck_assert_ptr_nonnull(c);
        if (strcmp(json_string_value(json_object_get(c, "event")), "train") == 0) {
            double loss = json_number_value(json_object_get(c, "loss"));
            if (ntrain < 20)
                first += loss;
            if (ntrain >= LONG_STEPS - 20)
                last += loss;
            ntrain++;
        }
        json_decref(c);
    }
    ck_assert_int_eq(ntrain, LONG_STEPS);
    ck_assert_msg(last < 0.8 * first,
                  "%s: the loss did not fall: %g over the first 20 steps, %g "
                  "over the last 20",
                  what, first / 20, last / 20);
    tu_result_free(&cpu);
    tu_result_free(&gpu);
    tu_batches_free(bs, LONG_STEPS);
}
END_TEST

/* Rings of one slot: every shard waits for the previous step to finish, and the outfeed thread
 * holds back the only other record slot. Nothing may hang or reorder. */
START_TEST(one_slot_rings)
{
    ifd_config cfg;
    tu_config_train(&cfg, "softmax", IFD_OPT_ADAM, 9, 5, 24, 7, 7);
    cfg.replicas = g_gpus < 4 ? g_gpus : 4;
    cfg.steps = 30;
    cfg.infeed_depth = 1;
    cfg.outfeed_depth = 1;
    tu_result gpu;
    run_both(&cfg, cfg.steps, 3, _i, "one-slot rings", &gpu);
    tu_result_free(&gpu);
}
END_TEST

/* The input ends in the middle of a loop: the run ends well after the steps it had. */
START_TEST(input_ends_mid_loop)
{
    ifd_config cfg;
    tu_config_train(&cfg, "linear", IFD_OPT_MOMENTUM, 6, 3, 12, 4, 11);
    cfg.replicas = g_gpus < 2 ? g_gpus : 2;
    int64_t nb = 10; /* of 20 steps */
    tu_result gpu;
    run_both(&cfg, nb, 5, _i, "input ends mid-loop", &gpu);
    ck_assert_int_eq(gpu.reason, IFD_END_INPUT_ENDED);
    ck_assert_int_eq(gpu.global_step, nb);
    ck_assert_int_eq(gpu.released, nb);
    tu_result_free(&gpu);
}
END_TEST

/* Eval: the same checkpoint-free parameters (from the seed) and data give the same eval summary
 * on cuda and on cpu, and no update, for every replica count and graph setting. */
START_TEST(eval_matches_cpu)
{
    ifd_rng rng;
    seed_rng(&rng);
    int max_r = g_gpus < 4 ? g_gpus : 4;
    for (int r = 1; r <= max_r; r++) {
        ifd_config cfg;
        tu_config_train(&cfg, programs[_i % 2], IFD_OPT_SGD, rand_between(&rng, 1, 30),
                        rand_between(&rng, 2, 10), 12 * rand_between(&rng, 1, 4), 1, 5);
        cfg.replicas = r;
        cfg.mode = IFD_MODE_EVAL;
        cfg.steps = rand_between(&rng, 1, 20);
        cfg.last_step = 0;
        char what[96];
        snprintf(what, sizeof what, "eval %s R=%d graphs=%d", cfg.program, r, _i / 2);
        tu_result gpu;
        run_both(&cfg, cfg.steps, g_seed + (uint64_t)r, _i / 2, what, &gpu);
        ck_assert_int_eq(gpu.global_step, 0);
        tu_result_free(&gpu);
    }
}
END_TEST

/* Predict: every batch's predictions, in order, with the partial last batch's padding cut. */
typedef struct preds {
    int64_t n, rows[64], seq[64];
    float *v[64];
    int32_t *cls[64];
    int64_t cols;
} preds;

static int keep_preds(void *ctx, const ifd_batch *b, const ifd_predictions *p, ifd_error *err)
{
    (void)err;
    preds *c = ctx;
    ck_assert_int_lt(c->n, 64);
    int64_t i = c->n++;
    c->seq[i] = b->seq;
    c->rows[i] = p->rows;
    c->cols = p->tensors[0].shape.dims[1];
    size_t nv = (size_t)(p->rows * c->cols);
    c->v[i] = malloc(sizeof(float) * nv);
    memcpy(c->v[i], p->tensors[0].data, sizeof(float) * nv);
    c->cls[i] = NULL;
    if (p->ntensors == 2) {
        c->cls[i] = malloc(sizeof(int32_t) * (size_t)p->rows);
        memcpy(c->cls[i], p->tensors[1].data, sizeof(int32_t) * (size_t)p->rows);
    }
    return IFD_OK;
}

static void free_preds(preds *c)
{
    for (int64_t i = 0; i < c->n; i++) {
        free(c->v[i]);
        free(c->cls[i]);
    }
}

START_TEST(predict_matches_cpu)
{
    ifd_rng rng;
    seed_rng(&rng);
    int max_r = g_gpus < 4 ? g_gpus : 4;
    for (int r = 1; r <= max_r; r++) {
        ifd_config cfg;
        int64_t batch = 12 * rand_between(&rng, 1, 4);
        tu_config_train(&cfg, programs[_i % 2], IFD_OPT_SGD, rand_between(&rng, 1, 30),
                        rand_between(&rng, 2, 10), batch, rand_between(&rng, 1, 9), 5);
        cfg.replicas = r;
        cfg.mode = IFD_MODE_PREDICT;
        cfg.steps = cfg.last_step = 0;
        ifd_program p;
        ifd_error err;
        ck_assert_int_eq(ifd_program_init(&p, cfg.program, &cfg.settings, &err), IFD_OK);
        int64_t total = rand_between(&rng, 1, 20 * batch), nb = (total + batch - 1) / batch;
        tu_batch **bs = calloc((size_t)nb, sizeof *bs);
        for (int64_t i = 0; i < nb; i++) {
            bs[i] = tu_batch_random(&p, i == nb - 1 ? total - (nb - 1) * batch : batch, i, &rng);
            bs[i]->b.ntensors = 1; /* x only */
            free(bs[i]->data[1]);
            bs[i]->data[1] = NULL;
        }
        preds pc = {0}, pg = {0};
        ifd_prediction_sink sc = {keep_preds, &pc}, sg = {keep_preds, &pg};
        tu_result cpu, gpu;
        tu_run_predict(&cfg, bs, nb, &sc, &cpu);
        ifd_config gcfg = cfg;
        gcfg.backend = "cuda";
        gcfg.cuda_graphs = _i / 2;
        tu_run_predict(&gcfg, bs, nb, &sg, &gpu);
        ck_assert_msg(gpu.rc == IFD_OK, "cuda predict: %s", ifd_error_text(&gpu.err));
        ck_assert_int_eq(cpu.rc, IFD_OK);
        ck_assert_int_eq(gpu.released, nb);
        ck_assert_int_eq(pg.n, nb);
        ck_assert_int_eq(pc.n, nb);
        for (int64_t i = 0; i < nb; i++) {
            ck_assert_int_eq(pg.seq[i], i);
            ck_assert_int_eq(pg.rows[i], bs[i]->b.rows);
            double diff = tu_max_rel_diff(pg.v[i], pc.v[i], pg.rows[i] * pc.cols, 1e-2);
            ck_assert_msg(diff <= REL_TOL, "R=%d batch %lld: predictions differ by %g", r,
                          (long long)i, diff);
            for (int64_t row = 0; pg.cls[i] && row < pg.rows[i]; row++) {
                /* a near tie may take the other argmax (different summation orders) */
                const float *v = pc.v[i] + row * pc.cols;
                ck_assert_msg(pg.cls[i][row] == pc.cls[i][row] ||
                                  fabsf(v[pg.cls[i][row]] - v[pc.cls[i][row]]) < 1e-5f,
                              "R=%d batch %lld row %lld: class %d on cuda, %d on cpu", r,
                              (long long)i, (long long)row, pg.cls[i][row], pc.cls[i][row]);
            }
        }
        free_preds(&pc);
        free_preds(&pg);
        tu_result_free(&cpu);
        tu_result_free(&gpu);
        tu_batches_free(bs, nb);
        ifd_program_free(&p);
    }
}
END_TEST

#ifdef IFD_MLP2_PLUGIN
/* examples/custom_program's mlp2 plugin (tanh, tanh_grad, l2_decay besides the built-ins' ops)
 * through the session on cuda and cpu: the same parameters and summaries. */
START_TEST(plugin_matches_cpu)
{
    ifd_error err;
    ifd_error_clear(&err);
    ck_assert_msg(ifd_program_load_plugin(IFD_MLP2_PLUGIN, &err) == IFD_OK, "%s",
                  ifd_error_text(&err));
    ifd_rng rng;
    seed_rng(&rng);
    ifd_optimizer_kind opt = optimizers[_i % 3];
    int64_t d = rand_between(&rng, 1, 40), k = rand_between(&rng, 2, 12);
    int64_t h = rand_between(&rng, 1, 48), b = 12 * rand_between(&rng, 1, 8);
    int r = 1 + (int)(_i % (g_gpus < 2 ? 1 : 2));
    ifd_config cfg;
    tu_config_train(&cfg, "mlp2", opt, d, k, b, 7, 123 + (uint64_t)_i);
    cfg.settings.hidden = h;
    cfg.replicas = r;
    char what[160];
    snprintf(what, sizeof what, "mlp2/%s D=%lld H=%lld K=%lld B=%lld R=%d", ifd_optimizer_name(opt),
             (long long)d, (long long)h, (long long)k, (long long)b, r);
    tu_result gpu;
    run_both(&cfg, cfg.steps, g_seed + (uint64_t)_i, _i % 2, what, &gpu);
    tu_result_free(&gpu);
}
END_TEST
#endif

int main(void)
{
    char why[256];
    g_gpus = gpu_probe(why, sizeof why);
    if (g_gpus == 0) {
        printf("test_gpu: no usable GPU (%s): skipped\n", why);
        return 77;
    }
    printf("test_gpu: %d GPU%s visible\n", g_gpus, g_gpus == 1 ? "" : "s");
    tu_register_softmax_nodecay("softmax-nodecay");
    Suite *s = suite_create("gpu");
    TCase *tc = tcase_create("cuda_vs_cpu");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, cuda_matches_cpu, 0, 6);
    tcase_add_loop_test(tc, long_training_matches_cpu, 0, 4);
    tcase_add_loop_test(tc, optimizer_features_match_cpu, 0, 4);
    tcase_add_loop_test(tc, skipped_steps_match_cpu, 0, 4);
    tcase_add_loop_test(tc, one_slot_rings, 0, 2);
    tcase_add_loop_test(tc, input_ends_mid_loop, 0, 2);
    tcase_add_loop_test(tc, eval_matches_cpu, 0, 4);
    tcase_add_loop_test(tc, predict_matches_cpu, 0, 4);
#ifdef IFD_MLP2_PLUGIN
    tcase_add_loop_test(tc, plugin_matches_cpu, 0, 4);
#endif
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
