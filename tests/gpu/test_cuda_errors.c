/* Opening the cuda backend where it cannot run must fail cleanly, with a sentence that says why;
 * where a GPU is visible, opening must work. Runs everywhere (never skipped). */
#include "device/device.h"
#include "tests/gpu/gpu_probe.h"
#include "tests/util/testutil.h"

#include <stdlib.h>
#include <string.h>

#define NO_GPU_PREFIX "cuda backend: no usable GPU: cudaGetDeviceCount: "

static int g_gpus;
static char g_why[256];

static void cuda_config(ifd_config *cfg, int replicas)
{
    ifd_config_defaults(cfg);
    cfg->backend = "cuda";
    cfg->program = "softmax";
    cfg->settings.features = 4;
    cfg->settings.classes = 3;
    cfg->replicas = replicas;
    cfg->batch_size = 4 * replicas;
    cfg->steps = 3;
}

static void noop_abort(void *ctx)
{
    (void)ctx;
}

static int eof_next(void *ctx, ifd_batch **out, ifd_error *err)
{
    (void)ctx;
    (void)out;
    (void)err;
    return IFD_EEOF;
}

static const ifd_batch_source_ops eof_ops = {.next = eof_next, .abort = noop_abort};

START_TEST(session_open)
{
    ifd_config cfg;
    cuda_config(&cfg, 1);
    ifd_batch_source src = {&eof_ops, NULL};
    int threads = tu_thread_count();
    for (int round = 0; round < 3; round++) {
        ifd_session *s = (ifd_session *)&cfg; /* must be reset to NULL on failure */
        ifd_error err;
        ifd_error_clear(&err);
        int rc = ifd_session_create(&s, &cfg, src, &err);
        if (g_gpus == 0) {
            ck_assert_msg(rc == IFD_ECUDA, "expected IFD_ECUDA, got %s: %s", ifd_errname(rc),
                          err.msg);
            ck_assert_ptr_null(s);
            ck_assert_msg(strncmp(err.msg, NO_GPU_PREFIX, strlen(NO_GPU_PREFIX)) == 0,
                          "message: '%s'", err.msg);
            ck_assert_msg(strlen(err.msg) > strlen(NO_GPU_PREFIX), "no reason after the call: '%s'",
                          err.msg);
            if (round == 0)
                printf("observed: %s\n", err.msg);
        } else {
            ck_assert_msg(rc == IFD_OK, "%d GPUs visible but: %s", g_gpus, err.msg);
            ifd_session_destroy(s);
        }
    }
    /* A failed open leaves no thread behind. */
    if (g_gpus == 0)
        ck_assert_int_eq(tu_thread_count_settle(threads), threads);
}
END_TEST

START_TEST(device_open_fails_without_leaving_a_device)
{
    if (g_gpus > 0)
        return;
    ifd_program prog;
    ifd_program_settings st = {.features = 2, .classes = 2};
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&prog, "softmax", &st, &err), IFD_OK);
    ifd_device_config dc = {.replicas = 1,
                            .program = &prog,
                            .max_shard_rows = 2,
                            .infeed_depth = 1,
                            .outfeed_depth = 1,
                            .cuda_graphs = 1};
    ifd_device *dev = (ifd_device *)&dc;
    ck_assert_int_eq(ifd_device_create(&dev, "cuda", &dc, &err), IFD_ECUDA);
    ck_assert_ptr_null(dev);
    ifd_device_destroy(dev);
    ifd_program_free(&prog);
}
END_TEST

START_TEST(bad_graphs_setting_is_named)
{
    ifd_config cfg;
    cuda_config(&cfg, 1);
    ifd_batch_source src = {&eof_ops, NULL};
    cfg.cuda_graphs = 2;
    ifd_session *s;
    ifd_error err;
    ck_assert_int_eq(ifd_session_create(&s, &cfg, src, &err), IFD_EINVAL);
    ck_assert_ptr_null(s);
    ck_assert_msg(strstr(err.msg, "cuda_graphs: expected 0 (off) or 1 (on), got 2"), "%s", err.msg);
}
END_TEST

START_TEST(more_replicas_than_gpus)
{
    if (g_gpus == 0)
        return; /* the device count cannot be had: session_open covers that */
    ifd_config cfg;
    cuda_config(&cfg, g_gpus + 1);
    ifd_batch_source src = {&eof_ops, NULL};
    ifd_session *s;
    ifd_error err;
    ck_assert_int_eq(ifd_session_create(&s, &cfg, src, &err), IFD_EINVAL);
    char want[64];
    snprintf(want, sizeof want, "%d requested, but %d GPU", g_gpus + 1, g_gpus);
    ck_assert_msg(strstr(err.msg, want), "%s", err.msg);
}
END_TEST

int main(void)
{
    g_gpus = gpu_probe(g_why, sizeof g_why);
    printf("test_cuda_errors: %d GPU%s visible%s%s\n", g_gpus, g_gpus == 1 ? "" : "s",
           g_gpus ? "" : ": ", g_gpus ? "" : g_why);
    Suite *s = suite_create("cuda_errors");
    TCase *tc = tcase_create("open");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, session_open);
    tcase_add_test(tc, device_open_fails_without_leaving_a_device);
    tcase_add_test(tc, bad_graphs_setting_is_named);
    tcase_add_test(tc, more_replicas_than_gpus);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
