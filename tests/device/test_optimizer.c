/* The optimizer features every program gets (device/step.h's optimizer_apply, device/math.h):
 * AdamW's decoupled weight decay and the parameters it leaves out, clipping by global norm,
 * learning-rate schedules, each against a double-precision reference over random sizes and
 * data; the update over a team has the bits of the update on its caller. Each test prints its
 * seed when it fails (IFD_TEST_SEED replays it). */
#include "core/rng.h"
#include "device/cpu/team.h"
#include "device/math.h"
#include "device/step.h"
#include "tests/util/numbers.h"
#include "tests/util/testutil.h"

#include <infeed/checkpoint.h>

#include <check.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const double E = 8.0 * FLT_EPSILON;

/* The schedule's closed form, in Keras's terms (CosineDecay with warmup, PolynomialDecay of
 * power 1 after a linear warmup from 0). */
static double lr_reference(const ifd_optimizer *o, int64_t t)
{
    double lr = o->learning_rate, w = (double)o->warmup_steps;
    if (t < o->warmup_steps)
        return lr * (double)t / w;
    if (o->lr_schedule == IFD_LR_CONSTANT)
        return lr;
    double span = (double)(o->decay_steps - o->warmup_steps);
    double done = fmin((double)(t - o->warmup_steps), span);
    double alpha = o->min_learning_rate / lr;
    if (o->lr_schedule == IFD_LR_COSINE)
        return lr * ((1.0 - alpha) * 0.5 * (1.0 + cos(M_PI * done / span)) + alpha);
    return (lr - o->min_learning_rate) * (1.0 - done / span) + o->min_learning_rate;
}

static ifd_optimizer random_schedule(ifd_rng *rng, ifd_lr_schedule kind)
{
    ifd_optimizer o = {.kind = IFD_OPT_SGD, .lr_schedule = kind};
    o.learning_rate = (float)pow(10.0, tu_urand(rng, -4.0, 0.0));
    o.min_learning_rate =
        ifd_rng_uniform(rng) < 0.25 ? 0.0f : o.learning_rate * (float)tu_urand(rng, 0, 1);
    o.warmup_steps = ifd_rng_uniform(rng) < 0.25 ? 0 : rand_between(rng, 1, 5000);
    o.decay_steps = o.warmup_steps + rand_between(rng, 1, 100000);
    return o;
}

/* Each schedule's value at random steps (and at the corners: 0, the warmup's end, the decay's
 * end and beyond) against its closed form; it rises during the warmup and never rises after. */
START_TEST(test_schedule_values)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int trial = 0; trial < 60; trial++) {
        ifd_lr_schedule kind = (ifd_lr_schedule)(trial % 3);
        ifd_optimizer o = random_schedule(&rng, kind);
        int64_t corners[] = {0,
                             o.warmup_steps,
                             o.warmup_steps + 1,
                             o.decay_steps - 1,
                             o.decay_steps,
                             o.decay_steps + rand_between(&rng, 1, 1000000)};
        float prev = 0.0f;
        int64_t prev_t = -1;
        for (int k = 0; k < 200; k++) {
            int64_t t = k < 6 ? corners[k] : rand_between(&rng, 0, o.decay_steps + 1000);
            if (k == 6)
                prev_t = -1;
            float got = ifd_math_lr_at((int)o.lr_schedule, o.learning_rate, o.min_learning_rate,
                                       o.warmup_steps, o.decay_steps, t);
            double want = lr_reference(&o, t);
            RASSERT(fabs((double)got - want) <= 4.0 * FLT_EPSILON * fabs(want) + 1e-30,
                    "%s lr %g min %g warmup %lld decay %lld: step %lld gives %.9g, the closed "
                    "form %.9g",
                    ifd_lr_schedule_name(kind), (double)o.learning_rate,
                    (double)o.min_learning_rate, (long long)o.warmup_steps,
                    (long long)o.decay_steps, (long long)t, (double)got, want);
            if (t == 0 && o.warmup_steps > 0)
                RASSERT(got == 0.0f, "the warmup starts from 0, got %g", (double)got);
            if (t >= o.warmup_steps && kind == IFD_LR_CONSTANT)
                RASSERT(got == o.learning_rate, "constant: %g, not the learning rate %g",
                        (double)got, (double)o.learning_rate);
            if (t >= o.decay_steps && kind != IFD_LR_CONSTANT)
                RASSERT(fabs((double)got - o.min_learning_rate) <=
                            4.0 * FLT_EPSILON * o.min_learning_rate,
                        "step %lld, after the decay: %.9g, not the floor %.9g", (long long)t,
                        (double)got, (double)o.min_learning_rate);
            if (k < 6 && prev_t >= 0 && t > prev_t && prev_t >= o.warmup_steps)
                RASSERT(got <= prev, "step %lld: %.9g, above step %lld's %.9g", (long long)t,
                        (double)got, (long long)prev_t, (double)prev);
            prev = got;
            prev_t = t;
        }
    }
}
END_TEST

