/*
 * The host call ABI: metrics of your own, in C, from a plugin (infeedd --host-call-lib PATH.so).
 *
 * TPUEstimator's host_call and eval_metrics hand a function, run on the host, the tensors every
 * step outfeeds, concatenated over the replicas along axis 0. A host call class here is that
 * function: it names the outfeed tensors it takes (the program's and the runtime's: docs/
 * summaries.md, "Outfeed tensors"), gets each step's concatenated tensors in host memory on the
 * outfeed thread, and gives back its values as a JSON object, which lands in the summaries under
 * "host_calls" and its class name. In train mode a summary covers the steps since the last one;
 * in eval mode one summary covers the whole eval (the seed's eval_metrics). With several hosts
 * the tensors are concatenated across hosts too (in rank order), so every host computes the
 * same values.
 *
 * A plugin defines its entry point with IFD_HOST_CALL_PLUGIN, which registers its classes;
 * examples/host_call/ is one built out of infeed's tree with its CMake package. A class whose
 * tensors the run's program does not outfeed is refused at start with a sentence naming them.
 */
#ifndef IFD_HOST_CALL_H
#define IFD_HOST_CALL_H

#include <infeed/error.h>
#include <infeed/tensor.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* IFD_HOST_CALL_ABI_VERSION changes whenever ifd_host_call_class, ifd_host_call_info or the
 * registry change in a way a built plugin would notice; a plugin built for another version is
 * refused. */
#define IFD_HOST_CALL_ABI_VERSION 1
#define IFD_HOST_CALL_MAX_TENSORS 8

/* What a host call is told at its start. */
typedef struct ifd_host_call_info {
    const char *mode;    /* "train" or "eval" */
    const char *program; /* the program's name */
    int64_t classes;     /* the program's classes setting (0: not set) */
    int replicas;        /* on this host */
    int hosts;
} ifd_host_call_info;

typedef struct ifd_host_call_class {
    const char *name; /* its key under "host_calls" in the summaries */
    /* The outfeed tensors it takes, in the order step receives them: ntensors names. */
    int ntensors;
    const char *tensors[IFD_HOST_CALL_MAX_TENSORS];
    /* Creates its state (*state may stay NULL). An error refuses the run at its start. */
    int (*init)(void **state, const ifd_host_call_info *info, ifd_error *err);
    /* One step: its tensors concatenated over the replicas (and hosts), in host memory, valid
     * during the call only; tensors[i].shape.dims[0] is the rows of the step (a per-step value:
     * the replicas). An error ends the run, named "outfeed: host call NAME: ...". */
    int (*step)(void *state, int64_t global_step, const ifd_tensor *tensors, ifd_error *err);
    /* Writes its values since the last summary as a JSON object (text, NUL-terminated) into
     * json (len bytes), and starts over. IFD_ERANGE when it does not fit. */
    int (*summary)(void *state, char *json, size_t len, ifd_error *err);
    void (*destroy)(void *state); /* optional */
} ifd_host_call_class;

typedef struct ifd_host_call_registry ifd_host_call_registry;
struct ifd_host_call_registry {
    unsigned abi_version; /* the loader's IFD_HOST_CALL_ABI_VERSION */
    void *ctx;
    /* Registers cls, which must stay valid as long as the process lives. IFD_EINVAL with a
     * sentence when a field it needs is missing or the name is taken. */
    int (*add)(ifd_host_call_registry *reg, const ifd_host_call_class *cls, ifd_error *err);
};

typedef int (*ifd_host_call_plugin_init_fn)(ifd_host_call_registry *reg, ifd_error *err);

#define IFD_HOST_CALL_PLUGIN_ABI_SYMBOL "ifd_host_call_plugin_abi"
#define IFD_HOST_CALL_PLUGIN_INIT_SYMBOL "ifd_host_call_plugin_init"

#ifdef __cplusplus
#define IFD_HOST_CALL_LINKAGE_ extern "C"
#else
#define IFD_HOST_CALL_LINKAGE_
#endif
/* Defines a plugin's entry point around init_fn (an ifd_host_call_plugin_init_fn). Write it
 * once, at file scope, in one source file of the plugin. */
#define IFD_HOST_CALL_PLUGIN(init_fn)                                                              \
    IFD_HOST_CALL_LINKAGE_ __attribute__((visibility("default")))                                  \
    const unsigned ifd_host_call_plugin_abi = IFD_HOST_CALL_ABI_VERSION;                           \
    IFD_HOST_CALL_LINKAGE_ __attribute__((visibility("default"))) int ifd_host_call_plugin_init(   \
        ifd_host_call_registry *reg, ifd_error *err);                                              \
    IFD_HOST_CALL_LINKAGE_ int ifd_host_call_plugin_init(ifd_host_call_registry *reg,              \
                                                         ifd_error *err)                           \
    {                                                                                              \
        return init_fn(reg, err);                                                                  \
    }

/* Loads the plugin at path and registers its classes (infeedd's --host-call-lib). One sentence
 * in err naming path when the file cannot be loaded, has no entry point, is built for another
 * ABI version, registers nothing, a class without name, step or summary, or a name taken.
 * Loading the same file again does nothing. Not thread-safe: load before creating sessions. */
int ifd_host_call_load_plugin(const char *path, ifd_error *err);
/* The registered classes, in the order they were registered. */
int ifd_host_call_count(void);
const ifd_host_call_class *ifd_host_call_get(int i);

#ifdef __cplusplus
}
#endif

#endif
