/* send/recv on the shm backend: one byte ring per ordered pair of ranks.
 *
 * The sender writes a 64-byte header (sequence number, count, dtype) and
 * then the payload, as fast as the ring has room; the receiver checks the
 * header against what it posted (a different count or dtype fails the group
 * with DT_ERR_MISMATCH on both sides) and drains the payload. head and tail
 * are running byte counters (head - tail bytes are in the ring); each side
 * sleeps on the channel's futex word when the ring is full or empty.
 * Messages between a pair are delivered in posting order. */
#include "comm/shm/shm.h"

#include <stdio.h>
#include <string.h>

#define P2P_MAGIC 0x70327064u

typedef struct {
    uint32_t magic, dtype;
    uint64_t seq, count;
    char pad[64 - 24];
} p2p_hdr;
_Static_assert(sizeof(p2p_hdr) == 64, "header is one cache line");

static dt_status chan_write(shm_ctx *s, shm_chan *ch, const char *src, size_t bytes, int peer)
{
    size_t cap = s->chan_bytes;
    char *ring = shm_chan_ring(ch);
    while (bytes) {
        uint64_t head = atomic_load_explicit(&ch->head, memory_order_relaxed);
        dt_status st = dt__shm_wait_chan(s, ch, &ch->tail, head + 1 > cap ? head + 1 - cap : 0,
                                         peer, "send");
        if (st < 0)
            return st;
        uint64_t tail = atomic_load_explicit(&ch->tail, memory_order_acquire);
        size_t space = cap - (size_t)(head - tail), pos = (size_t)(head % cap);
        size_t n = bytes < space ? bytes : space;
        if (n > cap - pos)
            n = cap - pos;
        memcpy(ring + pos, src, n);
        atomic_store_explicit(&ch->head, head + n, memory_order_release);
        dt__shm_chan_notify(ch);
        src += n;
        bytes -= n;
    }
    return DT_OK;
}

static dt_status chan_read(shm_ctx *s, shm_chan *ch, char *dst, size_t bytes, int peer)
{
    size_t cap = s->chan_bytes;
    const char *ring = shm_chan_ring(ch);
    while (bytes) {
        uint64_t tail = atomic_load_explicit(&ch->tail, memory_order_relaxed);
        dt_status st = dt__shm_wait_chan(s, ch, &ch->head, tail + 1, peer, "recv");
        if (st < 0)
            return st;
        uint64_t head = atomic_load_explicit(&ch->head, memory_order_acquire);
        size_t avail = (size_t)(head - tail), pos = (size_t)(tail % cap);
        size_t n = bytes < avail ? bytes : avail;
        if (n > cap - pos)
            n = cap - pos;
        memcpy(dst, ring + pos, n);
        atomic_store_explicit(&ch->tail, tail + n, memory_order_release);
        dt__shm_chan_notify(ch);
        dst += n;
        bytes -= n;
    }
    return DT_OK;
}

dt_status dt__shm_p2p(shm_ctx *s, const dt_coll *c)
{
    size_t bytes = c->count * dt_dtype_size(c->dtype);
    int peer = c->root;
    if (c->kind == DT_COLL_SEND) {
        shm_chan *ch = shm_chan_at(s, s->rank, peer);
        p2p_hdr h;
        memset(&h, 0, sizeof h);
        h.magic = P2P_MAGIC;
        h.dtype = (uint32_t)c->dtype;
        h.seq = c->seq;
        h.count = c->count;
        dt_status st = chan_write(s, ch, (const char *)&h, sizeof h, peer);
        if (st == DT_OK)
            st = chan_write(s, ch, c->send, bytes, peer);
        return st;
    }
    shm_chan *ch = shm_chan_at(s, peer, s->rank);
    p2p_hdr h;
    dt_status st = chan_read(s, ch, (char *)&h, sizeof h, peer);
    if (st < 0)
        return st;
    if (h.magic != P2P_MAGIC || h.seq != c->seq || h.count != c->count ||
        h.dtype != (uint32_t)c->dtype) {
        char msg[400];
        snprintf(msg, sizeof msg,
                 "send/recv mismatch: rank %d sent message #%llu (count=%llu, %s) to rank %d, "
                 "which posted recv #%llu (count=%zu, %s)",
                 peer, (unsigned long long)h.seq, (unsigned long long)h.count,
                 h.dtype < DT_DTYPE_COUNT ? dt_dtype_name((dt_dtype)h.dtype) : "?", s->rank,
                 (unsigned long long)c->seq, c->count, dt_dtype_name(c->dtype));
        return dt__shm_abort(s, DT_ERR_MISMATCH, msg);
    }
    return chan_read(s, ch, c->recv, bytes, peer);
}
