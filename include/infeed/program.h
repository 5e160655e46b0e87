/*
 * The program ABI. A program is a model: it declares the tensors it takes from the infeed and its
 * parameters, and computes one replica's loss and gradients in the backend-neutral op set below.
 * The runtime does the rest: loss scaling for the MEAN reduction, the all-reduce, the optimizer,
 * the global step and the outfeed.
 *
 * A program may also declare named outfeed tensors (ifd_program_add_outfeed): the step writes them
 * into device memory and the runtime brings them to the host with the step's record, where the
 * outfeed thread concatenates every replica's along axis 0 and hands them to host calls.
 *
 * Every pointer a step receives (inputs, params, grads, workspace, out, outfeeds) is device memory
 * of the backend that runs it: host memory on cpu, GPU memory on cuda. A program never dereferences
 * them itself; it only does pointer arithmetic and calls the ops, which is what lets one program
 * run unchanged on every backend.
 */
#ifndef IFD_PROGRAM_H
#define IFD_PROGRAM_H

#include <infeed/tensor.h>

#include <stddef.h>
#include <stdint.h>

#define IFD_MAX_INPUTS 8
#define IFD_NAME_MAX 32
/* A parameter's rank: 1 to IFD_PARAM_MAX_RANK. */
#define IFD_PARAM_MAX_RANK 4
#define IFD_MAX_OUTFEEDS 8

/* One tensor the program takes from the infeed: its name, dtype and per-row shape (the batch
 * dimension is not part of it; rank 0 means one scalar per row). */
typedef struct ifd_input_spec {
    char name[IFD_NAME_MAX];
    ifd_dtype dtype;
    int rank;
    int64_t dims[IFD_MAX_RANK];
} ifd_input_spec;

/* How the runtime initialises a parameter (ifd_program_add_param_with). */
typedef enum ifd_param_init_kind {
    IFD_INIT_PROGRAM = 0, /* the class's init_params writes it (ifd_program_add_param's) */
    IFD_INIT_ZEROS,
    IFD_INIT_ONES,
    IFD_INIT_NORMAL, /* normal, mean 0, standard deviation std */
    IFD_INIT_GLOROT, /* Glorot-uniform: fan_in dims[rank-2], fan_out dims[rank-1], each times
                      * the product of the dims before them (a rank-1 parameter: both dims[0]) */
} ifd_param_init_kind;

typedef struct ifd_param_init {
    ifd_param_init_kind kind;
    float std; /* IFD_INIT_NORMAL's; > 0 */
} ifd_param_init;

/* One float32 parameter: a row-major block of the program's flat parameter vector. */
typedef struct ifd_param_spec {
    char name[IFD_NAME_MAX];
    int rank;
    int64_t dims[IFD_PARAM_MAX_RANK];
    int64_t offset; /* in floats, into the flat vector */
    int64_t count;
    unsigned flags;      /* IFD_PARAM_* (0 from ifd_program_add_param) */
    ifd_param_init init; /* IFD_INIT_PROGRAM from ifd_program_add_param */
} ifd_param_spec;

/* ifd_param_spec.flags: the optimizer leaves this parameter out of decoupled weight decay
 * (AdamW's), as biases and norm gains are. */
#define IFD_PARAM_NO_DECAY 1u

/* One outfeed tensor a program declares: float32 or int32, and either one value of shape dims a
 * row (per_row 1: the step writes [rows, dims...]) or one value of shape dims a replica-step
 * (per_row 0). rank counts dims only (0: a scalar a row, or a scalar a step). */
typedef struct ifd_outfeed_spec {
    char name[IFD_NAME_MAX];
    ifd_dtype dtype;
    int per_row;
    int rank;
    int64_t dims[IFD_MAX_RANK];
} ifd_outfeed_spec;

/* The settings a built-in program reads; a value <= 0 means "not set". */
typedef struct ifd_program_settings {
    int64_t features; /* D */
    int64_t classes;  /* K: classes for classifiers, outputs for linear */
    int64_t hidden;   /* hidden width (mlp) */
    /* The program's own settings (ABI 4; --program-config, program_config): a JSON object's
     * text, or NULL for none. Borrowed; ifd_program_init parses it, and the setup reads it with
     * ifd_program_config_int and its kin. */
    const char *config;
} ifd_program_settings;

