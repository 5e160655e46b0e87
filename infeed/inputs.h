/*
 * A batch's inputs, for the infeed thread and for whoever accepts batches before they reach it
 * (the daemon's ingest, host/): the program inputs a mode carries and a batch's float values
 * checked.
 */
#ifndef IFD_INFEED_INPUTS_H
#define IFD_INFEED_INPUTS_H

#include "infeed/infeed.h"

/* The program inputs a batch carries in mode: all of them, or in predict mode those that are not
 * labels. Writes their indices into p->inputs to idx, in spec order; returns how many. */
int ifd_infeed_mode_inputs(const ifd_program *p, ifd_mode mode, int idx[IFD_MAX_INPUTS]);

/* A batch against the program's inputs: ifd_program_check_batch (device/batch_check.h), the
 * one check both the ingest and the infeed thread use. */

/* Checks the values of b's float32 tensors (those of mode's inputs, in order): every element
 * finite and, when max_abs > 0, of magnitude at most max_abs. IFD_ERANGE names the tensor, the row,
 * the element within the row and the value. One pass over the data; other dtypes are not read
 * (labels are the program's check_batch). */
int ifd_infeed_check_values(const ifd_program *p, const ifd_batch *b, ifd_mode mode, double max_abs,
                            ifd_error *err);

#endif