/* A program's parameter list (the list is any length: more than a built-in program has). */
#define MAX_SPECS 24
typedef struct spec_list {
    int n;
    ifd_param_spec p[MAX_SPECS];
} spec_list;

/* 1 to MAX_SPECS parameters tiling n floats, each flagged no-decay with probability 1/2. */
static void random_params(ifd_rng *rng, spec_list *l, int64_t n)
{
    memset(l, 0, sizeof *l);
    l->n = (int)rand_between(rng, 1, n < MAX_SPECS ? n : MAX_SPECS);
    int64_t at = 0;
    for (int i = 0; i < l->n; i++) {
        int64_t left = n - at, rest = l->n - i - 1;
        int64_t c = i == l->n - 1 ? left : rand_between(rng, 1, left - rest);
        l->p[i] = (ifd_param_spec){.rank = 1,
                                   .dims = {c},
                                   .offset = at,
                                   .count = c,
                                   .flags = (unsigned)(rand_between(rng, 0, 1))};
        at += c;
    }
}

/* The ranges name exactly the flagged parameters' elements, sorted, disjoint and merged. */
START_TEST(test_nodecay_ranges)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int trial = 0; trial < 200; trial++) {
        int64_t n = rand_between(&rng, 1, 5000);
        spec_list p;
        random_params(&rng, &p, n);
        if (trial % 2) /* the spec list need not be in offset order */
            for (int i = p.n - 1; i > 0; i--) {
                int j = (int)rand_between(&rng, 0, i);
                ifd_param_spec t = p.p[i];
                p.p[i] = p.p[j];
                p.p[j] = t;
            }
        int64_t r[2 * MAX_SPECS];
        int64_t nr = ifd_optimizer_nodecay_ranges(p.p, p.n, r);
        for (int64_t j = 0; j < nr; j++)
            RASSERT(r[2 * j] < r[2 * j + 1] && (j == 0 || r[2 * j] > r[2 * j - 1]),
                    "range %lld [%lld, %lld) is empty, out of order or touches the one before",
                    (long long)j, (long long)r[2 * j], (long long)r[2 * j + 1]);
        for (int i = 0; i < p.n; i++) {
            const ifd_param_spec *ps = &p.p[i];
            for (int64_t e = ps->offset; e < ps->offset + ps->count; e++)
                RASSERT(ifd_math_in_ranges(r, nr, e) == (int)(ps->flags & IFD_PARAM_NO_DECAY),
                        "element %lld of parameter %d (flags %u): in the ranges %d", (long long)e,
                        i, ps->flags, ifd_math_in_ranges(r, nr, e));
        }
    }
}
END_TEST

typedef struct mirror {
    float *p, *g, *m, *v;
} mirror;