/* What one replica's step writes to its outfeed, in device memory. loss is already multiplied
 * by the step's scale. */
typedef struct ifd_step_out {
    float loss;
    float correct; /* correct predictions, classifiers only */
    float count;   /* rows in the shard */
    float reserved;
    /* The runtime's, in train steps, after the program's step (programs leave them alone):
     * loss_nonfinite is 1 when this replica's loss was not finite, skipped is 1 when the step
     * was skipped because the all-reduced gradients were not finite (every replica and host
     * skips the same steps: no parameter, optimizer slot or update count changed). */
    float loss_nonfinite;
    float skipped;
    /* The runtime's, in train steps: the L2 norm of the all-reduced gradients (before the
     * update), of the parameters after it, and the learning rate the update used. */
    float grad_norm;
    float param_norm;
    float learning_rate;
    float reserved2;
} ifd_step_out;

/*
 * The op set. Matrices are row-major and dense. Each op is enqueued on the replica's device and
 * may run asynchronously (cuda); ops on one replica run in call order. Call them from the step
 * function's thread only, one at a time: on cpu a large product is shared with the replica's
 * helper threads, which take one caller at a time.
 */
typedef struct ifd_ops {
    void *ctx;
    /* C[m,n] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T. A is [m,k] ([k,m] when
     * trans_a), B is [k,n] ([n,k] when trans_b). */
    void (*gemm)(void *ctx, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float *a, const float *b, float beta, float *c);
    /* x[r,c] += bias[c] */
    void (*bias_add)(void *ctx, int64_t rows, int64_t cols, const float *bias, float *x);
    /* out[c] = sum over r of x[r,c] (the bias gradient) */
    void (*col_sum)(void *ctx, int64_t rows, int64_t cols, const float *x, float *out);
    /* y = max(x, 0); dx = dy where y > 0, else 0 */
    void (*relu)(void *ctx, int64_t n, const float *x, float *y);
    void (*relu_grad)(void *ctx, int64_t n, const float *y, const float *dy, float *dx);
    /* Softmax cross-entropy of logits [rows,k] against int32 labels in [0,k):
     * out->loss = scale * mean over rows of -log softmax(logits)[label],
     * out->correct = rows whose argmax equals the label,
     * dlogits = scale / rows * (softmax(logits) - onehot(label)). */
    void (*softmax_xent)(void *ctx, int64_t rows, int64_t k, const float *logits,
                         const int32_t *labels, float scale, float *dlogits, ifd_step_out *out);
    /* Row-wise softmax: probs[r,:] = softmax(logits[r,:]) (the predict step of classifiers). */
    void (*softmax)(void *ctx, int64_t rows, int64_t k, const float *logits, float *probs);
    /* Least squares: out->loss = scale * mean over rows of 0.5 * |pred - y|^2,
     * dpred = scale / rows * (pred - y). */
    void (*squared_error)(void *ctx, int64_t rows, int64_t k, const float *pred, const float *y,
                          float scale, float *dpred, ifd_step_out *out);
    /* y = tanh(x) (y may be x); dx = dy * (1 - y^2) from the forward's output y (dx may be dy). */
    void (*tanh)(void *ctx, int64_t n, const float *x, float *y);
    void (*tanh_grad)(void *ctx, int64_t n, const float *y, const float *dy, float *dx);
    /* L2 weight decay of n weights w: adds scale * decay / 2 * sum w^2 to out->loss (so call it
     * after the loss op, which sets out->loss), and, unless grad is NULL (eval), adds
     * scale * decay * w to grad (so call it after grad holds the loss's gradient). */
    void (*l2_decay)(void *ctx, int64_t n, float decay, float scale, const float *w, float *grad,
                     ifd_step_out *out);
    /* A classifier's outfeed from logits [rows,k]: cls[r] = the argmax of row r (the first of
     * equal maxima, as softmax_xent's correct counts it), conf[r] = softmax(logits[r])[cls[r]].
     * Either output may be NULL. */
    void (*classify)(void *ctx, int64_t rows, int64_t k, const float *logits, int32_t *cls,
                     float *conf);
    /* dst[0..bytes) = src[0..bytes), both device memory (for example a label input into an
     * outfeed tensor); the ranges do not overlap. */
    void (*copy)(void *ctx, void *dst, const void *src, int64_t bytes);
    /* softmax_xent and classify in one pass over the logits (one exp an element, not two): the
     * same out, dlogits, cls and conf as the two ops; cls and conf may be NULL. */
    void (*softmax_xent_classify)(void *ctx, int64_t rows, int64_t k, const float *logits,
                                  const int32_t *labels, float scale, float *dlogits,
                                  ifd_step_out *out, int32_t *cls, float *conf);

    /* ---- the transformer's ops (ABI 4); sums in a fixed order, so results repeat bit for bit */
    /* x[0..n) = value (gradients an op adds to, such as embedding_grad's, start from 0). */
    void (*fill)(void *ctx, int64_t n, float value, float *x);
    /* y[0..n) += alpha * x[0..n) (a residual connection: alpha 1). */
    void (*add)(void *ctx, int64_t n, float alpha, const float *x, float *y);
    /* batch products C_i = alpha * op(A_i) * op(B_i) + beta * C_i, i < batch, as gemm, with
     * A_i = a + i * stride_a, B_i = b + i * stride_b, C_i = c + i * stride_c (strides in floats;
     * the matrices themselves dense, row-major). */
    void (*gemm_strided_batched)(void *ctx, int trans_a, int trans_b, int64_t m, int64_t n,
                                 int64_t k, float alpha, const float *a, int64_t stride_a,
                                 const float *b, int64_t stride_b, float beta, float *c,
                                 int64_t stride_c, int64_t batch);
    /* out[r, :] = table[ids[r], :], r < rows (ids checked by the program's check_batch). */
    void (*embedding)(void *ctx, int64_t rows, int64_t dim, const int32_t *ids, const float *table,
                      float *out);
    /* dtable[ids[r], :] += dout[r, :]: a scatter-add whose sums run in row order (the same bits
     * on every run and backend thread count). */
    void (*embedding_grad)(void *ctx, int64_t rows, int64_t dim, const int32_t *ids,
                           const float *dout, float *dtable);
    /* Layer norm of each row's dim values: y = (x - mean) * rstd * gamma + beta, rstd =
     * 1 / sqrt(var + eps), var the biased variance (Keras, PyTorch); mean and rstd ([rows]) kept
     * for the backward; y may be x. */
    void (*layernorm)(void *ctx, int64_t rows, int64_t dim, const float *x, const float *gamma,
                      const float *beta, float eps, float *y, float *mean, float *rstd);
    /* From the forward's x, mean and rstd: dx written (dx may be dy), dgamma and dbeta ([dim])
     * added to. */
    void (*layernorm_grad)(void *ctx, int64_t rows, int64_t dim, const float *x, const float *gamma,
                           const float *mean, const float *rstd, const float *dy, float *dx,
                           float *dgamma, float *dbeta);
    /* Exact GELU (Keras' approximate=False): y = x / 2 * (1 + erf(x / sqrt 2)), y may be x; the
     * gradient from the forward's input: dx = dy * (Phi(x) + x * phi(x)), dx may be dy. */
    void (*gelu)(void *ctx, int64_t n, const float *x, float *y);
    void (*gelu_grad)(void *ctx, int64_t n, const float *x, const float *dy, float *dx);
    /* Causal self-attention of batch sequences of t positions, heads heads of width dh (C =
     * heads * dh). qkv [batch * t, 3C]: each row's query, key and value, head h's in columns
     * [h dh, (h + 1) dh) of each third; out [batch * t, C], head h's output in its columns.
     * Scores scaled by 1 / sqrt(dh), position i attends to j <= i; probs ([batch, heads, t, t])
     * keeps the softmax for the backward (zero above the diagonal). */
    void (*attention)(void *ctx, int64_t batch, int64_t t, int64_t heads, int64_t dh,
                      const float *qkv, float *probs, float *out);
    /* From qkv and the forward's probs: dqkv ([batch * t, 3C], written) from dout
     * ([batch * t, C]); work: batch * heads * t * t floats of scratch. */
    void (*attention_grad)(void *ctx, int64_t batch, int64_t t, int64_t heads, int64_t dh,
                           const float *qkv, const float *probs, const float *dout, float *dqkv,
                           float *work);

    /* ---- ABI 5 */
    /* A dense layer in one op: C[m,n] = A[m,k] B[k,n] + bias[n], plus res[m,n] when res is not
     * NULL (a residual connection; res may be c). C starts as res + bias and the product is
     * added to it (beta = 1), so no pass zeroes C and none adds the bias after. */
    void (*gemm_bias)(void *ctx, int64_t m, int64_t n, int64_t k, const float *a, const float *b,
                      const float *bias, const float *res, float *c);
} ifd_ops;

