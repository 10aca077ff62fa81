/* send/recv on the shm backend: one byte ring per ordered pair of ranks.
 *
 * The sender writes a 64-byte header (sequence number, count, dtype) and
 * then the payload, as fast as the ring has room; the receiver checks the
 * header against what it posted (a different count or dtype fails the group
 * with DT_ERR_MISMATCH on both sides) and drains the payload. head and tail
 * are running byte counters (head - tail bytes are in the ring); each side
 * sleeps on the channel's futex word when the ring is full or empty.
 * Messages between a pair are delivered in posting order.
 *
 * Two ways to drive a channel: dt__shm_p2p blocks until the message is
 * through (one operation at a time), and the nonblocking slots
 * (dt__shm_p2p_start/test/idle) move whatever fits and return, so the group
 * layer can keep a whole batch in flight (a ring of 64 MiB sends through
 * 256 KiB rings completes because every rank also drains its receives).
 * Every move rings the peer's bell (its rank block) as well as the
 * channel's futex word: a batch sleeps on its own bell, which any of its
 * channels can ring, while a blocking wait sleeps on the one channel.
 * dt__shm_p2p_wake rings this rank's own bell: a batch napping on it on
 * another thread returns (a waiter takes the batch over). */
#include "comm/shm/shm.h"

#include "base/cpu_cached.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define P2P_MAGIC 0x70327064u

typedef struct {
    uint32_t magic, dtype;
    uint64_t seq, count;
    char pad[64 - 24];
} p2p_hdr;
_Static_assert(sizeof(p2p_hdr) == 64, "header is one cache line");

/* The header a receiver read against the recv it posted. */
static dt_status check_hdr(shm_ctx *s, const dt_coll *c, const p2p_hdr *h)
{
    if (h->magic == P2P_MAGIC && h->seq == c->seq && h->count == c->count &&
        h->dtype == (uint32_t)c->dtype)
        return DT_OK;
    char msg[400];
    snprintf(msg, sizeof msg,
             "send/recv mismatch: rank %d sent message #%llu (count=%llu, %s) to rank %d, "
             "which posted recv #%llu (count=%zu, %s)",
             c->root, (unsigned long long)h->seq, (unsigned long long)h->count,
             h->dtype < DT_DTYPE_COUNT ? dt_dtype_name((dt_dtype)h->dtype) : "?", s->rank,
             (unsigned long long)c->seq, c->count, dt_dtype_name(c->dtype));
    return dt__shm_abort(s, DT_ERR_MISMATCH, msg);
}

static void fill_hdr(const dt_coll *c, p2p_hdr *h)
{
    memset(h, 0, sizeof *h);
    h->magic = P2P_MAGIC;
    h->dtype = (uint32_t)c->dtype;
    h->seq = c->seq;
    h->count = c->count;
}

static dt_status chan_write_blocking(shm_ctx *s, shm_chan *ch, const char *src, size_t bytes, int peer)
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
        shm_moved(s, s->rank, peer, n);
        atomic_store_explicit(&ch->head, head + n, memory_order_release);
        dt__shm_chan_notify(ch);
        dt__shm_bell_ring(s, peer);
        src += n;
        bytes -= n;
    }
    return DT_OK;
}

static dt_status chan_read_blocking(shm_ctx *s, shm_chan *ch, char *dst, size_t bytes, int peer)
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
        dt__shm_bell_ring(s, peer);
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
        fill_hdr(c, &h);
        dt_status st = chan_write_blocking(s, ch, (const char *)&h, sizeof h, peer);
        if (st == DT_OK)
            st = chan_write_blocking(s, ch, c->send, bytes, peer);
        return st;
    }
    shm_chan *ch = shm_chan_at(s, peer, s->rank);
    p2p_hdr h;
    dt_status st = chan_read_blocking(s, ch, (char *)&h, sizeof h, peer);
    if (st < 0)
        return st;
    st = check_hdr(s, c, &h);
    if (st < 0)
        return st;
    return chan_read_blocking(s, ch, c->recv, bytes, peer);
}

/* ---- nonblocking: one message as a byte stream (header, then payload) ---- */

typedef struct {
    dt_coll c;
    shm_chan *ch;
    p2p_hdr h;         /* send: the header to write; recv: the header read */
    uint64_t done;     /* bytes of header + payload moved */
    uint64_t total;
    double next_check; /* next liveness check while stalled */
} shm_p2p_op;

