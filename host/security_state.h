/*
 * The daemon's CURVE security, inside host/: the state host/security.c (keys, names) and
 * host/zap.c (the ZAP handler's thread) share. Not for other files.
 */
#ifndef IFD_HOST_SECURITY_STATE_H
#define IFD_HOST_SECURITY_STATE_H

#include "core/thread.h"
#include "core/wire.h"
#include "host/security.h"

#include <stdint.h>

/* A DRAFT option in libzmq 4.3's header, implemented by the library: a CURVE socket then refuses
 * every peer while no ZAP handler is bound, instead of accepting every one. */
#ifndef ZMQ_ZAP_ENFORCE_DOMAIN
#define ZMQ_ZAP_ENFORCE_DOMAIN 93
#endif

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define NAME_LEN (IFD_PROTO_NAME_MAX + 1)
#define LOG_INTERVAL_NS 1000000000LL

typedef struct key_entry {
    uint8_t key[IFD_KEY_BIN_LEN];
    char z85[IFD_KEY_Z85_LEN + 1];
    char (*names)[NAME_LEN]; /* the names this key is bound to; none: any name not bound */
    int nnames;
    int line;
} key_entry;

typedef struct key_list {
    key_entry *v;
    int n, cap;
} key_list;

typedef struct refusal_log {
    int64_t last_ns; /* when the last line was written; 0: never */
    uint64_t suppressed;
} refusal_log;

struct ifd_security {
    char pub[IFD_KEY_Z85_LEN + 1];
    uint8_t secret[IFD_KEY_BIN_LEN];
    key_list authorized, admin;
    /* the ZAP handler: its socket is used only by its thread once started */
    void *zap;
    int wake[2]; /* a pipe: a byte written to wake[1] stops the handler */
    ifd_thread thread;
    int started;
    refusal_log log[IFD_SOCK_ROLES];
    uint64_t refused[IFD_SOCK_ROLES]; /* atomic */
};

/* The ZAP domain of each socket role, its name in log lines and which list admits it. */
extern const char *const ifd_zap_domains[IFD_SOCK_ROLES];
extern const char *const ifd_role_names[IFD_SOCK_ROLES];
extern const char *const ifd_role_wants[IFD_SOCK_ROLES];

/* The entry of a 32-byte key in a list, or NULL. */
const key_entry *ifd_keys_find_bin(const key_list *l, const uint8_t *key);

#endif
