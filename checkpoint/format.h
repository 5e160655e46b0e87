/*
 * The checkpoint file format's entry points inside the module and for the fuzzer
 * (fuzz/fuzz_checkpoint.c): the loader on bytes in memory, the temporary names a write goes
 * through (checkpoint/format.c writes them, checkpoint/folder.c removes stale ones), and the
 * JSON header (checkpoint/header.c).
 */
#ifndef IFD_CHECKPOINT_FORMAT_H
#define IFD_CHECKPOINT_FORMAT_H

#include "checkpoint/object.h"

#include <jansson.h>
#include <stddef.h>

/* A write to DIR/NAME goes through DIR/.NAME<CKPT_TMP_MARK><pid>, renamed over NAME at the end;
 * the folder code removes those that a killed writer left. */
#define CKPT_TMP_MARK ".tmp-"

/* ifd_checkpoint_load's parser and checks, on a file's bytes in memory (len of them); path only
 * names the file in error sentences. The file loader reads the file and calls this (so does
 * fuzz/fuzz_checkpoint.c). */
int ifd_checkpoint_load_buffer(const void *data, size_t len, const char *path, ifd_checkpoint **out,
                               ifd_error *err);

/* The JSON header of c (checkpoint/header.c), a new reference; NULL when out of memory. */
json_t *ifd_ckpt_header_json(const ifd_checkpoint *c);
/* Fills c from the header h of the file path (named in sentences): every key checked, the
 * parameters against nparam_floats (already set), the producer tables. IFD_EPROTO (IFD_ENOMEM)
 * with a sentence naming the file and the key. */
int ifd_ckpt_header_parse(ifd_checkpoint *c, json_t *h, const char *path, ifd_error *err);
/* The integer member key of obj, in [lo, hi], into *out; IFD_EPROTO naming the file and the key
 * otherwise. */
int ifd_ckpt_header_int(json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                        const char *path, ifd_error *err);

#endif
