#include "tests/util/program_ref.h"

#include "tests/util/numbers.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tu_make_program_h(ifd_program *p, const char *name, int64_t d, int64_t h, int64_t k)
{
    ifd_program_settings s = {.features = d, .classes = k, .hidden = h};
    ifd_error err = {0};
    int rc = ifd_program_init(p, name, &s, &err);
    ck_assert_msg(rc == IFD_OK, "ifd_program_init(%s, D=%lld, H=%lld, K=%lld): %s", name,
                  (long long)d, (long long)h, (long long)k, ifd_error_text(&err));
}

void tu_make_program(ifd_program *p, const char *name, int64_t d, int64_t k)
{
    tu_make_program_h(p, name, d, 0, k);
}

int tu_is_mlp(const ifd_program *p)
{
    return strcmp(p->cls->name, "mlp") == 0;
}

void tu_run_any_step(const ifd_program *p, const ifd_tensor *in, int64_t rows, const float *params,
                     float *grads, float scale, ifd_step_out *out, float *pred)
{
    ifd_ops ops;
    ifd_cpu_ops_init(&ops, NULL);
    int64_t ws = p->cls->workspace_floats(p, rows);
    float *work = tu_falloc(ws);
    tu_fill_nan(work, ws);
    memset(out, 0, sizeof *out);
    ifd_step_args a = {
        .inputs = in,
        .rows = rows,
        .params = params,
        .grads = grads,
        .workspace = work,
        .scale = scale,
        .out = out,
        .predictions = pred,
    };
    ifd_error err = {0};
    int rc = pred ? p->cls->predict_step(p, &ops, &a, &err) : p->cls->train_step(p, &ops, &a, &err);
    ck_assert_msg(rc == IFD_OK, "%s: %s", pred ? "predict_step" : "train_step",
                  ifd_error_text(&err));
    free(work);
}

void tu_run_step(const ifd_program *p, const ifd_tensor *in, int64_t rows, const float *params,
                 float *grads, float scale, ifd_step_out *out)
{
    tu_run_any_step(p, in, rows, params, grads, scale, out, NULL);
}

const char *tu_param_name(const ifd_program *p, int64_t j, char *buf, size_t len)
{
    snprintf(buf, len, "param %lld", (long long)j);
    for (int i = 0; i < p->nparams; i++) {
        const ifd_param_spec *ps = &p->params[i];
        int64_t at = j - ps->offset;
        if (at < 0 || at >= ps->count)
            continue;
        if (ps->rank == 2)
            snprintf(buf, len, "%s[%lld][%lld]", ps->name, (long long)(at / ps->dims[1]),
                     (long long)(at % ps->dims[1]));
        else
            snprintf(buf, len, "%s[%lld]", ps->name, (long long)at);
    }
    return buf;
}

/* z[c] = b[c] + sum over j of x[j] w[j, c], in double: one row of a dense layer. */
static void ref_dense(int64_t n_in, int64_t n_out, const double *x, const float *w, const float *b,
                      double *z)
{
    for (int64_t c = 0; c < n_out; c++) {
        double s = b[c];
        for (int64_t j = 0; j < n_in; j++)
            s += x[j] * (double)w[j * n_out + c];
        z[c] = s;
    }
}

void tu_ref_logits(const ifd_program *p, const float *x, const float *params, double *z,
                   unsigned char *active)
{
    int64_t d = p->settings.features, k = p->settings.classes, h = p->settings.hidden;
    int64_t width = tu_is_mlp(p) ? (d > h ? d : h) : d;
    double *a = tu_xmalloc(sizeof(double) * (size_t)width),
           *hid = tu_xmalloc(sizeof(double) * (size_t)width);
    for (int64_t j = 0; j < d; j++)
        a[j] = x[j];
    if (tu_is_mlp(p)) {
        const float *w1 = params + ifd_program_param(p, "W1")->offset;
        const float *b1 = params + ifd_program_param(p, "b1")->offset;
        ref_dense(d, h, a, w1, b1, hid);
        for (int64_t j = 0; j < h; j++) {
            if (active)
                active[j] = hid[j] > 0.0;
            a[j] = hid[j] > 0.0 ? hid[j] : 0.0;
        }
        d = h;
        ref_dense(d, k, a, params + ifd_program_param(p, "W2")->offset,
                  params + ifd_program_param(p, "b2")->offset, z);
    } else {
        ref_dense(d, k, a, params + ifd_program_param(p, "W")->offset,
                  params + ifd_program_param(p, "b")->offset, z);
    }
    free(a);
    free(hid);
}

double tu_ref_loss_active(const ifd_program *p, const ifd_tensor *in, int64_t rows,
                          const float *params, int64_t *correct, int64_t *ambiguous,
                          unsigned char *active)
{
    int64_t d = p->settings.features, k = p->settings.classes;
    const float *x = in[0].data;
    double *z = tu_xmalloc(sizeof(double) * (size_t)k);
    double total = 0.0;
    *correct = 0;
    *ambiguous = 0;
    for (int64_t r = 0; r < rows; r++) {
        tu_ref_logits(p, x + r * d, params, z, active ? active + r * p->settings.hidden : NULL);
        if (p->classifier) {
            int32_t y = ((const int32_t *)in[1].data)[r];
            int64_t arg = 0;
            for (int64_t c = 1; c < k; c++)
                if (z[c] > z[arg])
                    arg = c;
            double second = -INFINITY, sum = 0.0;
            for (int64_t c = 0; c < k; c++) {
                if (c != arg && z[c] > second)
                    second = z[c];
                sum += exp(z[c] - z[arg]);
            }
            total += z[arg] + log(sum) - z[y];
            if (z[arg] - second < 1e-4 * (1.0 + fabs(z[arg])))
                (*ambiguous)++;
            else if (arg == y)
                (*correct)++;
        } else {
            const float *y = (const float *)in[1].data + r * k;
            double s = 0.0;
            for (int64_t c = 0; c < k; c++)
                s += (z[c] - y[c]) * (z[c] - y[c]);
            total += 0.5 * s;
        }
    }
    free(z);
    return total / (double)rows;
}

double tu_ref_loss(const ifd_program *p, const ifd_tensor *in, int64_t rows, const float *params,
                   int64_t *correct, int64_t *ambiguous)
{
    return tu_ref_loss_active(p, in, rows, params, correct, ambiguous, NULL);
}

int64_t tu_program_rows_workspace(const ifd_program *p, int64_t rows)
{
    (void)p;
    return rows;
}

int tu_program_no_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                       ifd_error *err)
{
    (void)p, (void)ops, (void)a, (void)err;
    return IFD_OK;
}
