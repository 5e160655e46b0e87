/* "tokens" (tests/util/tokens_program.c): a program of program ABI 4's features, for the tests of
 * int32 inputs of a per-row shape. program_config: vocab V (2..4096, default 16) and block T
 * (1..512, default 8). Inputs ids int32 [T] in [0, V) (ifd_program_add_ids) and the label y
 * float32 [T]; one parameter E [V, 1] (normal, std 0.5, no decay). pred = E[ids] (embedding),
 * loss = mean over every position of 0.5 (pred - y)^2; predict writes pred, [rows, T]. */
#ifndef IFD_TESTS_UTIL_TOKENS_PROGRAM_H
#define IFD_TESTS_UTIL_TOKENS_PROGRAM_H

#include <infeed/program.h>

const ifd_program_class *tokens_program_class(void);

#endif
