/*
 * infeedctl watch: the summaries of the daemon's PUB socket as one progress line, until the end
 * summary; while no summary comes, whether the daemon still answers on its control socket.
 */
#include "tools/infeedctl.h"
#include "infeed/client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- watch -------------------------------------------------------------------------------- */

static void format_eta(double secs, char *buf, size_t len)
{
    if (!(secs >= 0) || secs > 1e7) {
        snprintf(buf, len, "?");
        return;
    }
    long s = (long)(secs + 0.5);
    if (s >= 3600)
        snprintf(buf, len, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
    else
        snprintf(buf, len, "%ld:%02ld", s / 60, s % 60);
}

/* The progress line of one train/eval/predict summary. */
static void progress_line(json_t *s, long long last_step, char *buf, size_t len)
{
    long long step = (long long)num_or(s, "global_step", 0);
    const char *event = str_or(s, "event", "?");
    size_t at = 0;
#define APPEND(...)                                                                                \
    do {                                                                                           \
        int n_ = snprintf(buf + at, at < len ? len - at : 0, __VA_ARGS__);                         \
        if (n_ > 0)                                                                                \
            at += (size_t)n_;                                                                      \
    } while (0)
    if (strcmp(event, "train") != 0)
        APPEND("%s  ", event);
    if (last_step > 0)
        APPEND("step %lld/%lld (%.0f%%)", step, last_step,
               100.0 * (double)step / (double)last_step);
    else
        APPEND("step %lld", step);
    APPEND("  %.0f examples/s", num_or(s, "examples_per_sec", 0));
    if (json_is_number(json_object_get(s, "loss")))
        APPEND("  loss %.4g", num_or(s, "loss", 0));
    if (json_is_number(json_object_get(s, "accuracy")))
        APPEND("  accuracy %.3f", num_or(s, "accuracy", 0));
    APPEND("  infeed wait %.0f%%", 100.0 * num_or(s, "infeed_wait_fraction", 0));
    double sps = num_or(s, "steps_per_sec", 0);
    if (last_step > 0 && sps > 0) {
        char eta[32];
        format_eta((double)(last_step - step) / sps, eta, sizeof eta);
        APPEND("  ETA %s", eta);
    }
#undef APPEND
    if (at >= len && len > 0)
        buf[len - 1] = '\0';
}

/* The last step and the run's kind from status, when the control socket answers: the header
 * line. Returns whether it answered. */
static int watch_header(const ctl_options *o, long long *last_step, ifd_error *err)
{
    json_t *st = NULL;
    int answered = control_request(o, "{\"cmd\":\"status\"}", &st, err) == IFD_OK &&
                   json_is_true(json_object_get(st, "ok"));
    if (answered) {
        json_t *ls = json_object_get(st, "last_step");
        if (json_is_integer(ls))
            *last_step = (long long)json_integer_value(ls);
        printf("watching infeedd at %s: %s mode, program %s, global step %lld", o->publish,
               str_or(st, "mode", "?"), str_or(st, "program", "?"),
               (long long)num_or(st, "global_step", 0));
        if (*last_step > 0)
            printf(" of %lld", *last_step);
        printf("\n");
        fflush(stdout);
    }
    json_decref(st);
    return answered;
}

/* No summary for a while: whether the daemon still answers on its control socket (it said so
 * when it does not). */
static int daemon_answers(const ctl_options *o, int tty)
{
    json_t *ping = NULL;
    ifd_error perr;
    ifd_error_clear(&perr);
    if (control_request(o, "{\"cmd\":\"status\"}", &ping, &perr) == IFD_OK) {
        json_decref(ping);
        return 1;
    }
    if (tty)
        printf("\n");
    fprintf(stderr,
            "infeedctl watch: the daemon stopped answering before its end summary came: %s\n",
            perr.msg);
    return 0;
}

/* The end summary's line; the exit status it means. */
static int print_end(json_t *s, int tty)
{
    const char *status = str_or(s, "status", "?");
    if (tty)
        printf("\r\033[K");
    printf("end: %s (%s) at global step %lld after %lld steps", status, str_or(s, "reason", "?"),
           (long long)num_or(s, "global_step", 0), (long long)num_or(s, "steps", 0));
    const char *more = json_string_value(json_object_get(s, "error"));
    if (more == NULL)
        more = json_string_value(json_object_get(s, "message"));
    if (more)
        printf(": %s", more);
    printf("\n");
    return strcmp(status, "ok") == 0 ? 0 : 1;
}

/* One summary: its progress line, or the end (*done set, the exit status returned). */
static int watch_summary(const char *text, long long last_step, int tty, int *done)
{
    json_t *s = json_loads(text, 0, NULL);
    int rc = 1;
    if (json_is_object(s) && strcmp(str_or(s, "event", ""), "end") == 0) {
        rc = print_end(s, tty);
        *done = 1;
    } else if (json_is_object(s)) {
        char line[512];
        progress_line(s, last_step, line, sizeof line);
        if (tty)
            printf("\r\033[K%s", line);
        else
            printf("%s\n", line);
        fflush(stdout);
    }
    json_decref(s);
    return rc;
}

int cmd_watch(const ctl_options *o)
{
    ifd_error err;
    ifd_error_clear(&err);
    /* The subscriber first: it connects while the status request below waits, so that with no
     * daemon the two waits of --timeout overlap instead of adding up. */
    ifd_client_options co = {.server_key_file = o->server_key,
                             .key_file = o->key_file,
                             .connect_timeout_ms = (int)(o->timeout * 1000 + 0.5)};
    ifd_subscriber *sub;
    if (ifd_subscriber_create_opts(&sub, o->publish, &co, &err) != IFD_OK) {
        fprintf(stderr, "infeedctl watch: %s\n", err.msg);
        return 1;
    }
    long long last_step = 0;
    int have_control = watch_header(o, &last_step, &err);
    int tty = isatty(STDOUT_FILENO), rc = 1, quiet_ms = 0, done = 0;
    while (!done) {
        char *text = NULL;
        int r = ifd_subscriber_recv(sub, &text, 1000, &err);
        if (r == IFD_ETIMEDOUT && strstr(err.msg, "no daemon answered") == NULL) {
            quiet_ms += 1000;
            if (quiet_ms >= 5000) {
                quiet_ms = 0;
                /* A control socket that never answered (busy at the start, or another host's)
                 * is asked again for the header; once it has answered, its silence ends the
                 * watch. Without that, watch would wait for ever after such a daemon died. */
                if (!have_control) {
                    ifd_error_clear(&err);
                    have_control = watch_header(o, &last_step, &err);
                } else if (!daemon_answers(o, tty)) {
                    break;
                }
            }
            continue;
        }
        if (r != IFD_OK) {
            if (tty)
                printf("\n");
            reword_client(err.msg, sizeof err.msg);
            fprintf(stderr, "infeedctl watch: %s\n", err.msg);
            break;
        }
        quiet_ms = 0;
        rc = watch_summary(text, last_step, tty, &done);
        free(text);
    }
    fflush(stdout);
    ifd_subscriber_destroy(sub);
    return done ? rc : 1;
}
