/*
 * Leveled logging (core/log.h): level names, lines that are not written are not formatted, long
 * lines, escaping of peer-chosen text, the rate limit, and journald's priority prefixes when
 * JOURNAL_STREAM names stderr.
 *
 * Texts and numbers are random. The seed comes from IFD_TEST_SEED when set, else from the clock,
 * and every failure message names it so that a failing run can be repeated.
 */
#include "tests/util/testutil.h"

#include "core/log.h"
#include "core/rng.h"
#include "tests/util/files.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

START_TEST(test_log_levels)
{
    static const struct {
        const char *name;
        int level;
    } k[] = {{"error", IFD_LOG_ERROR},
             {"warn", IFD_LOG_WARN},
             {"info", IFD_LOG_INFO},
             {"debug", IFD_LOG_DEBUG}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        int out = -7;
        ck_assert_int_eq(ifd_log_level_parse(k[i].name, &out), IFD_OK);
        ck_assert_int_eq(out, k[i].level);
        ck_assert_str_eq(ifd_log_level_name(k[i].level), k[i].name);
    }
    const char *bad[] = {"", "ERROR", "warning", "trace", "debug ", "err"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int out = -7;
        ck_assert_msg(ifd_log_level_parse(bad[i], &out) == IFD_EINVAL, "parse('%s') accepted",
                      bad[i]);
        ck_assert_int_eq(out, -7);
    }
    ck_assert_str_eq(ifd_log_level_name(-1), "?");
    ck_assert_str_eq(ifd_log_level_name(4), "?");

    /* set/get, clamped to the known levels. */
    for (int l = IFD_LOG_ERROR; l <= IFD_LOG_DEBUG; l++) {
        ifd_log_set_level(l);
        ck_assert_int_eq(ifd_log_get_level(), l);
    }
    ifd_log_set_level(-5);
    ck_assert_int_eq(ifd_log_get_level(), IFD_LOG_ERROR);
    ifd_log_set_level(99);
    ck_assert_int_eq(ifd_log_get_level(), IFD_LOG_DEBUG);
}
END_TEST

static int g_calls;

static int bump(void)
{
    return ++g_calls;
}

static const char *bump_str(void)
{
    g_calls++;
    return "side effect";
}

/* ---- journald: JOURNAL_STREAM names stderr --------------------------------------------------- */

static uint64_t g_journal_ino_offset; /* 0: JOURNAL_STREAM names stderr; else another inode */
static int g_journal_msg;             /* a random number in every line */

/* Sets JOURNAL_STREAM from the (redirected) stderr, then writes one line at each level. */
static void log_with_journal_stream(void *unused)
{
    (void)unused;
    struct stat st;
    ck_assert_int_eq(fstat(2, &st), 0);
    char env[64];
    snprintf(env, sizeof env, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino + g_journal_ino_offset);
    ck_assert_int_eq(setenv("JOURNAL_STREAM", env, 1), 0);
    ifd_log_set_level(IFD_LOG_DEBUG);
    IFD_LOG_ERROR("e %d", g_journal_msg);
    IFD_LOG_WARN("w %d", g_journal_msg);
    IFD_LOG_INFO("i %d", g_journal_msg);
    IFD_LOG_DEBUG("d %d", g_journal_msg);
}

START_TEST(test_log_journal_stream_matches)
{
    ifd_rng rng;
    seed_rng(&rng);
    FILE *tmp = tmpfile();
    ck_assert_ptr_nonnull(tmp);
    struct stat st;
    ck_assert_int_eq(fstat(fileno(tmp), &st), 0);
    unsigned long long dev = (unsigned long long)st.st_dev, ino = (unsigned long long)st.st_ino;
    char good[64], other[64];
    snprintf(good, sizeof good, "%llu:%llu", dev, ino);
    ck_assert_int_eq(ifd_log_journal_stream_matches(good, fileno(tmp)), 1);
    for (int i = 0; i < 20; i++) {
        unsigned long long d = 1 + ifd_rng_below(&rng, 1000000);
        if (ifd_rng_below(&rng, 2))
            snprintf(other, sizeof other, "%llu:%llu", dev, ino + d);
        else
            snprintf(other, sizeof other, "%llu:%llu", dev + d, ino);
        RASSERT(ifd_log_journal_stream_matches(other, fileno(tmp)) == 0, "'%s' matched %s", other,
                good);
    }
    char bad[8][80];
    snprintf(bad[0], sizeof bad[0], "%llu:%llux", dev, ino);
    snprintf(bad[1], sizeof bad[1], " %llu:%llu", dev, ino);
    snprintf(bad[2], sizeof bad[2], "%llu:%llu:1", dev, ino);
    snprintf(bad[3], sizeof bad[3], "%llu", dev);
    snprintf(bad[4], sizeof bad[4], "%llu:", dev);
    snprintf(bad[5], sizeof bad[5], ":%llu", ino);
    snprintf(bad[6], sizeof bad[6], "%llu:-%llu", dev, ino);
    snprintf(bad[7], sizeof bad[7], "%llu;%llu", dev, ino);
    for (int i = 0; i < 8; i++)
        ck_assert_msg(ifd_log_journal_stream_matches(bad[i], fileno(tmp)) == 0, "'%s' matched",
                      bad[i]);
    ck_assert_int_eq(ifd_log_journal_stream_matches("", fileno(tmp)), 0);
    ck_assert_int_eq(ifd_log_journal_stream_matches(NULL, fileno(tmp)), 0);
    ck_assert_int_eq(ifd_log_journal_stream_matches(good, -1), 0);
    fclose(tmp);
}
END_TEST

