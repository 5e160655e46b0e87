/* Helpers of the checkpoint suites (tests/checkpoint/test_checkpoint_*.c): random configs and
 * checkpoints, comparing two checkpoints, and the checkpoints in a folder. */
#ifndef IFD_TEST_CHECKPOINTS_H
#define IFD_TEST_CHECKPOINTS_H

#include "core/rng.h"
#include <infeed/checkpoint.h>
#include <infeed/infeed.h>

#include <stdint.h>

/* A random config: linear or softmax over random sizes, a random optimizer, one step. */
void tu_ckpt_random_config(ifd_config *cfg, ifd_rng *rng);
/* A checkpoint of cfg with random parameters, slots, steps and (a third of them of several hosts)
 * producers' positions; host 0 selected. */
ifd_checkpoint *tu_ckpt_random(const ifd_config *cfg, ifd_rng *rng);
/* Fails unless a and b hold the same things, every host's producers included. */
void tu_ckpt_assert_same(const ifd_checkpoint *a, const ifd_checkpoint *b);
/* The steps of the checkpoint files in dir, ascending (at most max); returns how many. */
int tu_ckpt_steps(const char *dir, int64_t *steps, int max);

#endif
