/* The checkpoint folder: the latest checkpoint, pruning to the newest few, writes that readers
 * never see partial, and the newest checkpoint that loads taken past damaged ones. */
#include "tests/util/testutil.h"

#include <infeed/checkpoint.h>
#include "checkpoint/object.h" /* tests set a checkpoint's step in place */
#include "tests/util/checkpoints.h"
#include "tests/util/files.h"
#include "core/thread.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

START_TEST(latest_and_prune)
{
    ifd_rng rng;
    seed_rng(&rng);
    char *dir = tu_tmp_dir("ifd-ckpt-test");
    char path[512];
    ifd_error err;
    ck_assert_int_eq(ifd_checkpoint_latest(dir, path, sizeof path, &err), IFD_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(err.msg, "no checkpoint"));
    ck_assert_int_eq(ifd_checkpoint_latest("/nonexistent/ifd", path, sizeof path, &err),
                     IFD_ENOTFOUND);
    ifd_config cfg;
    tu_ckpt_random_config(&cfg, &rng);
    ifd_checkpoint *c;
    ck_assert_int_eq(ifd_checkpoint_create(&c, &cfg, 0, 0, NULL, NULL, &err), IFD_OK);
    /* steps in random order, beyond the 12 digits of the name too; junk and a killed write's
     * temporary file beside them */
    int64_t steps[] = {700, 5, INT64_C(2000000000000), 31, 1200, 64};
    char junk[600];
    snprintf(junk, sizeof junk, "%s/ckpt-12x.ifdckpt", dir);
    tu_spit(junk, (const uint8_t *)"x", 1);
    snprintf(junk, sizeof junk, "%s/.ckpt-000000009999.ifdckpt.tmp-1", dir);
    tu_spit(junk, (const uint8_t *)"partial", 7);
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        c->global_step = steps[i];
        ck_assert_int_eq(ifd_checkpoint_save(c, dir, 100, NULL, 0, &err), IFD_OK);
    }
    ifd_checkpoint_free(c);
    ck_assert_int_eq(ifd_checkpoint_latest(dir, path, sizeof path, &err), IFD_OK);
    ck_assert_ptr_nonnull(strstr(path, "ckpt-2000000000000.ifdckpt"));
    /* the temporary file went with the first prune */
    ck_assert_int_ne(access(junk, F_OK), 0);
    ck_assert_int_eq(ifd_checkpoint_prune(dir, 2, &err), IFD_OK);
    int64_t left[16];
    ck_assert_int_eq(tu_ckpt_steps(dir, left, 16), 2);
    ck_assert_int_eq(left[0], 1200);
    ck_assert_int_eq(left[1], INT64_C(2000000000000));
    ck_assert_int_eq(ifd_checkpoint_prune(dir, 0, &err), IFD_EINVAL);
    ck_assert_int_eq(ifd_checkpoint_latest(dir, path, 10, &err), IFD_ERANGE);
    tu_rm_dir(dir);
}
END_TEST

typedef struct atomic_args {
    const char *dir;
    ifd_checkpoint *c;
    int saves;
    int done; /* atomic */
} atomic_args;