static void mirror_random(ifd_rng *rng, mirror *x, int64_t n)
{
    x->p = tu_falloc(n);
    x->g = tu_falloc(n);
    x->m = tu_falloc(n);
    x->v = tu_falloc(n);
    for (int64_t i = 0; i < n; i++) {
        x->p[i] = (float)tu_urand(rng, -2.0, 2.0);
        x->g[i] = (float)(tu_urand(rng, -1.0, 1.0) * pow(10.0, tu_urand(rng, -4.0, 0.0)));
        x->m[i] = (float)(tu_urand(rng, -1.0, 1.0) * pow(10.0, tu_urand(rng, -4.0, 0.0)));
        x->v[i] = (float)(ifd_rng_uniform(rng) * pow(10.0, tu_urand(rng, -8.0, 0.0)));
    }
}

static void mirror_copy(mirror *dst, const mirror *src, int64_t n)
{
    size_t b = sizeof(float) * (size_t)n;
    dst->p = memcpy(tu_falloc(n), src->p, b);
    dst->g = memcpy(tu_falloc(n), src->g, b);
    dst->m = memcpy(tu_falloc(n), src->m, b);
    dst->v = memcpy(tu_falloc(n), src->v, b);
}

static void mirror_free(mirror *x)
{
    free(x->p);
    free(x->g);
    free(x->m);
    free(x->v);
}

static ifd_replica_state state_of(mirror *x, int64_t *opt_step, const int64_t *r, int64_t nr)
{
    return (ifd_replica_state){.params = x->p,
                               .grads = x->g,
                               .slot0 = x->m,
                               .slot1 = x->v,
                               .opt_step = opt_step,
                               .nodecay = r,
                               .nnodecay = nr};
}

/* One element's update in double, from the float inputs, and how far float may be from it:
 * the gradient scaled by clip, then the kind's formula (adamw: decay wd at rate lr first). */
static void reference(const ifd_optimizer *o, double lr, double clip, double wd, int64_t t,
                      double p, double g, double m, double v, double *want, double *tol)
{
    g *= clip;
    double tol_g = E * fabs(g);
    switch (o->kind) {
    case IFD_OPT_SGD:
        *want = p - lr * g;
        *tol = E * (fabs(p) + lr * fabs(g)) + lr * tol_g;
        return;
    case IFD_OPT_MOMENTUM: {
        double mm = o->momentum * m + g;
        double tol_m = E * (fabs(o->momentum * m) + fabs(g)) + tol_g;
        *want = p - lr * mm;
        *tol = E * fabs(p) + lr * (fabs(mm) * E + tol_m);
        return;
    }
    default: {
        double b1 = o->beta1, b2 = o->beta2;
        double lr_t = lr * sqrt(1.0 - pow(b2, (double)(t + 1))) / (1.0 - pow(b1, (double)(t + 1)));
        double pd = p - p * wd * lr;
        double mm = b1 * m + (1.0 - b1) * g, vv = b2 * v + (1.0 - b2) * g * g;
        double tol_m = E * (fabs(b1 * m) + fabs((1.0 - b1) * g)) + (1.0 - b1) * tol_g;
        double den = sqrt(vv) + o->epsilon;
        *want = pd - lr_t * mm / den;
        /* v's error moves the denominator by at most E relative (and clip's by 2 tol_g) */
        *tol =
            E * (fabs(p) + fabs(p * wd * lr)) +
            lr_t * (fabs(mm) * 3.0 * E + tol_m + fabs(mm) * 2.0 * tol_g / (fabs(g) + 1e-30)) / den;
        return;
    }
    }
}

/* Checks every element of the updated mirror x against the reference from the inputs in. */
static void check_update(const ifd_optimizer *o, double lr, double clip, const int64_t *r,
                         int64_t nr, int64_t t, const mirror *in, const mirror *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        double wd =
            o->kind == IFD_OPT_ADAMW && !ifd_math_in_ranges(r, nr, i) ? o->weight_decay : 0.0;
        double want, tol;
        reference(o, lr, clip, wd, t, in->p[i], in->g[i], in->m[i], in->v[i], &want, &tol);
        RASSERT(fabs((double)x->p[i] - want) <= tol + 1e-30,
                "%s step %lld lr %g clip factor %g wd %g, element %lld of %lld (p %g g %g m %g "
                "v %g): %.9g, the reference %.9g",
                ifd_optimizer_name(o->kind), (long long)t, lr, clip, wd, (long long)i, (long long)n,
                (double)in->p[i], (double)in->g[i], (double)in->m[i], (double)in->v[i],
                (double)x->p[i], want);
    }
}

