/*
 * The folder of a user's private infeed endpoints, which infeedd (its default --control) and
 * infeedctl (its default --control) agree on: $RUNTIME_DIRECTORY when set (systemd's folder of
 * a service with RuntimeDirectory=, as the packaged units have), else $XDG_RUNTIME_DIR/infeed
 * when XDG_RUNTIME_DIR is an absolute path (systemd's per-user runtime folder, /run/user/UID,
 * mode 0700), else /tmp/infeed-UID (the effective user's id). The daemon creates it with mode
 * 0700 and refuses one that another user owns or others may enter (host/endpoint.h).
 */
#ifndef IFD_CORE_USERDIR_H
#define IFD_CORE_USERDIR_H

#include <stddef.h>

/* The folder, always terminated (truncated to len - 1 bytes). */
void ifd_user_dir(char *buf, size_t len);
/* The default control endpoint: ipc://<ifd_user_dir>/control. */
void ifd_default_control(char *buf, size_t len);

#endif
