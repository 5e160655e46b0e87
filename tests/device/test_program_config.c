/*
 * ABI 4's program settings (settings.config, a JSON object): the typed readers with their
 * defaults, ranges and sentences, the refusal of a key the program does not read (built-ins read
 * none), text that is not an object, the canonical text, and checkpoints that record the
 * settings and refuse a run with others.
 */
#include "tests/util/files.h"
#include "tests/util/program_ref.h"
#include "tests/util/testutil.h"

#include <infeed/checkpoint.h>
#include <infeed/program.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "cfgprog": layers (1..64, default 2) parameters of [width] (width 1..4096, default 8), rate a
 * number in [0, 1] (default 0.5), bias a bool (default true), act a string (default "gelu").
 * It keeps what it read in a static for the test to compare (one program at a time). */
static struct {
    int64_t layers, width;
    double rate;
    int bias;
    char act[16];
} got;

static int cfg_setup(ifd_program *p, ifd_error *err)
{
    int rc = ifd_program_config_int(p, "layers", 2, 1, 64, &got.layers, err);
    if (rc == IFD_OK)
        rc = ifd_program_config_int(p, "width", 8, 1, 4096, &got.width, err);
    if (rc == IFD_OK)
        rc = ifd_program_config_float(p, "rate", 0.5, 0.0, 1.0, &got.rate, err);
    if (rc == IFD_OK)
        rc = ifd_program_config_bool(p, "bias", 1, &got.bias, err);
    if (rc == IFD_OK)
        rc = ifd_program_config_string(p, "act", "gelu", got.act, sizeof got.act, err);
    ifd_param_init ones = {.kind = IFD_INIT_ONES};
    if (rc == IFD_OK) { /* what the steps would read: the program's state */
        int64_t *layers = malloc(sizeof *layers);
        *layers = got.layers;
        p->state = layers;
    }
    for (int64_t i = 0; rc == IFD_OK && i < got.layers; i++) {
        char name[32];
        snprintf(name, sizeof name, "w%" PRId64, i);
        rc = ifd_program_add_param_with(p, name, 1, &got.width, ones, 0);
    }
    return rc;
}

static int freed; /* free_state calls */

static void cfg_free_state(ifd_program *p)
{
    free(p->state);
    freed++;
}

static const ifd_program_class cfgprog = {.name = "cfgprog",
                                          .setup = cfg_setup,
                                          .workspace_floats = tu_program_rows_workspace,
                                          .train_step = tu_program_no_step,
                                          .free_state = cfg_free_state};

static void register_once(void)
{
    if (ifd_program_find("cfgprog") == NULL)
        ck_assert_int_eq(ifd_program_register(&cfgprog), IFD_OK);
}

/* ifd_program_init of name with settings text; the program freed unless keep. */
static int init_with(ifd_program *p, const char *name, const char *text, ifd_error *err)
{
    ifd_program_settings s = {.features = 3, .classes = 2, .config = text};
    ifd_error_clear(err);
    return ifd_program_init(p, name, &s, err);
}

static void refused(const char *name, const char *text, const char *want)
{
    ifd_program p;
    ifd_error err;
    RASSERT(init_with(&p, name, text, &err) == IFD_EINVAL, "%s: %s taken", name, text);
    RASSERT(strcmp(err.msg, want) == 0, "%s: '%s', want '%s'", text, err.msg, want);
    ck_assert_str_eq(err.key, "program_config");
    ck_assert_ptr_null(p.config); /* nothing held */
    ifd_program_free(&p);
}

