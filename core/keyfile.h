/*
 * CURVE key files (docs/protocol.md, "Key files"), shared by infeedd and the C client. Compiled
 * into both (not into libinfeed, which does not link libzmq).
 *
 * - A key pair file (PREFIX.key, mode 0600) holds the public and the secret key, Z85:
 *       # comment lines and blank lines
 *       public-key <40 Z85 characters>
 *       secret-key <40 Z85 characters>
 * - A public key file (PREFIX.pub) holds the public key alone on one line (comment and blank
 *   lines allowed), so that it can be appended to an authorized-keys file as it is.
 *
 * Keys are kept as NUL-terminated Z85 text (IFD_KEY_Z85_LEN characters). Errors name the file,
 * the line and what was expected.
 */
#ifndef IFD_CORE_KEYFILE_H
#define IFD_CORE_KEYFILE_H

#include <infeed/error.h>

#include <stddef.h>

#define IFD_KEY_Z85_LEN 40
#define IFD_KEY_BIN_LEN 32
/* Key files are small; a larger one is not a key file. */
#define IFD_KEYFILE_MAX (1 << 20)

/* Whether s[0..len) is a CURVE key in Z85: 40 characters of the Z85 alphabet. */
int ifd_key_z85_valid(const char *s, size_t len);

/* Reads a whole file (at most IFD_KEYFILE_MAX bytes) into a malloc'd NUL-terminated string. what
 * names the setting in errors ("curve_secret_key"). */
int ifd_keyfile_read(const char *path, const char *what, char **text, ifd_error *err);

/* Parses a key pair file's text: pub and sec get the Z85 keys. The secret key must give the
 * public key (a pair from one keygen). source names the file in errors. */
int ifd_keyfile_parse_pair(const char *text, const char *source, char pub[IFD_KEY_Z85_LEN + 1],
                           char sec[IFD_KEY_Z85_LEN + 1], ifd_error *err);
/* Parses a public key file's text: exactly one key line. A key pair file is refused (a
 * secret key is not to be handed around). */
int ifd_keyfile_parse_public(const char *text, const char *source, char pub[IFD_KEY_Z85_LEN + 1],
                             ifd_error *err);

/* Read and parse. what names the setting ("server_key_file"). */
int ifd_keyfile_load_pair(const char *path, const char *what, char pub[IFD_KEY_Z85_LEN + 1],
                          char sec[IFD_KEY_Z85_LEN + 1], ifd_error *err);
int ifd_keyfile_load_public(const char *path, const char *what, char pub[IFD_KEY_Z85_LEN + 1],
                            ifd_error *err);

/* Writes a fresh key pair to PREFIX.key (mode 0600) and PREFIX.pub (mode 0644); refuses to
 * overwrite either (IFD_EINVAL, naming the file) and leaves neither behind on an error. pub, when
 * not NULL, gets the public key. IFD_ENOTSUP when libzmq has no CURVE. */
int ifd_keyfile_generate(const char *prefix, char pub[IFD_KEY_Z85_LEN + 1], ifd_error *err);

/* Splits text into lines in place ('\n', a '\r' before it dropped): calls fn with each line (NUL
 * terminated, leading and trailing blanks removed) and its number from 1; stops at fn's first
 * non-zero return and returns it. */
int ifd_keyfile_lines(char *text, int (*fn)(void *arg, char *line, int lineno), void *arg);

#endif
