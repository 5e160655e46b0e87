/*
 * infeedd's hosts (infeed/hosts.h) over MPI, when infeedd was built with it (IFD_HAVE_MPI) and
 * started by an MPI launcher (mpirun, srun): docs/multihost.md.
 *
 * ifd_daemon_hosts_init runs before anything else in main: it calls MPI_Init_thread (asking for
 * MPI_THREAD_MULTIPLE: the replica, outfeed and session threads each own a channel) only when the
 * environment says an MPI launcher started the process, so a plain `infeedd` never touches MPI.
 * Without MPI, or outside a launcher, the job is one host: rank 0 of 1.
 */
#ifndef IFD_HOST_HOSTS_H
#define IFD_HOST_HOSTS_H

#include <infeed/hosts.h>

/* Fills *out (rank, size and, with several hosts, the MPI collectives). IFD_OK, or an error for
 * an MPI that cannot start or lacks thread support. */
int ifd_daemon_hosts_init(ifd_hosts *out, int *argc, char ***argv, ifd_error *err);
/* Ends every host's process at once (MPI_Abort), with this exit code; no-op with one host. */
void ifd_daemon_hosts_abort(const ifd_hosts *h, int code);
/* MPI_Finalize (when MPI was started). */
void ifd_daemon_hosts_fini(ifd_hosts *h);

/* Replaces every "{rank}" in s by rank: a new string (malloc), or NULL when s has none or is
 * NULL (then s stands as it is). */
char *ifd_daemon_hosts_subst(const char *s, int rank);

#endif