START_TEST(settings_are_read_with_defaults)
{
    register_once();
    ifd_rng rng;
    seed_rng(&rng);
    ifd_program p;
    ifd_error err;
    ck_assert_int_eq(init_with(&p, "cfgprog", NULL, &err), IFD_OK);
    ck_assert_int_eq(got.layers, 2);
    ck_assert_int_eq(got.width, 8);
    ck_assert(got.rate == 0.5 && got.bias == 1 && strcmp(got.act, "gelu") == 0);
    ck_assert_str_eq(ifd_program_config_text(&p), "{}");
    ck_assert_int_eq(p.nparams, 2);
    ifd_program_free(&p);
    int64_t layers = rand_between(&rng, 1, 64), width = rand_between(&rng, 1, 4096);
    double rate = (double)rand_between(&rng, 0, 1000) / 1000.0;
    char text[256];
    /* keys in another order and with spaces: the canonical text sorts them, compact */
    snprintf(text, sizeof text,
             "{ \"width\": %" PRId64 ", \"rate\": %.3f, \"layers\": %" PRId64
             ", \"bias\": false, \"act\": \"relu\" }",
             width, rate, layers);
    RASSERT(init_with(&p, "cfgprog", text, &err) == IFD_OK, "%s", err.msg);
    ck_assert_int_eq(got.layers, layers);
    ck_assert_int_eq(got.width, width);
    ck_assert(fabs(got.rate - rate) < 1e-12 && got.bias == 0 && strcmp(got.act, "relu") == 0);
    ck_assert_int_eq(p.nparams, layers);
    ck_assert_int_eq(p.nparam_floats, layers * width);
    ck_assert_int_eq(*(const int64_t *)p.state, layers);
    int before = freed;
    char want[256];
    snprintf(want, sizeof want,
             "{\"act\":\"relu\",\"bias\":false,\"layers\":%" PRId64 ",\"rate\":", layers);
    RASSERT(strncmp(ifd_program_config_text(&p), want, strlen(want)) == 0, "%s",
            ifd_program_config_text(&p));
    snprintf(want, sizeof want, ",\"width\":%" PRId64 "}", width);
    RASSERT(strstr(ifd_program_config_text(&p), want) != NULL, "%s", ifd_program_config_text(&p));
    ifd_program_free(&p);
    ck_assert_ptr_null(p.config);
    ck_assert_int_eq(freed, before + 1); /* the state freed by the class */
    ck_assert_ptr_null(p.state);
    ck_assert_int_eq(init_with(&p, "cfgprog", "{\"rate\": 1}", &err), IFD_OK); /* an integer */
    ck_assert(got.rate == 1.0);
    ifd_program_free(&p);
}
END_TEST

START_TEST(bad_settings_get_a_sentence)
{
    register_once();
    refused("cfgprog", "{\"layers\": 0}",
            "program 'cfgprog': program_config setting 'layers': expected an integer from 1 to "
            "64, got 0");
    refused("cfgprog", "{\"layers\": 65}",
            "program 'cfgprog': program_config setting 'layers': expected an integer from 1 to "
            "64, got 65");
    refused("cfgprog", "{\"layers\": \"two\"}",
            "program 'cfgprog': program_config setting 'layers': expected an integer from 1 to "
            "64, got a string (\"two\")");
    refused("cfgprog", "{\"layers\": 2.5}",
            "program 'cfgprog': program_config setting 'layers': expected an integer from 1 to "
            "64, got 2.5");
    refused("cfgprog", "{\"rate\": 1.5}",
            "program 'cfgprog': program_config setting 'rate': expected a number from 0 to 1, got "
            "1.5");
    refused("cfgprog", "{\"bias\": 1}",
            "program 'cfgprog': program_config setting 'bias': expected true or false, got 1");
    refused("cfgprog", "{\"act\": \"a-name-of-sixteen\"}",
            "program 'cfgprog': program_config setting 'act': expected a string of at most 15 "
            "bytes, got a string (\"a-name-of-sixteen\")");
    refused("cfgprog", "{\"layers\": 2, \"layrs\": 3}",
            "program 'cfgprog': program_config setting 'layrs': the program has no such setting "
            "(it reads layers, width, rate, bias, act)");
    refused("softmax", "{\"layers\": 2}",
            "program 'softmax': program_config setting 'layers': the program has no such setting "
            "(it reads none)");
    refused("cfgprog", "[1, 2]",
            "program_config: expected a JSON object of the program's settings, such as "
            "'{\"layers\": 2}', got '[1, 2]' (a JSON array)");
    ifd_program p;
    ifd_error err;
    ck_assert_int_eq(init_with(&p, "cfgprog", "{\"layers\": 2", &err), IFD_EINVAL);
    RASSERT(strncmp(err.msg, "program_config: expected a JSON object", 38) == 0, "%s", err.msg);
    ck_assert_int_eq(init_with(&p, "cfgprog", "{\"layers\": 2, \"layers\": 3}", &err), IFD_EINVAL);
    RASSERT(strstr(err.msg, "duplicate") != NULL, "%s", err.msg);
    /* the built-ins without settings, as before */
    ck_assert_int_eq(init_with(&p, "softmax", "{}", &err), IFD_OK);
    ifd_program_free(&p);
}
END_TEST

