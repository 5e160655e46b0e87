/*
 * libinfeed: the runtime, usable in-process with no network.
 *
 * A session owns a device backend with R replicas, an infeed controller thread that takes
 * batches from a batch source and shards them to the replicas, an outfeed controller thread that
 * turns every step's outfeed into metrics and JSON summaries, and the hooks that decide how long
 * each device loop runs and when the run ends. ifd_session_run drives it all from the calling
 * thread:
 *
 *   begin -> after_create_session -> { before_run -> device loop of n steps -> after_run }* -> end
 *
 * Threading: a session is driven by one thread; ifd_session_request_stop may be called from any
 * thread. Batch sources and sinks are borrowed and must outlive the session.
 */
#ifndef IFD_INFEED_H
#define IFD_INFEED_H

/* The runtime by subject; this header includes them all. */
#include <infeed/batches.h>
#include <infeed/error.h>
#include <infeed/hooks.h>
#include <infeed/logging.h>
#include <infeed/modes.h>
#include <infeed/program.h>
#include <infeed/run_config.h>
#include <infeed/session.h>
#include <infeed/sinks.h>
#include <infeed/tensor.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IFD_VERSION_STRING "0.1.0"

#ifdef __cplusplus
}
#endif

#endif