static ifd_optimizer random_optimizer(ifd_rng *rng, ifd_optimizer_kind kind)
{
    ifd_optimizer o = random_schedule(rng, (ifd_lr_schedule)rand_between(rng, 0, 2));
    o.kind = kind;
    o.learning_rate = (float)tu_urand(rng, 0.01, 0.5);
    o.min_learning_rate = o.learning_rate * 0.5f;
    o.momentum = (float)tu_urand(rng, 0.0, 0.99);
    o.weight_decay = (float)tu_urand(rng, 0.1, 0.5);
    o.beta1 = (float)tu_urand(rng, 0.5, 0.95);
    o.beta2 = (float)tu_urand(rng, 0.9, 0.9999);
    o.epsilon = (float)pow(10.0, tu_urand(rng, -8.0, -2.0));
    return o;
}

/* AdamW over random parameter lists: every element against the reference (decay at the
 * schedule's rate outside the no-decay ranges), the elements a parameter's IFD_PARAM_NO_DECAY
 * leaves out with Adam's bits, and weight_decay 0 gives Adam's bits; a team gives the bits of
 * the caller alone; out->learning_rate is the schedule's; the step count is only read. */
START_TEST(test_adamw)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_team *team;
    ck_assert_int_eq(ifd_team_create(&team, (int)rand_between(&rng, 2, 3), "test-adamw"), IFD_OK);
    for (int trial = 0; trial < 8; trial++) {
        int64_t n = trial < 4 ? rand_between(&rng, 1, 300)
                              : rand_between(&rng, IFD_TEAM_UPDATE_BLOCK + 1, 40000);
        spec_list prog;
        random_params(&rng, &prog, n);
        int64_t r[2 * MAX_SPECS];
        int64_t nr = ifd_optimizer_nodecay_ranges(prog.p, prog.n, r);
        ifd_optimizer o = random_optimizer(&rng, IFD_OPT_ADAMW);
        int64_t t = o.warmup_steps + rand_between(&rng, 0, 50), t0 = t;
        mirror in, x, y, z, w;
        mirror_random(&rng, &in, n);
        mirror_copy(&x, &in, n);
        mirror_copy(&y, &in, n);
        mirror_copy(&z, &in, n);
        mirror_copy(&w, &in, n);
        ifd_replica_state sx = state_of(&x, &t, r, nr), sy = state_of(&y, &t, r, nr);
        ifd_step_out ox = {0}, oy = {0}, oz = {0}, ow = {0};
        double *partial = malloc(sizeof(double) * (size_t)ifd_cpu_blocks(n));
        ifd_cpu_update_on(NULL, &o, &sx, n, NULL, &ox);
        ifd_cpu_update_on(team, &o, &sy, n, partial, &oy);
        free(partial);
        RASSERT(memcmp(x.p, y.p, sizeof(float) * (size_t)n) == 0 && ox.param_norm == oy.param_norm,
                "%lld floats: the team's update differs from the caller's", (long long)n);
        float lr = ifd_math_lr_at((int)o.lr_schedule, o.learning_rate, o.min_learning_rate,
                                  o.warmup_steps, o.decay_steps, t);
        RASSERT(ox.learning_rate == lr && lr > 0.0f, "learning_rate %g, the schedule's %g",
                (double)ox.learning_rate, (double)lr);
        check_update(&o, lr, 1.0, r, nr, t, &in, &x, n);
        /* Adam on the same mirror: the no-decay elements' bits; AdamW without decay: all */
        ifd_optimizer adam = o, nodecay = o;
        adam.kind = IFD_OPT_ADAM;
        nodecay.weight_decay = 0.0f;
        ifd_replica_state sz = state_of(&z, &t, NULL, 0), sw = state_of(&w, &t, NULL, 0);
        ifd_cpu_update_on(NULL, &adam, &sz, n, NULL, &oz);
        ifd_cpu_update_on(NULL, &nodecay, &sw, n, NULL, &ow);
        RASSERT(memcmp(z.p, w.p, sizeof(float) * (size_t)n) == 0,
                "adamw with weight_decay 0 differs from adam");
        int64_t left_out = 0;
        for (int64_t i = 0; i < n; i++) {
            if (!ifd_math_in_ranges(r, nr, i))
                continue;
            left_out++;
            RASSERT(x.p[i] == z.p[i] && x.m[i] == z.m[i] && x.v[i] == z.v[i],
                    "element %lld, left out of decay: %.9g, Adam gives %.9g", (long long)i,
                    (double)x.p[i], (double)z.p[i]);
        }
        RASSERT(nr == 0 || left_out > 0, "%lld ranges and no element in them", (long long)nr);
        mirror_free(&in);
        mirror_free(&x);
        mirror_free(&y);
        mirror_free(&z);
        mirror_free(&w);
        RASSERT(t == t0, "the update wrote the step count");
    }
    ifd_team_destroy(team);
}
END_TEST

