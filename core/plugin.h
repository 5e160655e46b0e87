/*
 * Opening a plugin: a shared library that defines an ABI version symbol (an unsigned) and an
 * entry point, loaded with dlopen. Program libraries (device/program.c, --program-lib) and host
 * call libraries (outfeed/, --host-call-lib) share it; each kind names its symbols, its ABI and
 * where a plugin author reads about it, so that every refusal is one sentence naming the file.
 */
#ifndef IFD_CORE_PLUGIN_H
#define IFD_CORE_PLUGIN_H

#include <infeed/error.h>

typedef struct ifd_plugin_kind {
    const char *what;        /* "program library" */
    const char *abi_symbol;  /* "ifd_program_plugin_abi" */
    const char *init_symbol; /* "ifd_program_plugin_init" */
    const char *macro;       /* "IFD_PROGRAM_PLUGIN" */
    const char *header;      /* "include/infeed/program.h" */
    const char *abi_name;    /* "program ABI" */
    unsigned abi_version;    /* the loader's */
    const char *registers;   /* what its entry point registers: "program" */
} ifd_plugin_kind;

#define IFD_PLUGIN_SET_MAX 16

/* The libraries of one kind loaded so far (their handles, kept for the process's life). */
typedef struct ifd_plugin_set {
    void *handles[IFD_PLUGIN_SET_MAX];
    int n;
} ifd_plugin_set;

/* Calls a plugin's entry point with the kind's registry (arg: the caller's pending classes):
 * returns the entry point's code, its sentence in *perr, and in *refused the first class the
 * registry refused (code IFD_OK: none) and in *registered how many it accepted. */
typedef int (*ifd_plugin_run_fn)(void *entry, void *arg, ifd_error *perr, const ifd_error **refused,
                                 int *registered);

/* Opens path (dlopen, RTLD_NOW | RTLD_LOCAL; a name without '/' is taken from the current
 * folder, not the library path), finds its two symbols and checks its ABI version. On success
 * *handle is the dlopen handle (the caller dlcloses it) and *init the entry point. IFD_EINVAL
 * with a sentence naming path when the name is empty, the file cannot be loaded (the loader's
 * own text), a symbol is missing or the version differs (both versions named). */
int ifd_plugin_open(const ifd_plugin_kind *k, const char *path, void **handle, void **init,
                    ifd_error *err);

/* Opens path (ifd_plugin_open) and, unless set has it already (then *fresh is 0 and nothing
 * runs), runs its entry point through run. One sentence naming path when set is full, a class
 * was refused, the entry point failed or registered nothing; then the library is closed. On
 * success (*fresh 1) set keeps it: the caller registers its pending classes. */
int ifd_plugin_load(const ifd_plugin_kind *k, ifd_plugin_set *set, const char *path,
                    ifd_plugin_run_fn run, void *arg, int *fresh, ifd_error *err);

#endif
