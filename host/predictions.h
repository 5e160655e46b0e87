/*
 * infeedd --predictions PATH: every prediction of a predict run, one JSON object per row, in
 * the order the batches ran (docs/summaries.md gives the fields).
 */
#ifndef IFD_HOST_PREDICTIONS_H
#define IFD_HOST_PREDICTIONS_H

#include <infeed/infeed.h>

typedef struct ifd_predictions_file ifd_predictions_file;

/* Creates (truncates) path. The error names the path and the system's reason. */
int ifd_predictions_file_open(ifd_predictions_file **out, const char *path, ifd_error *err);
/* The sink to add to the session; valid until close. */
ifd_prediction_sink ifd_predictions_file_sink(ifd_predictions_file *f);
/* Flushes and closes; IFD_OK or the write error. NULL is a no-op. */
int ifd_predictions_file_close(ifd_predictions_file *f, ifd_error *err);

#endif