/* Every kind's update over a vector (device/step_cpu.c's loops, which the compiler vectorizes)
 * against the one-element functions of device/math.h called here, element by element: the same
 * bits, on random sizes (odd ones, and beyond a team block) with random no-decay ranges. */
START_TEST(test_update_has_elementwise_bits)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int kind = IFD_OPT_SGD; kind <= IFD_OPT_ADAMW; kind++) {
        int64_t n = kind % 2 ? rand_between(&rng, 1, 300)
                             : rand_between(&rng, IFD_TEAM_UPDATE_BLOCK + 1, 20000);
        spec_list prog;
        random_params(&rng, &prog, n);
        int64_t r[2 * MAX_SPECS];
        int64_t nr = ifd_optimizer_nodecay_ranges(prog.p, prog.n, r);
        ifd_optimizer o = random_optimizer(&rng, (ifd_optimizer_kind)kind);
        int64_t t = rand_between(&rng, 0, 2 * o.warmup_steps + 50);
        mirror in, x;
        mirror_random(&rng, &in, n);
        mirror_copy(&x, &in, n);
        ifd_replica_state sx = state_of(&x, &t, r, nr);
        ifd_step_out out = {0};
        ifd_cpu_update_on(NULL, &o, &sx, n, NULL, &out);
        float lr = ifd_math_lr_at((int)o.lr_schedule, o.learning_rate, o.min_learning_rate,
                                  o.warmup_steps, o.decay_steps, t);
        float lr_t = ifd_math_adam_lr(lr, o.beta1, o.beta2, t + 1);
        for (int64_t i = 0; i < n; i++) {
            float p = in.p[i], m = in.m[i], v = in.v[i], g = in.g[i]; /* no clip_norm */
            float wd = ifd_math_in_ranges(r, nr, i) ? 0.0f : o.weight_decay;
            if (kind == IFD_OPT_SGD)
                ifd_math_sgd(&p, g, lr);
            else if (kind == IFD_OPT_MOMENTUM)
                ifd_math_momentum(&p, &m, g, lr, o.momentum);
            else if (kind == IFD_OPT_ADAM)
                ifd_math_adam(&p, &m, &v, g, lr_t, o.beta1, o.beta2, o.epsilon);
            else
                ifd_math_adamw(&p, &m, &v, g, lr_t, o.beta1, o.beta2, o.epsilon, wd, lr);
            RASSERT(memcmp(&p, &x.p[i], sizeof p) == 0 && memcmp(&m, &x.m[i], sizeof m) == 0 &&
                        memcmp(&v, &x.v[i], sizeof v) == 0,
                    "%s, element %lld of %lld: p %.9g m %.9g v %.9g, one element at a time "
                    "%.9g %.9g %.9g",
                    ifd_optimizer_name(o.kind), (long long)i, (long long)n, (double)x.p[i],
                    (double)x.m[i], (double)x.v[i], (double)p, (double)m, (double)v);
        }
        mirror_free(&in);
        mirror_free(&x);
    }
}
END_TEST