typedef struct ifd_program ifd_program;
typedef struct ifd_program_config ifd_program_config; /* the runtime's (program_config.c) */

/* One replica's step. */
typedef struct ifd_step_args {
    /* train and eval: ninputs views of the replica's shard, in spec order; predict: the inputs
     * that are not labels, in spec order */
    const ifd_tensor *inputs;
    int64_t rows;
    const float *params;
    /* train: written in full by the step. NULL in eval mode: compute the loss and the metrics
     * only (no gradients). */
    float *grads;
    float *workspace;
    float scale; /* 1/replicas for the MEAN reduction, 1 for SUM */
    ifd_step_out *out;
    /* predict only: [rows, predict_cols] outputs the predict step writes; NULL otherwise */
    float *predictions;
    /* train and eval: the step's outfeed tensors (p->outfeeds, in declaration order), device
     * memory the step writes in full: [rows, dims...] for a per-row tensor, [dims...] for one a
     * replica-step. NULL in predict mode, in a step whose tensors nobody takes (no host call,
     * no tensor sink that wants them then), and where a step runs without an outfeed (a test
     * that calls the program directly): a program writes its outfeeds only when this is not
     * NULL. */
    void *const *outfeeds;
} ifd_step_args;

typedef struct ifd_program_class {
    const char *name;
    const char *description;
    /* Validates p->settings and fills inputs, params, nparam_floats and classifier. */
    int (*setup)(ifd_program *p, ifd_error *err);
    /* Optional when every parameter declares its initializer (ifd_program_add_param_with): host
     * memory, the initial flat parameter vector, a function of seed alone. It writes the
     * parameters declared IFD_INIT_PROGRAM (it may write the others: the runtime writes them
     * after it). */
    void (*init_params)(const ifd_program *p, float *params, uint64_t seed);
    /* Floats of workspace a step over rows rows needs. */
    int64_t (*workspace_floats)(const ifd_program *p, int64_t rows);
    /* Optional. Host memory: checks values a step cannot (labels in range) over a whole host
     * batch; row numbers in the sentence are the batch's. */
    int (*check_batch)(const ifd_program *p, const ifd_tensor *inputs, int64_t rows,
                       ifd_error *err);
    /* Loss and gradients of one shard (a->grads NULL in eval mode: loss and metrics only). */
    int (*train_step)(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                      ifd_error *err);
    /* Optional (predict mode needs it): writes a->predictions, [rows, predict_cols], from the
     * inputs that are not labels. Classifiers write class probabilities; the host adds the
     * argmax. */
    int (*predict_step)(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                        ifd_error *err);
    /* Optional (ABI 4): frees p->state, what setup allocated there (the settings it read from
     * settings.config, for its steps); ifd_program_free calls it when p->state is not NULL, also
     * after a setup that failed. */
    void (*free_state)(ifd_program *p);
} ifd_program_class;

