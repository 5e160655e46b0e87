/*
 * The checkpoint file format's entry points inside the module and for the fuzzer
 * (fuzz/fuzz_checkpoint.c): the loader on bytes in memory, and the temporary names a write
 * goes through (checkpoint/format.c writes them, checkpoint/folder.c removes stale ones).
 */
#ifndef IFD_CHECKPOINT_FORMAT_H
#define IFD_CHECKPOINT_FORMAT_H

#include "checkpoint/object.h"

#include <stddef.h>

/* A write to DIR/NAME goes through DIR/.NAME<CKPT_TMP_MARK><pid>, renamed over NAME at the end;
 * the folder code removes those that a killed writer left. */
#define CKPT_TMP_MARK ".tmp-"

/* ifd_checkpoint_load's parser and checks, on a file's bytes in memory (len of them); path only
 * names the file in error sentences. The file loader reads the file and calls this (so does
 * fuzz/fuzz_checkpoint.c). */
int ifd_checkpoint_load_buffer(const void *data, size_t len, const char *path, ifd_checkpoint **out,
                               ifd_error *err);

#endif
