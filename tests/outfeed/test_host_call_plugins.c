/*
 * Host call plugins (include/infeed/host_call.h, outfeed/hostcall_plugins.c): examples/host_call's
 * calibration loads, registers its class with the tensors it takes, and computes what a plain
 * loop computes on random steps; the loader refuses, with a sentence naming the file, a plugin
 * without entry point, of another ABI version, registering nothing, an incomplete class, a class
 * without tensors or one name twice, and registers nothing of it; the outfeed thread's runner
 * (outfeed/plugin_calls.c) binds a class to the run's tensors by name, hands it each step's and
 * puts its summary under its name, and refuses a run whose program lacks a tensor it takes.
 */
#include "outfeed/plugin_calls.h"
#include "tests/util/testutil.h"
#include <infeed/host_call.h>

#include <jansson.h>
#include <math.h>
#include <string.h>

static const ifd_host_call_class *find(const char *name)
{
    for (int i = 0; i < ifd_host_call_count(); i++)
        if (strcmp(ifd_host_call_get(i)->name, name) == 0)
            return ifd_host_call_get(i);
    return NULL;
}

static double number(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    RASSERT(v != NULL, "no '%s' in the summary", key);
    return json_is_null(v) ? NAN : json_number_value(v);
}

START_TEST(calibration_matches_a_plain_loop)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_error err;
    RC_OK(ifd_host_call_load_plugin(IFD_PLUGIN_DIR "/ifd_calibration.so", &err), err);
    int n = ifd_host_call_count();
    RC_OK(ifd_host_call_load_plugin(IFD_PLUGIN_DIR "/ifd_calibration.so", &err), err);
    ck_assert_int_eq(ifd_host_call_count(), n); /* loading it again does nothing */
    const ifd_host_call_class *c = find("calibration");
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(c->ntensors, 3);
    ck_assert_str_eq(c->tensors[0], "class");
    ck_assert_str_eq(c->tensors[1], "confidence");
    ck_assert_str_eq(c->tensors[2], "label");
    ifd_host_call_info info = {.mode = "train", .program = "softmax", .classes = 4};
    void *st = NULL;
    RC_OK(c->init(&st, &info, &err), err);
    for (int window = 0; window < 3; window++) {
        int64_t right = 0, wrong = 0;
        double cr = 0, cw = 0;
        int64_t steps = rand_between(&rng, 1, 6);
        for (int64_t s = 0; s < steps; s++) {
            int64_t rows = rand_between(&rng, 1, 50), k = rand_between(&rng, 1, 5);
            int32_t *cls = malloc((size_t)rows * 4), *label = malloc((size_t)rows * 4);
            float *conf = malloc((size_t)rows * 4);
            for (int64_t i = 0; i < rows; i++) {
                cls[i] = (int32_t)rand_between(&rng, 0, k - 1);
                label[i] = (int32_t)rand_between(&rng, 0, k - 1);
                conf[i] = (float)ifd_rng_uniform(&rng);
                if (cls[i] == label[i]) {
                    right++;
                    cr += conf[i];
                } else {
                    wrong++;
                    cw += conf[i];
                }
            }
            ifd_tensor t[3];
            ifd_tensor_init(&t[0], IFD_I32, 1, &rows, cls);
            ifd_tensor_init(&t[1], IFD_F32, 1, &rows, conf);
            ifd_tensor_init(&t[2], IFD_I32, 1, &rows, label);
            RC_OK(c->step(st, s, t, &err), err);
            free(cls);
            free(conf);
            free(label);
        }
        char buf[512];
        RC_OK(c->summary(st, buf, sizeof buf, &err), err);
        json_error_t je;
        json_t *o = json_loads(buf, 0, &je);
        RASSERT(o != NULL, "'%s' is not JSON: %s", buf, je.text);
        ck_assert_int_eq((int64_t)number(o, "right"), right);
        ck_assert_int_eq((int64_t)number(o, "wrong"), wrong);
        if (right)
            ck_assert_double_eq_tol(number(o, "confidence_right"), cr / (double)right, 1e-6);
        else
            ck_assert(isnan(number(o, "confidence_right")));
        if (wrong)
            ck_assert_double_eq_tol(number(o, "confidence_wrong"), cw / (double)wrong, 1e-6);
        else
            ck_assert(isnan(number(o, "confidence_wrong")));
        json_decref(o);
    }
    char tiny[8];
    ck_assert_int_eq(c->summary(st, tiny, sizeof tiny, &err), IFD_ERANGE);
    c->destroy(st);
}
END_TEST

static void load_fails(const char *path, const char *want)
{
    int n = ifd_host_call_count();
    ifd_error err;
    ifd_error_clear(&err);
    ck_assert_int_eq(ifd_host_call_load_plugin(path, &err), IFD_EINVAL);
    RASSERT(strstr(err.msg, want) != NULL, "'%s' does not say '%s'", err.msg, want);
    ck_assert_int_eq(ifd_host_call_count(), n);
}

