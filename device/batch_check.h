/*
 * A batch against its program: the one check every path uses (the daemon's ingest when a batch
 * arrives, the infeed thread for batches of an in-process source).
 */
#ifndef IFD_DEVICE_BATCH_CHECK_H
#define IFD_DEVICE_BATCH_CHECK_H

#include "infeed/infeed.h"
#include "infeed/program.h"

/* Checks a batch against the program's inputs for mode (ifd_step_inputs): tensor count,
 * dtypes, per-row shapes, the same row count everywhere and, when batch_size > 0, rows ==
 * batch_size, the rows a batch has in the input mode (ifd_input_batch_rows) (predict mode:
 * 1 <= rows <= batch_size, a partial batch being padded later); then the program's own check (not
 * in predict mode: it checks labels). The sentence names the tensor, the expected and the
 * received value. Any thread: it reads the program only. */
int ifd_program_check_batch(const ifd_program *p, const ifd_batch *b, int64_t batch_size,
                            ifd_mode mode, ifd_error *err);

#endif