struct ifd_program {
    const ifd_program_class *cls;
    ifd_program_settings settings;
    int ninputs;
    ifd_input_spec inputs[IFD_MAX_INPUTS];
    /* Bit i set: input i is a label, taken in train and eval mode only (predict mode takes the
     * other inputs, in spec order). */
    unsigned labels;
    /* Input i from ifd_program_add_ids: every value lies in [0, input_limit[i]) (token ids),
     * which the runtime checks in every mode before a step sees the batch; 0: any value. */
    int64_t input_limit[IFD_MAX_INPUTS];
    int nparams;
    ifd_param_spec *params; /* nparams of them, in declaration order (heap: ifd_program_free) */
    int params_cap;
    int64_t nparam_floats;
    int classifier;
    int64_t predict_cols; /* floats per row the predict step writes (0: no predict step) */
    int noutfeeds;
    ifd_outfeed_spec outfeeds[IFD_MAX_OUTFEEDS]; /* ifd_program_add_outfeed, in order */
    ifd_program_config *config;                  /* settings.config, parsed (the readers below) */
    void *state; /* the program's own (setup's), freed by its class's free_state */
};

/* Makes cls findable by name (built-ins are registered already). IFD_EINVAL when the name is
 * taken. Not thread-safe: register before creating sessions. */
