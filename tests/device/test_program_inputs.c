/*
 * ABI 4's int32 inputs of any per-row shape (token ids [T]) with a value range: the runtime's
 * batch check takes them in every mode and refuses a value out of range with a sentence naming
 * the tensor, the row, the element and the value; the tokens program (tests/util/tokens_program.c)
 * steps over them through the cpu op table (fill, embedding, its scatter-add) against
 * a double-precision reference, its parameter initialised by the runtime.
 */
#include "device/batch_check.h"
#include "device/step.h"
#include "tests/util/program_ref.h"
#include "tests/util/testutil.h"
#include "tests/util/tokens_program.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void tokens(ifd_program *p, int64_t vocab, int64_t block)
{
    if (ifd_program_find("tokens") == NULL)
        ck_assert_int_eq(ifd_program_register(tokens_program_class()), IFD_OK);
    char text[96];
    snprintf(text, sizeof text, "{\"vocab\": %" PRId64 ", \"block\": %" PRId64 "}", vocab, block);
    ifd_program_settings s = {.config = text};
    ifd_error err;
    ifd_error_clear(&err);
    RASSERT(ifd_program_init(p, "tokens", &s, &err) == IFD_OK, "%s", err.msg);
}

START_TEST(ids_are_checked_in_every_mode)
{
    ifd_rng rng;
    seed_rng(&rng);
    int64_t vocab = rand_between(&rng, 2, 300), block = rand_between(&rng, 1, 40);
    int64_t rows = rand_between(&rng, 1, 30);
    ifd_program p;
    tokens(&p, vocab, block);
    ck_assert_int_eq(p.inputs[0].dtype, IFD_I32);
    ck_assert_int_eq(p.inputs[0].rank, 1);
    ck_assert_int_eq(p.inputs[0].dims[0], block);
    ck_assert_int_eq(p.input_limit[0], vocab);
    ck_assert_int_eq(p.input_limit[1], 0);
    tu_batch *tb = tu_batch_random(&p, rows, 0, &rng);
    int32_t *ids = tb->data[0];
    static const ifd_mode modes[] = {IFD_MODE_TRAIN, IFD_MODE_EVAL, IFD_MODE_PREDICT};
    ifd_error err;
    for (int m = 0; m < 3; m++) {
        ifd_batch b = tb->b;
        if (modes[m] == IFD_MODE_PREDICT)
            b.ntensors = 1; /* ids only: y is a label */
        RASSERT(ifd_program_check_batch(&p, &b, rows, modes[m], &err) == IFD_OK, "%s", err.msg);
        int64_t r = rand_between(&rng, 0, rows - 1), e = rand_between(&rng, 0, block - 1);
        int32_t keep = ids[r * block + e];
        int32_t bad = ifd_rng_below(&rng, 2) ? (int32_t)vocab : -(int32_t)rand_between(&rng, 1, 9);
        ids[r * block + e] = bad;
        ck_assert_int_eq(ifd_program_check_batch(&p, &b, rows, modes[m], &err), IFD_ERANGE);
        char want[160];
        snprintf(want, sizeof want,
                 "tensor 'ids' row %" PRId64 " element %" PRId64
                 ": %d is out of range, expected 0 <= value < %" PRId64,
                 r, e, (int)bad, vocab);
        ck_assert_str_eq(err.msg, want);
        ids[r * block + e] = keep;
    }
    /* a shape other than [rows, T] is refused as before */
    tb->b.tensors[0].shape.dims[1] = block + 1;
    ck_assert_int_eq(ifd_program_check_batch(&p, &tb->b, rows, IFD_MODE_TRAIN, &err), IFD_ESHAPE);
    tu_batch_free(tb);
    /* what add_ids refuses */
    int64_t zero = 0, two = 2;
    ck_assert_int_eq(ifd_program_add_ids(&p, "a", 0, 1, &two, 0), IFD_EINVAL);
    ck_assert_int_eq(ifd_program_add_ids(&p, "b", 0, 1, &zero, 5), IFD_EINVAL);
    ck_assert_int_eq(ifd_program_add_ids(&p, "c", 1, IFD_MAX_RANK, &two, 5), IFD_EINVAL);
    ck_assert_int_eq(ifd_program_add_ids(&p, "d", 1, 0, NULL, (int64_t)INT32_MAX + 2), IFD_EINVAL);
    ck_assert_int_eq(p.ninputs, 2);
    ifd_program_free(&p);
}
END_TEST

START_TEST(a_step_over_token_ids)
{
    ifd_rng rng;
    seed_rng(&rng);
    int64_t vocab = rand_between(&rng, 2, 50), block = rand_between(&rng, 1, 20);
    int64_t rows = rand_between(&rng, 1, 20), n = rows * block;
    ifd_program p;
    tokens(&p, vocab, block);
    float *params = malloc(sizeof(float) * (size_t)vocab);
    ifd_program_init_params(&p, params, ifd_rng_next(&rng));
    double sq = 0;
    for (int64_t v = 0; v < vocab; v++)
        sq += (double)params[v] * params[v];
    ck_assert_msg(sq > 0, "E not initialised");
    tu_batch *tb = tu_batch_random(&p, rows, 0, &rng);
    const int32_t *ids = tb->data[0];
    const float *y = tb->data[1];
    float scale = (float)(1.0 / (double)rand_between(&rng, 1, 4));
    float *grads = malloc(sizeof(float) * (size_t)vocab);
    for (int64_t v = 0; v < vocab; v++)
        grads[v] = NAN; /* the step writes them all */
    ifd_step_out out;
    tu_run_step(&p, tb->b.tensors, rows, params, grads, scale, &out);
    double loss = 0, *g = calloc((size_t)vocab, sizeof *g);
    for (int64_t i = 0; i < n; i++) {
        double d = (double)params[ids[i]] - y[i];
        loss += 0.5 * d * d;
        g[ids[i]] += scale * d / (double)n;
    }
    loss = scale * loss / (double)n;
    RASSERT(fabs(out.loss - loss) <= 1e-5 * (1 + loss), "loss %g, reference %g", (double)out.loss,
            loss);
    for (int64_t v = 0; v < vocab; v++)
        RASSERT(fabs(grads[v] - g[v]) <= 1e-6 + 1e-5 * fabs(g[v]), "dE[%" PRId64 "]: %g, %g", v,
                (double)grads[v], g[v]);
    float *pred = malloc(sizeof(float) * (size_t)n);
    tu_run_any_step(&p, tb->b.tensors, rows, params, NULL, scale, &out, pred);
    for (int64_t i = 0; i < n; i++)
        ck_assert(pred[i] == params[ids[i]]);
    free(params), free(grads), free(g), free(pred);
    tu_batch_free(tb);
    ifd_program_free(&p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("program_inputs");
    TCase *tc = tu_tcase(s, "ids", 60);
    tcase_add_loop_test(tc, ids_are_checked_in_every_mode, 0, 8);
    tcase_add_loop_test(tc, a_step_over_token_ids, 0, 8);
    return tu_run_suite(s);
}