/* Where byte k of the stream lives. */
static char *stream_at(shm_p2p_op *o, uint64_t k, size_t *run)
{
    if (k < sizeof o->h) {
        *run = sizeof o->h - (size_t)k;
        return (char *)&o->h + k;
    }
    *run = (size_t)(o->total - k);
    char *base = o->c.kind == DT_COLL_SEND ? (char *)o->c.send : (char *)o->c.recv;
    return base + (k - sizeof o->h);
}

dt_status dt__shm_p2p_start(void *ctx, const dt_coll *c, void **op)
{
    shm_ctx *s = ctx;
    *op = NULL;
    shm_p2p_op *o = calloc(1, sizeof *o);
    if (!o)
        return dt_error(DT_ERR_NO_MEMORY, "shm: out of memory starting %s",
                        dt_coll_kind_name(c->kind));
    o->c = *c;
    int send = c->kind == DT_COLL_SEND;
    o->ch = send ? shm_chan_at(s, s->rank, c->root) : shm_chan_at(s, c->root, s->rank);
    if (send)
        fill_hdr(c, &o->h);
    o->total = sizeof o->h + (uint64_t)c->count * dt_dtype_size(c->dtype);
    o->next_check = dt_time_s() + 0.1;
    *op = o;
    return DT_OK;
}

/* Move what fits; returns bytes moved. */
static uint64_t move_some(shm_ctx *s, shm_p2p_op *o)
{
    size_t cap = s->chan_bytes;
    char *ring = shm_chan_ring(o->ch);
    int send = o->c.kind == DT_COLL_SEND;
    uint64_t moved = 0;
    while (o->done < o->total) {
        uint64_t head, tail;
        size_t room;
        if (send) {
            head = atomic_load_explicit(&o->ch->head, memory_order_relaxed);
            tail = atomic_load_explicit(&o->ch->tail, memory_order_acquire);
            room = cap - (size_t)(head - tail);
        } else {
            tail = atomic_load_explicit(&o->ch->tail, memory_order_relaxed);
            head = atomic_load_explicit(&o->ch->head, memory_order_acquire);
            room = (size_t)(head - tail);
        }
        if (room == 0)
            break;
        uint64_t at = send ? head : tail;
        size_t pos = (size_t)(at % cap), run;
        char *p = stream_at(o, o->done, &run);
        size_t n = room < run ? room : run;
        if (n > cap - pos)
            n = cap - pos;
        if (send) {
            memcpy(ring + pos, p, n);
            shm_moved(s, s->rank, o->c.root, n);
            atomic_store_explicit(&o->ch->head, head + n, memory_order_release);
        } else {
            memcpy(p, ring + pos, n);
            atomic_store_explicit(&o->ch->tail, tail + n, memory_order_release);
        }
        o->done += n;
        moved += n;
    }
    if (moved) {
        dt__shm_chan_notify(o->ch);
        dt__shm_bell_ring(s, o->c.root);
    }
    return moved;
}

dt_status dt__shm_p2p_test(void *ctx, void *op, int *progressed)
{
    shm_ctx *s = ctx;
    shm_p2p_op *o = op;
    if (!progressed) { /* abandon */
        free(o);
        return DT_OK;
    }
    if (!s->bell_armed) { /* before looking at any ring: a later move changes the bell */
        s->bell_snap = atomic_load(&shm_rank_at(s, s->rank)->bell);
        s->bell_armed = 1;
    }
    int hdr_before = o->done >= sizeof o->h;
    uint64_t moved = move_some(s, o);
    *progressed = moved > 0;
    dt_status st = DT_INPROGRESS;
    if (o->c.kind == DT_COLL_RECV && !hdr_before && o->done >= sizeof o->h &&
        check_hdr(s, &o->c, &o->h) < 0)
        st = DT_ERR_MISMATCH;
    if (st == DT_INPROGRESS && o->done == o->total)
        st = DT_OK;
    if (st == DT_INPROGRESS && !moved) {
        double now = dt_time_s();
        if (now >= o->next_check) {
            o->next_check = now + 0.1;
            st = dt__shm_check_peer(s, &o->c, o->c.root);
            if (st == DT_OK)
                st = DT_INPROGRESS;
        }
    }
    if (st != DT_INPROGRESS)
        free(o);
    return st;
}

void dt__shm_p2p_idle(void *ctx, int round, double max_s)
{
    shm_ctx *s = ctx;
    if (round < 4 && dt__cpu_yield(&s->yield_off_until))
        return;
    if (s->bell_armed)
        dt__shm_bell_wait(s, s->bell_snap, max_s);
    s->bell_armed = 0;
}

void dt__shm_p2p_wake(void *ctx)
{
    shm_ctx *s = ctx;
    dt__shm_bell_ring(s, s->rank);
}