/* Clipping by global norm, every kind: with the norm above clip_norm the update is the
 * reference's with gradients scaled by clip_norm / norm; at or below it, the bits of no
 * clipping. The gradient vector and out->grad_norm (the norm before clipping) stay. */
START_TEST(test_clip_norm)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int trial = 0; trial < 24; trial++) {
        ifd_optimizer_kind kind = (ifd_optimizer_kind)(trial % 4);
        int64_t n = rand_between(&rng, 1, trial < 12 ? 300 : 3 * IFD_TEAM_UPDATE_BLOCK);
        ifd_optimizer o = random_optimizer(&rng, kind);
        int64_t t = rand_between(&rng, 0, o.decay_steps + 10);
        mirror in, x, y;
        mirror_random(&rng, &in, n);
        ifd_step_out out = {0};
        ifd_cpu_check_grads_on(NULL, in.g, n, NULL, &out);
        float norm = out.grad_norm;
        int above = trial % 2 == 0;
        o.clip_norm = norm * (float)(above ? tu_urand(&rng, 0.05, 0.95) : tu_urand(&rng, 1.0, 3.0));
        mirror_copy(&x, &in, n);
        mirror_copy(&y, &in, n);
        ifd_replica_state sx = state_of(&x, &t, NULL, 0), sy = state_of(&y, &t, NULL, 0);
        ifd_cpu_update_on(NULL, &o, &sx, n, NULL, &out);
        RASSERT(out.grad_norm == norm && memcmp(x.g, in.g, sizeof(float) * (size_t)n) == 0,
                "the update changed the gradients or their reported norm");
        double lr = out.learning_rate;
        if (above) {
            check_update(&o, lr, (double)o.clip_norm / (double)norm, NULL, 0, t, &in, &x, n);
        } else {
            ifd_optimizer off = o;
            off.clip_norm = 0.0f;
            ifd_step_out o2 = out;
            ifd_cpu_update_on(NULL, &off, &sy, n, NULL, &o2);
            RASSERT(memcmp(x.p, y.p, sizeof(float) * (size_t)n) == 0,
                    "%s: a norm %g below clip_norm %g changed the update", ifd_optimizer_name(kind),
                    (double)norm, (double)o.clip_norm);
            check_update(&o, lr, 1.0, NULL, 0, t, &in, &x, n);
        }
        mirror_free(&in);
        mirror_free(&x);
        mirror_free(&y);
    }
}
END_TEST

/* A skipped step (out->skipped) changes nothing and still reports the schedule's rate. */
START_TEST(test_skipped_reports_rate)
{
    ifd_rng rng;
    seed_rng(&rng);
    int64_t n = rand_between(&rng, 1, 1000);
    ifd_optimizer o = random_optimizer(&rng, (ifd_optimizer_kind)rand_between(&rng, 0, 3));
    int64_t t = rand_between(&rng, 0, o.decay_steps);
    mirror in, x;
    mirror_random(&rng, &in, n);
    mirror_copy(&x, &in, n);
    ifd_replica_state sx = state_of(&x, &t, NULL, 0);
    ifd_step_out out = {.skipped = 1.0f, .grad_norm = NAN};
    ifd_step_ops sops;
    ifd_cpu_step_ops_init(&sops);
    sops.optimizer_apply(NULL, &o, &sx, n, &out);
    RASSERT(memcmp(x.p, in.p, sizeof(float) * (size_t)n) == 0 &&
                memcmp(x.m, in.m, sizeof(float) * (size_t)n) == 0 &&
                memcmp(x.v, in.v, sizeof(float) * (size_t)n) == 0,
            "a skipped step changed the mirror");
    float lr = ifd_math_lr_at((int)o.lr_schedule, o.learning_rate, o.min_learning_rate,
                              o.warmup_steps, o.decay_steps, t);
    RASSERT(out.learning_rate == lr, "learning_rate %g, the schedule's %g at step %lld",
            (double)out.learning_rate, (double)lr, (long long)t);
    mirror_free(&in);
    mirror_free(&x);
}
END_TEST