/* JOURNAL_STREAM naming stderr: "<priority>infeed LEVEL [thread] message", no time. */
START_TEST(test_log_journal_priorities)
{
    ifd_rng rng;
    seed_rng(&rng);
    g_journal_msg = (int)ifd_rng_below(&rng, 1000000);
    g_journal_ino_offset = 0;
    char *out = tu_capture_stderr(log_with_journal_stream, NULL);
    static const char *const pre[] = {"<3>infeed error [", "<4>infeed warn  [", "<6>infeed info  [",
                                      "<7>infeed debug ["};
    static const char tag[] = {'e', 'w', 'i', 'd'};
    char *line = out;
    for (int i = 0; i < 4; i++) {
        char *nl = strchr(line, '\n');
        RASSERT(nl != NULL, "line %d missing in '%s'", i, out);
        *nl = '\0';
        RASSERT(strncmp(line, pre[i], strlen(pre[i])) == 0, "line '%s' does not start '%s'", line,
                pre[i]);
        char end[32];
        snprintf(end, sizeof end, "] %c %d", tag[i], g_journal_msg);
        RASSERT(strlen(line) > strlen(end) && strcmp(line + strlen(line) - strlen(end), end) == 0,
                "line '%s' does not end '%s'", line, end);
        line = nl + 1;
    }
    RASSERT(*line == '\0', "more than 4 lines: '%s'", line);
    free(out);
}
END_TEST

/* JOURNAL_STREAM naming another file (inherited, stderr redirected): the usual lines, timed. */
START_TEST(test_log_journal_stream_elsewhere)
{
    ifd_rng rng;
    seed_rng(&rng);
    g_journal_msg = (int)ifd_rng_below(&rng, 1000000);
    g_journal_ino_offset = 1 + ifd_rng_below(&rng, 1000);
    char *out = tu_capture_stderr(log_with_journal_stream, NULL);
    char *line = out;
    for (int i = 0; i < 4; i++) {
        char *nl = strchr(line, '\n');
        RASSERT(nl != NULL, "line %d missing in '%s'", i, out);
        *nl = '\0';
        int hh, mm, ss, ms, used = 0;
        RASSERT(sscanf(line, "%2d:%2d:%2d.%3d infeed %n", &hh, &mm, &ss, &ms, &used) == 4 &&
                    used == 20,
                "line '%s' does not start with the time and 'infeed'", line);
        line = nl + 1;
    }
    free(out);
}
END_TEST

static void log_disabled_lines(void *unused)
{
    (void)unused;
    ifd_log_set_level(IFD_LOG_WARN);
    IFD_LOG_DEBUG("debug %d", bump());
    IFD_LOG_INFO("info %s %d", bump_str(), bump());
    IFD_LOG(IFD_LOG_DEBUG, "x %d", bump());
    ifd_log_set_level(IFD_LOG_ERROR);
    IFD_LOG_WARN("warn %d", bump());
}

static void log_enabled_lines(void *unused)
{
    (void)unused;
    ifd_log_set_level(IFD_LOG_DEBUG);
    IFD_LOG_DEBUG("debug line %d", bump());
    IFD_LOG_ERROR("error line %s", bump_str());
}

START_TEST(test_log_disabled_not_evaluated)
{
    g_calls = 0;
    char *out = tu_capture_stderr(log_disabled_lines, NULL);
    ck_assert_msg(g_calls == 0, "arguments of disabled log lines were evaluated %d times", g_calls);
    ck_assert_msg(out[0] == '\0', "disabled log lines wrote '%s'", out);
    free(out);

    /* Enabled lines do evaluate, format and write, with level and thread name. */
    g_calls = 0;
    pthread_setname_np(pthread_self(), "log-test");
    out = tu_capture_stderr(log_enabled_lines, NULL);
    ck_assert_int_eq(g_calls, 2);
    ck_assert_msg(strstr(out, "debug line 1") != NULL, "output: '%s'", out);
    ck_assert_msg(strstr(out, "error line side effect") != NULL, "output: '%s'", out);
    ck_assert_msg(strstr(out, "debug") && strstr(out, "error") && strstr(out, "[log-test]"),
                  "output: '%s'", out);
    /* One line each. */
    int lines = 0;
    for (char *p = out; *p; p++)
        lines += *p == '\n';
    ck_assert_msg(lines == 2, "%d lines: '%s'", lines, out);
    free(out);
}
END_TEST