int ifd_program_register(const ifd_program_class *cls);
const ifd_program_class *ifd_program_find(const char *name);
/* Writes the registered names, comma-separated, into buf. */
const char *ifd_program_names(char *buf, size_t len);
/* A setup's check of one setting (features, classes, hidden, or one of its own): v must lie in
 * [min, max], and 0 is a setting not set. The sentence names the program and the setting
 * ("program 'mlp': setting 'hidden' must be between 1 and 1048576, got 0"), and carries the
 * setting as its key (ifd_error_mark_key), so that infeedd names it as the user gave it. */
int ifd_program_check_setting(const char *program, const char *key, int64_t v, int64_t min,
                              int64_t max, ifd_error *err);
/* How ifd_program_check_setting's sentence ends for a setting of 0 (one not set). */
#define IFD_PROGRAM_NOT_SET ", and it is not set"
/* Finds the class and runs its setup. A successful call is paired with one ifd_program_free; a
 * failed one leaves p holding nothing (freeing it too is harmless). */
int ifd_program_init(ifd_program *p, const char *name, const ifd_program_settings *s,
                     ifd_error *err);
/* Frees what ifd_program_init allocated (the parameter list, the parsed config); p is zeroed.
 * NULL is a no-op. */
void ifd_program_free(ifd_program *p);
/* The initial flat parameter vector (host memory, nparam_floats): the class's init_params when
 * it has one, then every parameter with a declared initializer, each a function of (seed, its
 * name) alone. */
void ifd_program_init_params(const ifd_program *p, float *params, uint64_t seed);

/*
 * Programs as plugins. A shared library (built against these headers, for example with CMake's
 * find_package(infeed) and add_library(NAME MODULE ...): examples/custom_program/) brings its
 * own program classes: it defines its entry point with IFD_PROGRAM_PLUGIN, and
 * ifd_program_load_plugin (infeedd's --program-lib) loads it, checks that it was built for this
 * ABI version and calls the entry point, which registers its classes through the registry.
 *
 * IFD_PROGRAM_ABI_VERSION changes whenever ifd_program_class, ifd_program, ifd_ops (an op added
 * too), ifd_step_args, the registry or the helpers below change in a way a built plugin would
 * notice; a plugin built for another version is refused. Version 2: ifd_error carries the key its
 * sentence is about (a plugin's own ifd_error is larger), ifd_program_check_setting. Version 3:
 * outfeed tensors (ifd_outfeed_spec, ifd_program.outfeeds, ifd_step_args.outfeeds,
 * ifd_program_add_outfeed), the ops classify, copy and softmax_xent_classify, and ifd_step_out's
 * grad_norm, param_norm and learning_rate. Version 4 (the transformer's, issue 22): any number of
 * parameters (ifd_program.params a list that ifd_program_free frees; IFD_MAX_PARAMS is gone),
 * parameter ranks up to IFD_PARAM_MAX_RANK, per-parameter initializers and flags
 * (ifd_param_spec.init and .flags, ifd_program_add_param_with, ifd_program_init_params; a class's
 * init_params optional), and the ops fill, add, gemm_strided_batched, embedding, embedding_grad,
 * layernorm, layernorm_grad, gelu, gelu_grad, attention and attention_grad; program settings as
 * a JSON object (ifd_program_settings.config, ifd_program.config, ifd_program_config_int and
 * its kin, ifd_program_config_text); int32 inputs of any per-row shape with a value range the
 * runtime checks in every mode (ifd_program.input_limit, ifd_program_add_ids); the op fill; a
 * program's own state (ifd_program.state, ifd_program_class.free_state). Version 5: the op
 * gemm_bias (a dense layer's product, bias and residual in one op).
 */
