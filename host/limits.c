#include "host/limits.h"

size_t ifd_router_max_frame(size_t largest_tensor_bytes)
{
    return largest_tensor_bytes > IFD_HELLO_MAX ? largest_tensor_bytes : IFD_HELLO_MAX;
}

int ifd_router_sndhwm(int credit)
{
    return 2 * credit + 16;
}

int ifd_outbox_max(int credit)
{
    return 2 * ifd_router_sndhwm(credit);
}

size_t ifd_memory_bound(const ifd_memory_terms *t)
{
    size_t batches = (size_t)t->max_producers * (size_t)t->credit * 2 * t->batch_bytes;
    size_t ingest = (size_t)IFD_ROUTER_RCVHWM * (size_t)(t->tensors + 2) * t->max_frame +
                    (size_t)(ifd_router_sndhwm(t->credit) + ifd_outbox_max(t->credit)) * 512 +
                    IFD_CONN_COST;
    size_t control = (size_t)IFD_CONTROL_HWM * IFD_CONTROL_MAXMSGSIZE + IFD_CONN_COST;
    size_t publish = (size_t)IFD_PUB_SUBS_HELD * IFD_SUB_COST + IFD_CONN_COST;
    return IFD_BASE_MEMORY + batches + (size_t)t->conns_ingest * ingest +
           (size_t)t->conns_control * control + (size_t)t->conns_publish * publish +
           (size_t)(IFD_OUTBOX_MAX + IFD_PUB_SNDHWM) * IFD_SUMMARY_MAX;
}

size_t ifd_shm_bound(const ifd_memory_terms *t, int max_steps)
{
    size_t pool = (size_t)(t->credit + max_steps - 1) * t->batch_bytes +
                  (size_t)64 * (size_t)(t->tensors + 1) + 4096;
    return 2 * (size_t)t->max_producers * pool;
}