static void log_long_line(void *unused)
{
    (void)unused;
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ifd_log_set_level(IFD_LOG_ERROR);
    IFD_LOG_ERROR("%s", big);
    IFD_LOG_ERROR("after");
}

START_TEST(test_log_long_line_keeps_its_newline)
{
    char *out = tu_capture_stderr(log_long_line, NULL);
    char *nl = strchr(out, '\n');
    ck_assert_ptr_nonnull(nl);
    ck_assert_msg(strstr(nl + 1, "after") != NULL && strchr(nl + 1, '\n') != NULL,
                  "the cut line ran into the next one: %.80s", nl);
    free(out);
}
END_TEST

/* Peer-chosen text cannot forge a log line: every byte outside printable ASCII, and the
 * backslash, is written as \xHH; the output is cut to fit and always terminated. */
START_TEST(test_log_escape)
{
    char out[64];
    ck_assert_str_eq(ifd_log_escape("loader-0", out, sizeof out), "loader-0");
    ck_assert_str_eq(ifd_log_escape("a\nINFO forged\\", out, sizeof out), "a\\x0aINFO forged\\x5c");
    ck_assert_str_eq(ifd_log_escape("\xc3\xa9", out, sizeof out), "\\xc3\\xa9");
    ifd_rng rng;
    ifd_rng_seed(&rng, 77);
    for (int trial = 0; trial < 200; trial++) {
        char in[100];
        int n = (int)rand_between(&rng, 0, 99);
        for (int i = 0; i < n; i++)
            in[i] = (char)rand_between(&rng, 1, 255);
        in[n] = '\0';
        size_t cap = (size_t)rand_between(&rng, 1, sizeof out);
        ifd_log_escape(in, out, cap);
        ck_assert_uint_lt(strlen(out), cap);
        for (const char *p = out; *p; p++)
            ck_assert_msg(*p >= 0x20 && *p < 0x7f, "byte 0x%02x in %s", (unsigned char)*p, out);
    }
}
END_TEST

/* A burst of lines is let through, the rest of the window held back and counted, and the count
 * is handed to the first line of the next window (synthetic times: no sleeping). */
START_TEST(test_log_limit)
{
    ifd_rng rng;
    ifd_rng_seed(&rng, 78);
    for (int trial = 0; trial < 50; trial++) {
        int burst = (int)rand_between(&rng, 1, 5);
        int64_t interval = rand_between(&rng, 1000, 1000000000);
        ifd_log_limit l = IFD_LOG_LIMIT_INIT(burst, interval);
        long long sup;
        int64_t t0 = rand_between(&rng, 1, INT64_C(1) << 50), t = t0;
        int extra = (int)rand_between(&rng, 1, 20);
        for (int i = 0; i < burst; i++) {
            ck_assert_int_eq(ifd_log_limit_allow_at(&l, t, &sup), 1);
            ck_assert_int_eq(sup, 0);
            t += rand_between(&rng, 0, interval / (2 * burst + 2 * extra));
        }
        for (int i = 0; i < extra; i++) {
            ck_assert_int_eq(ifd_log_limit_allow_at(&l, t, &sup), 0);
            t += rand_between(&rng, 0, interval / (2 * burst + 2 * extra));
        }
        ck_assert_int_lt(t - t0, interval);
        t = t0 + interval + rand_between(&rng, 0, interval);
        ck_assert_int_eq(ifd_log_limit_allow_at(&l, t, &sup), 1);
        ck_assert_int_eq(sup, extra);
        ck_assert_int_eq(ifd_log_limit_allow_at(&l, t, &sup), burst > 1);
        ck_assert_int_eq(sup, 0);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("log");
    TCase *tc = tu_tcase(s, "log", 30);
    tcase_add_test(tc, test_log_levels);
    tcase_add_test(tc, test_log_disabled_not_evaluated);
    tcase_add_test(tc, test_log_long_line_keeps_its_newline);
    tcase_add_test(tc, test_log_journal_stream_matches);
    tcase_add_test(tc, test_log_journal_priorities);
    tcase_add_test(tc, test_log_journal_stream_elsewhere);
    tcase_add_test(tc, test_log_escape);
    tcase_add_test(tc, test_log_limit);
    return tu_run_suite(s);
}