START_TEST(bad_plugins_are_refused_with_a_sentence)
{
    load_fails(IFD_PLUGIN_DIR "/ifd_bad_host_call_noentry.so",
               "ifd_bad_host_call_noentry.so': no entry point (symbol ifd_host_call_plugin_abi): "
               "expected a plugin that defines it with IFD_HOST_CALL_PLUGIN");
    load_fails(IFD_PLUGIN_DIR "/ifd_bad_host_call_abi.so",
               "built for host call ABI version 99, expected version 1");
    load_fails(IFD_PLUGIN_DIR "/ifd_bad_host_call_empty.so", "registers no host call");
    load_fails(IFD_PLUGIN_DIR "/ifd_bad_host_call_incomplete.so",
               "registers a host call class without all of name, step and summary");
    load_fails(IFD_PLUGIN_DIR "/ifd_bad_host_call_notensors.so",
               "host call 'none' takes 0 tensors: expected 1 to 8");
    load_fails(IFD_PLUGIN_DIR "/ifd_bad_host_call_twice.so",
               "registers host call 'bad', a name taken already");
    load_fails(IFD_PLUGIN_DIR "/no_such_file.so", "no_such_file.so': cannot load it: ");
    load_fails("", "host call library: expected a file name, got ''");
    ck_assert_ptr_null(find("bad"));
}
END_TEST

/* A run's tensors as the outfeed thread holds them: the program's, then loss (a replica-step). */
typedef struct fake_run {
    ifd_program p;
    ifd_outfeed_tensors c;
    int32_t cls[64], label[64];
    float conf[64], loss[4];
} fake_run;

static void fake_run_init(fake_run *f, const char *const *names, int n)
{
    memset(f, 0, sizeof *f);
    ifd_program_settings set = {.features = 3, .classes = 4};
    ifd_error err;
    RC_OK(ifd_program_init(&f->p, "softmax", &set, &err), err);
    f->c.program = &f->p;
    f->c.ntensors = n;
    for (int i = 0; i < n; i++)
        f->c.names[i] = names[i];
}

/* Step data for the tensors class, confidence, label (indices 2, 0, 1 of the fake run). */
static void fake_step(fake_run *f, ifd_rng *rng, int64_t rows, int64_t *right, double *cr)
{
    for (int64_t i = 0; i < rows; i++) {
        f->cls[i] = (int32_t)rand_between(rng, 0, 3);
        f->label[i] = (int32_t)rand_between(rng, 0, 3);
        f->conf[i] = (float)ifd_rng_uniform(rng);
        if (f->cls[i] == f->label[i]) {
            ++*right;
            *cr += f->conf[i];
        }
    }
    ifd_tensor_init(&f->c.tensors[0], IFD_F32, 1, &rows, f->conf);
    ifd_tensor_init(&f->c.tensors[1], IFD_I32, 1, &rows, f->label);
    ifd_tensor_init(&f->c.tensors[2], IFD_I32, 1, &rows, f->cls);
    int64_t r = 4;
    ifd_tensor_init(&f->c.tensors[3], IFD_F32, 1, &r, f->loss);
}

START_TEST(the_runner_binds_steps_and_summarizes)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_error err;
    RC_OK(ifd_host_call_load_plugin(IFD_PLUGIN_DIR "/ifd_calibration.so", &err), err);
    /* the tensors in another order than the class takes them: bound by name */
    static const char *const names[] = {"confidence", "label", "class", "loss"};
    fake_run f;
    fake_run_init(&f, names, 4);
    ifd_host_call_info info = {.mode = "eval", .program = "softmax", .classes = 4, .replicas = 1};
    ifd_plugin_calls pc;
    RC_OK(ifd_plugin_calls_init(&pc, &f.c, &info, &err), err);
    ck_assert_int_eq(pc.n, 1);
    int64_t right = 0, rows_total = 0;
    double cr = 0;
    for (int64_t s = 0, steps = rand_between(&rng, 1, 5); s < steps; s++) {
        int64_t rows = rand_between(&rng, 1, 64);
        rows_total += rows;
        fake_step(&f, &rng, rows, &right, &cr);
        RC_OK(ifd_plugin_calls_step(&pc, &f.c, s + 1, &err), err);
    }
    json_t *calls = json_object();
    RC_OK(ifd_plugin_calls_summary(&pc, calls, &err), err);
    json_t *cal = json_object_get(calls, "calibration");
    ck_assert_ptr_nonnull(cal);
    ck_assert_int_eq((int64_t)number(cal, "right"), right);
    ck_assert_int_eq((int64_t)number(cal, "wrong"), rows_total - right);
    if (right)
        ck_assert_double_eq_tol(number(cal, "confidence_right"), cr / (double)right, 1e-6);
    json_decref(calls);
    ifd_plugin_calls_fini(&pc);
    ifd_program_free(&f.p);
    /* a program without label: refused, naming the tensor, the program and what it has */
    fake_run_init(&f, names, 1);
    ifd_error_clear(&err);
    ck_assert_int_eq(ifd_plugin_calls_init(&pc, &f.c, &info, &err), IFD_EINVAL);
    ck_assert_str_eq(err.msg, "host call 'calibration' takes tensor 'class', which program "
                              "'softmax' does not outfeed (it outfeeds confidence)");
    ifd_program_free(&f.p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("host_call_plugins");
    TCase *tc = tu_tcase(s, "plugins", 30);
    tcase_add_loop_test(tc, calibration_matches_a_plain_loop, 0, 3);
    tcase_add_test(tc, bad_plugins_are_refused_with_a_sentence);
    tcase_add_loop_test(tc, the_runner_binds_steps_and_summarizes, 0, 3);
    return tu_run_suite(s);
}