static void *writer(void *arg)
{
    atomic_args *a = arg;
    ifd_error err;
    for (int i = 1; i <= a->saves; i++) {
        a->c->global_step = i;
        ck_assert_int_eq(ifd_checkpoint_save(a->c, a->dir, 2, NULL, 0, &err), IFD_OK);
    }
    __atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Readers never see a partial checkpoint: every file under a checkpoint name loads, while
 * another thread writes large ones and prunes. */
START_TEST(atomic_writes)
{
    char *dir = tu_tmp_dir("ifd-ckpt-test");
    ifd_config cfg;
    ifd_config_defaults(&cfg);
    cfg.program = "linear";
    cfg.settings.features = 1024;
    cfg.settings.classes = 256; /* 256 Ki floats, 3 MiB with Adam's slots */
    cfg.optimizer.kind = IFD_OPT_ADAM;
    ifd_error err;
    atomic_args a = {.dir = dir, .saves = 30};
    ck_assert_int_eq(ifd_checkpoint_create(&a.c, &cfg, 0, 0, NULL, NULL, &err), IFD_OK);
    ifd_thread t;
    ck_assert_int_eq(ifd_thread_start(&t, "ckpt-writer", writer, &a), 0);
    int loads = 0;
    while (!__atomic_load_n(&a.done, __ATOMIC_ACQUIRE)) {
        char path[512];
        if (ifd_checkpoint_latest(dir, path, sizeof path, &err) != IFD_OK)
            continue;
        ifd_checkpoint *c;
        int rc = ifd_checkpoint_load(path, &c, &err);
        /* pruned between the listing and the load is fine; a partial file is not */
        ck_assert_msg(rc == IFD_OK || rc == IFD_ENOTFOUND, "%s", err.msg);
        if (rc == IFD_OK) {
            loads++;
            ifd_checkpoint_free(c);
        }
    }
    ifd_thread_join(&t);
    ck_assert_int_gt(loads, 0);
    int64_t left[8];
    ck_assert_int_eq(tu_ckpt_steps(dir, left, 8), 2);
    ck_assert_int_eq(left[1], 30);
    ifd_checkpoint_free(a.c);
    tu_rm_dir(dir);
}
END_TEST

/* Damages the file at path: cut at a random length, or one random byte changed to another. */
static void damage(const char *path, ifd_rng *rng, char *what, size_t len)
{
    size_t n;
    uint8_t *b = tu_slurp(path, &n);
    if (rand_between(rng, 0, 1)) {
        size_t cut = (size_t)rand_between(rng, 0, (int64_t)n - 1);
        snprintf(what, len, "cut to %zu of %zu bytes", cut, n);
        tu_spit(path, b, cut);
    } else {
        size_t at = (size_t)rand_between(rng, 0, (int64_t)n - 1);
        b[at] ^= (uint8_t)rand_between(rng, 1, 255);
        snprintf(what, len, "byte %zu of %zu changed", at, n);
        tu_spit(path, b, n);
    }
    free(b);
}

/* ifd_checkpoint_load_latest's arguments and result, for tu_capture_stderr. */
typedef struct load_latest_args {
    const char *dir;
    int set_aside;
    ifd_checkpoint **c;
    char *path;
    size_t len;
    ifd_error *err;
    int rc;
} load_latest_args;

static void load_latest(void *arg)
{
    load_latest_args *a = arg;
    a->rc = ifd_checkpoint_load_latest(a->dir, a->set_aside, a->c, a->path, a->len, a->err);
}

/* Runs ifd_checkpoint_load_latest with stderr (the log) going to a file; returns the log. */
static char *load_latest_logged(const char *dir, int set_aside, ifd_checkpoint **c, char *path,
                                size_t len, ifd_error *err, int *rc)
{
    load_latest_args a = {dir, set_aside, c, path, len, err, IFD_OK};
    char *log = tu_capture_stderr(load_latest, &a);
    *rc = a.rc;
    return log;
}

/* The newest checkpoint that loads is taken; newer damaged ones are skipped with a warning
 * naming each and its problem, and set aside on request; when none loads, the error names the
 * newest and nothing is renamed. A killed writer's temporary file is never a candidate. */
START_TEST(latest_skips_damaged)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int trial = 0; trial < 12; trial++) {
        char *dir = tu_tmp_dir("ifd-ckpt-test");
        ifd_config cfg;
        tu_ckpt_random_config(&cfg, &rng);
        ifd_checkpoint *c = tu_ckpt_random(&cfg, &rng);
        ifd_error err;
        int n = (int)rand_between(&rng, 1, 6), ndamaged = (int)rand_between(&rng, 0, n);
        int set_aside = (int)rand_between(&rng, 0, 1);
        int64_t steps[6];
        char paths[6][512];
        for (int i = 0; i < n; i++) {
            steps[i] = (i ? steps[i - 1] : 0) + rand_between(&rng, 1, 1000);
            c->global_step = steps[i];
            ck_assert_int_eq(ifd_checkpoint_save(c, dir, 100, paths[i], sizeof paths[i], &err),
                             IFD_OK);
        }
        /* a complete checkpoint, newer than all, under a temporary name */
        char tmp[600];
        snprintf(tmp, sizeof tmp, "%s/.ckpt-%012lld.ifdckpt.tmp-77", dir,
                 (long long)steps[n - 1] + 1);
        size_t len;
        uint8_t *whole = tu_slurp(paths[n - 1], &len);
        tu_spit(tmp, whole, len);
        free(whole);
        char what[6][96];
        for (int i = n - ndamaged; i < n; i++)
            damage(paths[i], &rng, what[i], sizeof what[i]);
        ifd_checkpoint *got = NULL;
        char path[512];
        int rc;
        char *log = load_latest_logged(dir, set_aside, &got, path, sizeof path, &err, &rc);
        char ctx[160];
        snprintf(ctx, sizeof ctx,
                 "trial %d: %d checkpoints, the newest %d damaged (%s), set_aside %d", trial, n,
                 ndamaged, ndamaged ? what[n - 1] : "-", set_aside);
        int good = n - ndamaged - 1;
        if (good < 0) {
            RASSERT(rc == IFD_EPROTO && got == NULL, "%s: expected EPROTO, got %s", ctx,
                    ifd_errname(rc));
            RASSERT(strstr(err.msg, n == 1 ? "its only checkpoint does not load" : "none of its") &&
                        strstr(err.msg, paths[n - 1]),
                    "%s: %s", ctx, err.msg);
            RASSERT(strstr(log, "damaged") == NULL, "%s: logged: %s", ctx, log);
            for (int i = 0; i < n; i++)
                RASSERT(access(paths[i], F_OK) == 0, "%s: '%s' was moved", ctx, paths[i]);
        } else {
            RASSERT(rc == IFD_OK, "%s: %s", ctx, err.msg);
            ck_assert_str_eq(path, paths[good]);
            ck_assert_int_eq(ifd_checkpoint_global_step(got), steps[good]);
            ck_assert_mem_eq(ifd_checkpoint_params(got), ifd_checkpoint_params(c),
                             sizeof(float) * (size_t)ifd_checkpoint_nparam_floats(c));
            for (int i = good + 1; i < n; i++) {
                char aside[600];
                snprintf(aside, sizeof aside, "%s" IFD_CHECKPOINT_DAMAGED, paths[i]);
                RASSERT(strstr(log, paths[i]) != NULL, "%s: no warning names '%s': %s", ctx,
                        paths[i], log);
                RASSERT((access(paths[i], F_OK) == 0) == !set_aside &&
                            (access(aside, F_OK) == 0) == set_aside,
                        "%s: '%s' %s", ctx, paths[i], set_aside ? "not set aside" : "moved");
            }
            RASSERT(ndamaged ? strstr(log, "warn") != NULL : strstr(log, "damaged") == NULL,
                    "%s: log: %s", ctx, log);
            int64_t latest;
            ck_assert_int_eq(ifd_checkpoint_latest_step(dir, &latest, &err), IFD_OK);
            ck_assert_int_eq(latest, set_aside ? steps[good] : steps[n - 1]);
            /* a second look finds the same, and with the damaged set aside, warns no more */
            ifd_checkpoint *again = NULL;
            char *log2 = load_latest_logged(dir, set_aside, &again, path, sizeof path, &err, &rc);
            ck_assert_int_eq(rc, IFD_OK);
            ck_assert_int_eq(ifd_checkpoint_global_step(again), steps[good]);
            RASSERT(!set_aside || strstr(log2, "damaged") == NULL, "%s: %s", ctx, log2);
            free(log2);
            ifd_checkpoint_free(again);
        }
        RASSERT(strstr(log, ".tmp-77") == NULL, "%s: the temporary file was looked at", ctx);
        ck_assert_int_eq(access(tmp, F_OK), 0); /* only a writer's prune removes them */
        free(log);
        ifd_checkpoint_free(got);
        ifd_checkpoint_free(c);
        /* rm_dir removes files, the .damaged ones too */
        tu_rm_dir(dir);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("checkpoint_folder");
    TCase *tc = tu_tcase(s, "folder", 60);
    tcase_add_test(tc, latest_and_prune);
    tcase_add_test(tc, atomic_writes);
    tcase_add_test(tc, latest_skips_damaged);
    return tu_run_suite(s);
}
