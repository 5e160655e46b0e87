/*
 * libinfeed: the run modes and input modes, their names, and what a step takes from the batch
 * source in each input mode (part of infeed/infeed.h, which includes it).
 */
#ifndef IFD_MODES_H
#define IFD_MODES_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { IFD_MODE_TRAIN = 0, IFD_MODE_EVAL, IFD_MODE_PREDICT } ifd_mode;
typedef enum {
    IFD_INPUT_PER_HOST = 0,
    IFD_INPUT_PER_HOST_V2,
    IFD_INPUT_PER_CORE,
    IFD_INPUT_BROADCAST
} ifd_input_mode;
typedef enum { IFD_REDUCE_MEAN = 0, IFD_REDUCE_SUM } ifd_loss_reduction;
typedef enum { IFD_OPT_SGD = 0, IFD_OPT_MOMENTUM, IFD_OPT_ADAM, IFD_OPT_ADAMW } ifd_optimizer_kind;
/* The learning rate's course over the optimizer's updates (docs/config.md, "Optimizer"). */
typedef enum { IFD_LR_CONSTANT = 0, IFD_LR_COSINE, IFD_LR_LINEAR } ifd_lr_schedule;

const char *ifd_mode_name(ifd_mode m);
int ifd_mode_parse(const char *s, ifd_mode *out);
const char *ifd_input_mode_name(ifd_input_mode m);
int ifd_input_mode_parse(const char *s, ifd_input_mode *out);
const char *ifd_loss_reduction_name(ifd_loss_reduction r);
int ifd_loss_reduction_parse(const char *s, ifd_loss_reduction *out);
const char *ifd_optimizer_name(ifd_optimizer_kind k);
int ifd_optimizer_parse(const char *s, ifd_optimizer_kind *out);
const char *ifd_lr_schedule_name(ifd_lr_schedule k);
int ifd_lr_schedule_parse(const char *s, ifd_lr_schedule *out);

/*
 * What one step takes from the batch source, per input mode (R replicas, global batch B):
 *
 *   mode         batches a step   rows a batch   replica r trains on
 *   per-host     1                B              rows [r*B/R, (r+1)*B/R) of the batch
 *   per-host-v2  R                B/R            batch r of the step's R consecutive batches
 *   per-core     R                B/R            the next batch of replica r's own stream
 *   broadcast    1                B/R            the whole batch (every replica the same rows)
 *
 * ifd_input_batches_per_step returns -1 for an unknown mode; ifd_input_batch_rows 0.
 */
int ifd_input_batches_per_step(ifd_input_mode mode, int replicas);
int64_t ifd_input_batch_rows(ifd_input_mode mode, int64_t batch_size, int replicas);

#ifdef __cplusplus
}
#endif

#endif