/* Through a session (the cpu backend's wiring of the program's flags): from random parameters
 * and slots, one AdamW step with weight decay and one without leave the flagged bias with the
 * same bits and the weights apart; the mirrors of every replica agree. */
START_TEST(test_session_leaves_flagged_params_alone)
{
    ifd_rng rng;
    seed_rng(&rng);
    int replicas = (int)rand_between(&rng, 1, 3);
    ifd_config cfg;
    tu_config_train(&cfg, "softmax-nodecay", IFD_OPT_ADAMW, rand_between(&rng, 1, 8),
                    rand_between(&rng, 2, 6), replicas * rand_between(&rng, 1, 4), 1, 7);
    cfg.replicas = replicas;
    cfg.steps = 1;
    cfg.optimizer.learning_rate = 0.1f;
    cfg.optimizer.weight_decay = 0.5f;
    ifd_program p;
    ifd_error err;
    RC_OK(ifd_program_init(&p, cfg.program, &cfg.settings, &err), err);
    int64_t n = p.nparam_floats;
    mirror start;
    mirror_random(&rng, &start, n);
    float *slots = tu_falloc(2 * n);
    memcpy(slots, start.m, sizeof(float) * (size_t)n);
    memcpy(slots + n, start.v, sizeof(float) * (size_t)n);
    ifd_checkpoint *c;
    RC_OK(ifd_checkpoint_create(&c, &cfg, 0, rand_between(&rng, 0, 100), start.p, slots, &err),
          err);
    cfg.restore = c;
    tu_batch **bs = tu_batches_random(&cfg, 1, g_seed);
    tu_result a, b;
    tu_run(&cfg, bs, 1, &a);
    cfg.optimizer.weight_decay = 0.0f;
    tu_run(&cfg, bs, 1, &b);
    RASSERT(a.rc == IFD_OK && b.rc == IFD_OK && a.mirrors_identical && b.mirrors_identical, "%s %s",
            a.err.msg, b.err.msg);
    int flagged = 0;
    for (int i = 0; i < p.nparams; i++) {
        const ifd_param_spec *ps = &p.params[i];
        size_t bytes = sizeof(float) * (size_t)ps->count;
        int same = memcmp(a.params + ps->offset, b.params + ps->offset, bytes) == 0;
        flagged += (ps->flags & IFD_PARAM_NO_DECAY) != 0;
        RASSERT(same == ((ps->flags & IFD_PARAM_NO_DECAY) != 0),
                "%d replicas, parameter '%s' (flags %u): weight decay %s its bits", replicas,
                ps->name, ps->flags, same ? "left" : "changed");
    }
    RASSERT(flagged == 1, "%d parameters flagged", flagged);
    tu_result_free(&a);
    tu_result_free(&b);
    tu_batches_free(bs, 1);
    ifd_checkpoint_free(c);
    mirror_free(&start);
    free(slots);
    ifd_program_free(&p);
}
END_TEST

/* ifd_config_validate over the new keys: each refusal names its key, what was expected and
 * what was given; the combinations a schedule needs pass. */
