/*
 * Summaries (outfeed/summary.c): the sinks a run's JSON summaries go to, written by the outfeed
 * thread while the run goes and by the session (loop/) for the last line.
 */
#ifndef IFD_OUTFEED_SUMMARY_H
#define IFD_OUTFEED_SUMMARY_H

#include <infeed/infeed.h>

#include <jansson.h>

typedef struct ifd_summary_writer {
    ifd_sink *sinks[IFD_MAX_SINKS];
    int nsinks;
    int hosts; /* > 1: every summary gets "host": host (this host's rank) */
    int host;
} ifd_summary_writer;

int ifd_summary_writer_add(ifd_summary_writer *w, ifd_sink *sink);
/* Dumps obj (compact, one line) to every sink, then releases obj (steals the reference). The
 * first failing sink's error is returned; the other sinks still get the summary. */
int ifd_summary_emit(ifd_summary_writer *w, json_t *obj, ifd_error *err);
int ifd_summary_flush(ifd_summary_writer *w, ifd_error *err);

#endif