#define IFD_PROGRAM_ABI_VERSION 5

typedef struct ifd_program_registry ifd_program_registry;
struct ifd_program_registry {
    unsigned abi_version; /* the loader's IFD_PROGRAM_ABI_VERSION */
    void *ctx;
    /* Registers cls, which must stay valid as long as the process lives (a static const
     * ifd_program_class). IFD_EINVAL with a sentence in err when a field it needs is NULL or the
     * name is taken. */
    int (*add)(ifd_program_registry *reg, const ifd_program_class *cls, ifd_error *err);
};

/* The entry point: registers the plugin's classes; on an error, fills err (the loader then
 * registers none of them). */
typedef int (*ifd_program_plugin_init_fn)(ifd_program_registry *reg, ifd_error *err);

#define IFD_PROGRAM_PLUGIN_ABI_SYMBOL "ifd_program_plugin_abi"
#define IFD_PROGRAM_PLUGIN_INIT_SYMBOL "ifd_program_plugin_init"

/* Defines a plugin's entry point around init_fn (an ifd_program_plugin_init_fn), with the ABI
 * version it is built for. Write it once, at file scope, in one source file of the plugin. */
#ifdef __cplusplus
#define IFD_PLUGIN_LINKAGE_ extern "C" /* the loader looks the symbols up by their C names */
#else
#define IFD_PLUGIN_LINKAGE_
#endif
#define IFD_PROGRAM_PLUGIN(init_fn)                                                                \
    IFD_PLUGIN_LINKAGE_ __attribute__((visibility("default")))                                     \
    const unsigned ifd_program_plugin_abi = IFD_PROGRAM_ABI_VERSION;                               \
    IFD_PLUGIN_LINKAGE_ __attribute__((visibility("default"))) int ifd_program_plugin_init(        \
        ifd_program_registry *reg, ifd_error *err);                                                \
    IFD_PLUGIN_LINKAGE_ int ifd_program_plugin_init(ifd_program_registry *reg, ifd_error *err)     \
    {                                                                                              \
        return init_fn(reg, err);                                                                  \
    }

/* Loads the plugin at path (dlopen; a path without '/' is taken from the current folder) and
 * registers its classes. One sentence in err, naming path, when the file cannot be loaded (the
 * loader's own text), has no entry point, is built for another ABI version, registers a name
 * another program has (a built-in one or another plugin's), registers nothing or its entry point
 * fails. Loading the same file again does nothing. Not thread-safe, like ifd_program_register. */
int ifd_program_load_plugin(const char *path, ifd_error *err);

/*
 * A setup's readers of settings.config, the program's own settings (a JSON object): each takes
 * key's value into *out, def when the object has no such key, or fails with IFD_EINVAL and a
 * sentence naming the program, the setting, what it expects and what it got ("program 'charlm':
 * program_config setting 'layers': expected an integer from 1 to 64, got 0"; infeedd says
 * --program-config or program_config as the user gave it). A key the setup never reads is
 * refused after it ("... setting 'layrs': the program has no such setting (it reads layers,
 * heads)"), so a program reads every key it knows, even when it does not use it this time.
 */