START_TEST(test_config_rules)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_error err;
    for (int trial = 0; trial < 50; trial++) {
        ifd_config cfg;
        tu_config_train(&cfg, "softmax", IFD_OPT_ADAMW, 3, 2, 4, 1, 1);
        ifd_optimizer *o = &cfg.optimizer;
        o->lr_schedule = (ifd_lr_schedule)rand_between(&rng, 1, 2);
        o->warmup_steps = rand_between(&rng, 0, 1000);
        o->decay_steps = o->warmup_steps + rand_between(&rng, 1, 1000);
        o->min_learning_rate = o->learning_rate * (float)tu_urand(&rng, 0.0, 1.0);
        o->clip_norm = (float)tu_urand(&rng, 0.0, 5.0);
        RASSERT(ifd_config_validate(&cfg, &err) == IFD_OK, "a valid schedule: %s", err.msg);
        ifd_config bad = cfg;
        char want[160];
        switch (trial % 6) {
        case 0: /* the decay must end after the warmup */
            bad.optimizer.decay_steps = rand_between(&rng, 0, o->warmup_steps);
            snprintf(want, sizeof want,
                     "decay_steps: expected more than warmup_steps (%lld) with lr_schedule %s",
                     (long long)o->warmup_steps, ifd_lr_schedule_name(o->lr_schedule));
            break;
        case 1:
            bad.optimizer.min_learning_rate = o->learning_rate * (float)tu_urand(&rng, 1.5, 9.0);
            snprintf(want, sizeof want,
                     "min_learning_rate: expected at most learning_rate (%g), the rate "
                     "lr_schedule %s decays from, got %g",
                     (double)o->learning_rate, ifd_lr_schedule_name(o->lr_schedule),
                     (double)bad.optimizer.min_learning_rate);
            break;
        case 2: /* a constant rate takes no decay_steps */
            bad.optimizer.lr_schedule = IFD_LR_CONSTANT;
            snprintf(want, sizeof want,
                     "decay_steps: expected 0 (unset) with lr_schedule constant, which does not "
                     "decay (cosine or linear do), got %lld",
                     (long long)o->decay_steps);
            break;
        case 3:
            bad.optimizer.clip_norm = -(float)tu_urand(&rng, 0.01, 5.0);
            snprintf(want, sizeof want, "clip_norm: expected 0 (no clipping) or a positive norm");
            break;
        case 4:
            bad.optimizer.weight_decay = -(float)tu_urand(&rng, 0.01, 5.0);
            snprintf(want, sizeof want, "weight_decay: expected 0 or more, got");
            /* adam has no weight decay to check */
            ifd_config adam = bad;
            adam.optimizer.kind = IFD_OPT_ADAM;
            RASSERT(ifd_config_validate(&adam, &err) == IFD_OK, "adam: %s", err.msg);
            break;
        default:
            bad.optimizer.warmup_steps = -rand_between(&rng, 1, 100);
            snprintf(want, sizeof want, "warmup_steps: expected 0 or more, got %lld",
                     (long long)bad.optimizer.warmup_steps);
            break;
        }
        RASSERT(ifd_config_validate(&bad, &err) == IFD_EINVAL && strstr(err.msg, want),
                "case %d: '%s', want '%s'", trial % 6, err.msg, want);
    }
    ifd_config cfg;
    tu_config_train(&cfg, "softmax", IFD_OPT_ADAMW, 3, 2, 4, 1, 1);
    cfg.optimizer.lr_schedule = (ifd_lr_schedule)3;
    RASSERT(ifd_config_validate(&cfg, &err) == IFD_EINVAL &&
                strstr(err.msg, "lr_schedule: expected constant, cosine or linear, got 3"),
            "%s", err.msg);
    cfg.optimizer.lr_schedule = IFD_LR_CONSTANT;
    cfg.optimizer.warmup_steps = 10; /* a warmup to a constant rate */
    RASSERT(ifd_config_validate(&cfg, &err) == IFD_OK, "%s", err.msg);
}
END_TEST

int main(void)
{
    tu_register_softmax_nodecay("softmax-nodecay");
    Suite *s = suite_create("optimizer");
    TCase *tc = tu_tcase(s, "schedules", 60);
    tcase_add_test(tc, test_schedule_values);
    tc = tu_tcase(s, "adamw", 60);
    tcase_add_test(tc, test_nodecay_ranges);
    tcase_add_test(tc, test_adamw);
    tcase_add_test(tc, test_update_has_elementwise_bits);
    tcase_add_test(tc, test_session_leaves_flagged_params_alone);
    tcase_add_test(tc, test_config_rules);
    tc = tu_tcase(s, "clipping", 60);
    tcase_add_test(tc, test_clip_norm);
    tcase_add_test(tc, test_skipped_reports_rate);
    return tu_run_suite(s);
}
