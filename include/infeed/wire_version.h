/*
 * The version of the ingest wire protocol (docs/protocol.md, "Versioning"): its one definition,
 * used by the C client (infeed/client.h), the daemon and the header codec (core/wire.h).
 */
#ifndef IFD_WIRE_VERSION_H
#define IFD_WIRE_VERSION_H

#define IFD_PROTOCOL_VERSION 1

#endif