START_TEST(checkpoints_record_the_settings)
{
    register_once();
    ifd_rng rng;
    seed_rng(&rng);
    char *dir = tu_tmp_dir("ifd-progcfg");
    ifd_config cfg;
    ifd_config_defaults(&cfg);
    cfg.program = "cfgprog";
    char a[96], b[96], other[96];
    int64_t layers = rand_between(&rng, 1, 10), width = rand_between(&rng, 1, 50);
    snprintf(a, sizeof a, "{\"layers\": %" PRId64 ", \"width\": %" PRId64 "}", layers, width);
    snprintf(b, sizeof b, "{ \"width\":%" PRId64 ",\"layers\":%" PRId64 " }", width, layers);
    snprintf(other, sizeof other, "{\"layers\": %" PRId64 ", \"width\": %" PRId64 ", \"rate\": 0}",
             layers, width);
    cfg.settings.config = a;
    ifd_checkpoint *c = NULL, *back = NULL;
    ifd_error err;
    RASSERT(ifd_checkpoint_create(&c, &cfg, 3, 3, NULL, NULL, &err) == IFD_OK, "%s", err.msg);
    char path[512];
    RASSERT(ifd_checkpoint_save(c, dir, 3, path, sizeof path, &err) == IFD_OK, "%s", err.msg);
    RASSERT(ifd_checkpoint_load(path, &back, &err) == IFD_OK, "%s", err.msg);
    cfg.settings.config = b; /* the same settings, written otherwise */
    RASSERT(ifd_checkpoint_check(back, &cfg, &err) == IFD_OK, "%s", err.msg);
    ck_assert_str_eq(ifd_checkpoint_settings(back)->config,
                     strchr(ifd_checkpoint_settings(c)->config, '{'));
    cfg.settings.config = other;
    ck_assert_int_eq(ifd_checkpoint_check(back, &cfg, &err), IFD_EINVAL);
    char want[300];
    snprintf(want, sizeof want,
             "checkpoint: program_config: the checkpoint has {\"layers\":%" PRId64
             ",\"width\":%" PRId64 "}, this run {\"layers\":%" PRId64
             ",\"rate\":0,\"width\":%" PRId64
             "} (a resume takes the program settings it was written with)",
             layers, width, layers, width);
    ck_assert_str_eq(err.msg, want);
    cfg.settings.config = NULL; /* the defaults: other settings too, though the shapes may fit */
    ck_assert_int_eq(ifd_checkpoint_check(back, &cfg, &err), IFD_EINVAL);
    RASSERT(strstr(err.msg, "this run {} (") != NULL, "%s", err.msg);
    /* a checkpoint without settings and a run without: as before */
    ifd_checkpoint_free(c);
    cfg.program = "softmax";
    cfg.settings.features = 3;
    cfg.settings.classes = 2;
    RASSERT(ifd_checkpoint_create(&c, &cfg, 1, 1, NULL, NULL, &err) == IFD_OK, "%s", err.msg);
    ck_assert_ptr_null(ifd_checkpoint_settings(c)->config);
    RASSERT(ifd_checkpoint_check(c, &cfg, &err) == IFD_OK, "%s", err.msg);
    ifd_checkpoint_free(c);
    ifd_checkpoint_free(back);
    tu_rm_dir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("program_config");
    TCase *tc = tu_tcase(s, "config", 60);
    tcase_add_loop_test(tc, settings_are_read_with_defaults, 0, 5);
    tcase_add_test(tc, bad_settings_get_a_sentence);
    tcase_add_loop_test(tc, checkpoints_record_the_settings, 0, 4);
    return tu_run_suite(s);
}
