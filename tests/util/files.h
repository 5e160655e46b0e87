/* Files in tests: a fresh folder under /tmp, whole files read and written, and what a piece of
 * code writes to stderr (the log). Each fails the test when the system call does. */
#ifndef IFD_TEST_FILES_H
#define IFD_TEST_FILES_H

#include <stddef.h>
#include <stdint.h>

/* A new empty folder /tmp/<prefix>-XXXXXX (malloc'd). */
char *tu_tmp_dir(const char *prefix);
/* Removes the files in dir (not folders), dir itself, and frees the name. */
void tu_rm_dir(char *dir);

/* The whole file (malloc'd, with a NUL byte after its end); its size in *len. */
uint8_t *tu_slurp(const char *path, size_t *len);
/* Writes len bytes to path, created or truncated. */
void tu_spit(const char *path, const void *bytes, size_t len);

/* Runs fn(arg) with stderr sent to a temporary file; returns what was written (malloc'd). */
char *tu_capture_stderr(void (*fn)(void *arg), void *arg);

#endif