int ifd_program_config_int(ifd_program *p, const char *key, int64_t def, int64_t min, int64_t max,
                           int64_t *out, ifd_error *err);
/* A number (an integer is taken too) in [min, max]. */
int ifd_program_config_float(ifd_program *p, const char *key, double def, double min, double max,
                             double *out, ifd_error *err);
int ifd_program_config_bool(ifd_program *p, const char *key, int def, int *out, ifd_error *err);
/* A string of at most len - 1 bytes, into buf. */
int ifd_program_config_string(ifd_program *p, const char *key, const char *def, char *buf,
                              size_t len, ifd_error *err);
/* The settings' canonical text (compact JSON, keys sorted): "{}" for none. What checkpoints
 * record and compare. */
const char *ifd_program_config_text(const ifd_program *p);

/* Helpers for setup functions. */
int ifd_program_add_input(ifd_program *p, const char *name, ifd_dtype dt, int rank,
                          const int64_t *dims);
/* As ifd_program_add_input, for a label (an input predict mode does not take). */
int ifd_program_add_label(ifd_program *p, const char *name, ifd_dtype dt, int rank,
                          const int64_t *dims);
/* Declares a parameter of rank 1 to IFD_PARAM_MAX_RANK, dims each >= 1, a name of 1 to
 * IFD_NAME_MAX - 1 bytes that no other parameter of p has, initialised by the class's
 * init_params and with no flags. IFD_EINVAL otherwise; IFD_ENOMEM. */
/* An int32 input (label 1: a label, which predict mode does not take) of any per-row shape (rank
 * 0 to IFD_MAX_RANK - 1, dims >= 1: token ids [T]) whose every value must lie in [0, limit)
 * (limit >= 1: the vocabulary). The runtime checks each batch's values in every mode, before
 * any step sees them, with a sentence naming the tensor, the row, the element and the value, so a
 * step may index tables with them. IFD_EINVAL for a bad rank, dims or limit. */
int ifd_program_add_ids(ifd_program *p, const char *name, int label, int rank, const int64_t *dims,
                        int64_t limit);
int ifd_program_add_param(ifd_program *p, const char *name, int rank, const int64_t *dims);
/* As ifd_program_add_param, with the parameter's initializer (the runtime applies it; a normal's
 * std must be finite and > 0) and flags (IFD_PARAM_*). */
int ifd_program_add_param_with(ifd_program *p, const char *name, int rank, const int64_t *dims,
                               ifd_param_init init, unsigned flags);
/* Declares an outfeed tensor (ifd_outfeed_spec): dtype IFD_F32 or IFD_I32, per_row 1 or 0, rank
 * 0 to IFD_MAX_RANK - 1 dims each >= 1, a name of 1 to IFD_NAME_MAX - 1 letters, digits, '_',
 * '.' or '-' (it goes into JSON and subscription topics as it is) that no other
 * outfeed tensor of p has and that is none of the runtime's own ("loss", "correct", "count",
 * "grad_norm", "param_norm", "learning_rate"). IFD_EINVAL otherwise, or when p has
 * IFD_MAX_OUTFEEDS already. */
int ifd_program_add_outfeed(ifd_program *p, const char *name, ifd_dtype dtype, int per_row,
                            int rank, const int64_t *dims);
/* Bytes of one value of outfeed tensor i: a row's (per_row) or a replica-step's. */
int64_t ifd_program_outfeed_value_bytes(const ifd_program *p, int i);
/* The layout of one replica-step's outfeed area for steps of up to max_rows rows: tensor i at
 * offs[i] bytes (each aligned to 256 bytes); returns the area's size in bytes (0: no outfeed). */
int64_t ifd_program_outfeed_layout(const ifd_program *p, int64_t max_rows,
                                   int64_t offs[IFD_MAX_OUTFEEDS]);
const ifd_param_spec *ifd_program_param(const ifd_program *p, const char *name);
/* Glorot-uniform weights for a [fan_in, fan_out] block, deterministic in (seed, offset). */
void ifd_program_init_glorot(float *w, int64_t fan_in, int64_t fan_out, uint64_t seed);

#endif
