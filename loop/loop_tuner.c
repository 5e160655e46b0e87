#include "loop/loop_tuner.h"

#include <math.h>
#include <string.h>

#define MOST_STEPS ((int64_t)1 << 40) /* a loop's length is an int64; this is already days */

void ifd_loop_tuner_init(ifd_loop_tuner *t, ifd_loop_kind kind, double secs, double max_secs)
{
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->target_ns = secs * 1e9;
    t->max_ns = max_secs * 1e9;
}

/* Of v[0..n), sorted: the median, or the second largest (n > 0). */
static double order_stat(const double *v, int n, int second_largest)
{
    double w[IFD_TUNER_WINDOW];
    memcpy(w, v, sizeof(double) * (size_t)n);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && w[j - 1] > w[j]; j--) {
            double x = w[j];
            w[j] = w[j - 1];
            w[j - 1] = x;
        }
    if (second_largest)
        return w[n >= 2 ? n - 2 : 0];
    return n % 2 ? w[n / 2] : 0.5 * (w[n / 2 - 1] + w[n / 2]);
}

double ifd_loop_tuner_step_ns(const ifd_loop_tuner *t)
{
    return t->ns ? order_stat(t->s, t->ns, 0) : 0.0;
}

double ifd_loop_tuner_boundary_ns(const ifd_loop_tuner *t)
{
    return t->nc ? order_stat(t->c, t->nc, 1) : 0.0;
}

static void push(double *ring, int *count, int *at, double v)
{
    ring[*at] = v;
    *at = (*at + 1) % IFD_TUNER_WINDOW;
    if (*count < IFD_TUNER_WINDOW)
        (*count)++;
}

/* v rounded to a length in [1, MOST_STEPS] (v may be huge, or not finite). */
static int64_t steps_of(double v)
{
    if (!(v >= 1.0))
        return 1;
    if (v >= (double)MOST_STEPS)
        return MOST_STEPS;
    return (int64_t)v;
}

int64_t ifd_loop_tuner_next(const ifd_loop_tuner *t)
{
    if (t->loops == 0)
        return 1;
    double s = ifd_loop_tuner_step_ns(t);
    if (!(s > 0.0)) /* no steady step measured yet: a loop of 2 measures one */
        return t->most > 2 ? t->most : 2;
    double c = ifd_loop_tuner_boundary_ns(t);
    int64_t want;
    if (t->kind == IFD_LOOP_SECONDS) {
        want = steps_of(floor(t->target_ns / s + 0.5));
        if (t->n > 0 && fabs((double)t->n * s - t->target_ns) <= 0.1 * t->target_ns)
            want = t->n;
    } else {
        const double f = IFD_TUNER_COST;
        /* at least 2 where two fit the bound: a loop of one has no steady step to measure */
        int64_t least = steps_of(ceil(c * (1.0 - f) / (f * s)));
        int64_t most = steps_of(floor(t->max_ns / s));
        if (least < 2 && most >= 2)
            least = 2;
        if (least > most)
            want = most;
        else if (t->n >= least && t->n / 2 <= least && t->n <= most)
            want = t->n;
        else
            want = least;
    }
    int64_t grow =
        t->most > MOST_STEPS / IFD_TUNER_GROWTH ? MOST_STEPS : t->most * IFD_TUNER_GROWTH;
    return want > grow ? grow : want;
}

void ifd_loop_tuner_observe(ifd_loop_tuner *t, int64_t n, int64_t run_ns, int64_t first_ns,
                            int64_t cycle_ns)
{
    if (n < 1 || run_ns <= 0)
        return;
    if (n == 1) {
        /* no steady step: the one step, boundary and all, is a high sample of s (it keeps the
         * estimate moving when every loop is one step, e.g. after a slow start) */
        push(t->s, &t->ns, &t->is, (double)run_ns);
    } else {
        double s = (double)(run_ns - first_ns) / (double)(n - 1);
        if (s > 0.0) {
            push(t->s, &t->ns, &t->is, s);
            if (cycle_ns > 0) {
                double c = (double)cycle_ns - (double)n * s;
                push(t->c, &t->nc, &t->ic, c > 0.0 ? c : 0.0);
            }
        }
    }
    t->n = n;
    if (n > t->most)
        t->most = n;
    t->loops++;
}
