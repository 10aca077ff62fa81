/* Waiting, waking, aborting and noticing dead peers.
 *
 * A wait spins (s->spin iterations with a pause), then, when the ranks on
 * this machine have a core each and the waiting thread is not a progress
 * thread running in the background while its rank computes
 * (dt__comm_may_poll), busy-polls for s->spin_s seconds (checking
 * the abort record, the deadline and peer liveness as the sleeping loop
 * does), then yields a few times (dt__cpu_yield: not after a yield gave
 * the core away for a time slice), then sleeps on the peer's futex word
 * for at most 50 ms at a time. The
 * signaller bumps its word after every tick and calls FUTEX_WAKE only when
 * someone registered as a sleeper (waiters > 0): the waiter increments
 * `waiters` before re-checking the condition and sleeping, the signaller
 * stores the tick before reading `waiters` (both sequentially consistent),
 * so a wake-up cannot be lost. With 8 ranks on 2 cores the spin budget is
 * small and sleeping ranks leave the CPU to the ones doing work.
 *
 * Between sleeps a waiter checks, in this order: the group's abort record
 * (another rank failed the group: return its status), the operation's
 * deadline (DT_ERR_TIMEOUT naming the ranks that have not reached the
 * step), and every ~100 ms the liveness of every peer: a pidfd that polls
 * readable means the process ended (zombies included, unlike kill(pid, 0));
 * without pidfd_open we read /proc/<pid>/stat. A dead peer, or one that
 * left with dt_pg_free while we still wait for it, fails the group with
 * DT_ERR_PEER_FAILED. */
#include "comm/shm/shm.h"

#include "base/cpu_cached.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

static void futex_wait(_Atomic uint32_t *addr, uint32_t val, long ns)
{
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void bump_and_wake(_Atomic uint32_t *word, _Atomic uint32_t *waiters)
{
    atomic_fetch_add(word, 1);
    if (atomic_load(waiters))
        futex_wake(word);
}

void dt__shm_signal(shm_ctx *s, uint32_t step)
{
    shm_rank *me = shm_rank_at(s, s->rank);
    atomic_store(&me->tick, shm_tick_of(s->cur_seq, step));
    bump_and_wake(&me->word, &me->waiters);
}

void dt__shm_chan_notify(shm_chan *c) { bump_and_wake(&c->word, &c->waiters); }

void dt__shm_bell_ring(shm_ctx *s, int r)
{
    shm_rank *k = shm_rank_at(s, r);
    bump_and_wake(&k->bell, &k->bell_waiters);
}

void dt__shm_bell_wait(shm_ctx *s, uint32_t snap, double max_s)
{
    shm_rank *me = shm_rank_at(s, s->rank);
    atomic_fetch_add(&me->bell_waiters, 1);
    if (atomic_load(&me->bell) == snap)
        futex_wait(&me->bell, snap, (long)(max_s * 1e9) + 1000);
    atomic_fetch_sub(&me->bell_waiters, 1);
}

dt_status dt__shm_check_abort(shm_ctx *s)
{
    int32_t st = atomic_load_explicit(&s->hdr->abort_st, memory_order_acquire);
    if (st == 0)
        return DT_OK;
    /* the message is written before abort_st is published */
    return dt_error((dt_status)st, "%s", s->hdr->abort_msg);
}

dt_status dt__shm_abort(shm_ctx *s, dt_status st, const char *msg)
{
    uint32_t expect = 0;
    if (atomic_compare_exchange_strong(&s->hdr->abort_lock, &expect, 1)) {
        snprintf(s->hdr->abort_msg, sizeof s->hdr->abort_msg, "%s", msg);
        s->hdr->abort_rank = s->rank;
        atomic_store_explicit(&s->hdr->abort_st, (int32_t)st, memory_order_release);
        for (int r = 0; r < s->size; r++) {
            shm_rank *k = shm_rank_at(s, r);
            bump_and_wake(&k->word, &k->waiters);
        }
        for (int a = 0; a < s->size; a++)
            for (int b = 0; b < s->size; b++)
                if (a != b) {
                    shm_chan *c = shm_chan_at(s, a, b);
                    bump_and_wake(&c->word, &c->waiters);
                }
        return dt_error(st, "%s", msg);
    }
    /* Someone else failed the group first: report theirs. */
    while (atomic_load_explicit(&s->hdr->abort_st, memory_order_acquire) == 0)
        cpu_relax();
    return dt__shm_check_abort(s);
}

void dt__shm_liveness_init(shm_ctx *s)
{
    for (int r = 0; r < s->size; r++) {
        s->pidfd[r] = -1;
        if (r == s->rank)
            continue;
#ifdef SYS_pidfd_open
        int32_t pid = atomic_load(&shm_rank_at(s, r)->pid);
        long fd = syscall(SYS_pidfd_open, (pid_t)pid, 0);
        s->pidfd[r] = fd >= 0 ? (int)fd : -1;
#endif
    }
}

/* 1 if rank r's process has ended (or its pid is gone). */
static int peer_dead(shm_ctx *s, int r)
{
    if (s->pidfd[r] >= 0) {
        struct pollfd pf = {.fd = s->pidfd[r], .events = POLLIN};
        return poll(&pf, 1, 0) > 0 && (pf.revents & (POLLIN | POLLHUP | POLLERR));
    }
    char path[64], buf[256];
    int32_t pid = atomic_load(&shm_rank_at(s, r)->pid);
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return !p || p[1] == '\0' || p[2] == 'Z' || p[2] == 'X';
}

static const char *op_name(shm_ctx *s, char *buf, size_t n)
{
    if (!s->cur)
        return "group set-up";
    dt_coll c = *s->cur;
    if (c.kind != DT_COLL_SEND && c.kind != DT_COLL_RECV)
        c.seq = s->cur_seq - 1; /* the group layer's numbering */
    return dt__coll_describe(&c, buf, n);
}

/* Check peers; fail the group if one died, or if `waiting_for` left. */
static dt_status check_peers(shm_ctx *s, int waiting_for)
{
    for (int r = 0; r < s->size; r++) {
        if (r == s->rank)
            continue;
        uint32_t state = atomic_load(&shm_rank_at(s, r)->state);
        int left = state == SHM_STATE_LEFT;
        if (left && r != waiting_for)
            continue; /* finished cleanly; only a problem if we need it */
        if (left || peer_dead(s, r)) {
            char d[160], msg[512];
            snprintf(msg, sizeof msg,
                     "rank %d (pid %d) %s while rank %d was in %s; the group is failed",
                     r, (int)atomic_load(&shm_rank_at(s, r)->pid),
                     left ? "left the group (dt_pg_free)" : "died (exited or was killed)",
                     s->rank, op_name(s, d, sizeof d));
            return dt__shm_abort(s, DT_ERR_PEER_FAILED, msg);
        }
    }
    return DT_OK;
}

typedef int (*pred_fn)(shm_ctx *s, const void *a, uint64_t b);

static int pred_tick(shm_ctx *s, const void *a, uint64_t target)
{
    (void)s;
    return atomic_load_explicit((_Atomic uint64_t *)a, memory_order_acquire) >= target;
}

/* The common wait loop. `late` describes who is missing on timeout. */
static dt_status wait_loop(shm_ctx *s, _Atomic uint64_t *v, uint64_t target, _Atomic uint32_t *word,
                           _Atomic uint32_t *waiters, int peer,
                           void (*late)(shm_ctx *, uint64_t, int, char *, size_t))
{
    for (int i = 0; i < s->spin; i++) {
        if (pred_tick(s, v, target))
            return DT_OK;
        cpu_relax();
    }
    if (s->spin_s > 0 && dt__comm_may_poll()) { /* busy-poll (ranks have cores to themselves and nothing
                                                    computes on this one meanwhile), watching for failures */
        const double until = dt_time_s() + s->spin_s;
        for (;;) {
            for (int i = 0; i < 256; i++) {
                if (pred_tick(s, v, target))
                    return DT_OK;
                cpu_relax();
            }
            dt_status st = dt__shm_check_abort(s);
            if (st < 0)
                return st;
            double now = dt_time_s();
            if (now >= until || now > s->deadline)
                break;
            if (now >= s->next_live_check) {
                s->next_live_check = now + 0.1;
                if (pred_tick(s, v, target))
                    return DT_OK;
                if ((st = check_peers(s, peer)) < 0)
                    return st;
            }
        }
    }
    for (int i = 0; i < 4; i++) { /* let a peer on this core run */
        if (pred_tick(s, v, target))
            return DT_OK;
        if (!dt__cpu_yield(&s->yield_off_until))
            break;
    }
    for (;;) {
        dt_status st = dt__shm_check_abort(s);
        if (st < 0)
            return st;
        double now = dt_time_s();
        if (now > s->deadline) {
            if (pred_tick(s, v, target))
                return DT_OK;
            char who[256], d[160], msg[640];
            late(s, target, peer, who, sizeof who);
            snprintf(msg, sizeof msg, "%s timed out after %.3g s on rank %d: %s", op_name(s, d, sizeof d),
                     s->timeout_s, s->rank, who);
            /* Inside an operation the group layer appends the flight
             * recorder's verdict and then fails the group (abort). */
            if (s->cur)
                return dt_error(DT_ERR_TIMEOUT, "%s", msg);
            return dt__shm_abort(s, DT_ERR_TIMEOUT, msg);
        }
        if (now >= s->next_live_check) {
            s->next_live_check = now + 0.1;
            if (pred_tick(s, v, target))
                return DT_OK;
            st = check_peers(s, peer);
            if (st < 0)
                return st;
        }
        atomic_fetch_add(waiters, 1);
        uint32_t w = atomic_load(word);
        if (pred_tick(s, v, target)) {
            atomic_fetch_sub(waiters, 1);
            return DT_OK;
        }
        double left = s->deadline - now;
        long ns = left < 0.05 ? (long)(left * 1e9) + 1000 : 50000000L;
        futex_wait(word, w, ns);
        atomic_fetch_sub(waiters, 1);
        if (pred_tick(s, v, target))
            return DT_OK;
    }
}

static void late_ranks(shm_ctx *s, uint64_t target, int peer, char *buf, size_t n)
{
    (void)peer;
    size_t o = 0;
    int cnt = 0;
    for (int r = 0; r < s->size && o + 16 < n; r++)
        if (atomic_load(&shm_rank_at(s, r)->tick) < target) {
            o += (size_t)snprintf(buf + o, n - o, "%s%d", cnt ? ", " : "", r);
            cnt++;
        }
    uint32_t step = (uint32_t)(target & 0xffffffffu);
    snprintf(buf + o, n - o, "%s", "");
    char tail[96];
    if (step == 1)
        snprintf(tail, sizeof tail, " did not arrive");
    else
        snprintf(tail, sizeof tail, " did not reach step %u", step);
    if (cnt == 0)
        snprintf(buf, n, "no rank is missing (raced)");
    else {
        char head[256];
        snprintf(head, sizeof head, "rank%s %s%s", cnt > 1 ? "s" : "", buf, tail);
        snprintf(buf, n, "%s", head);
    }
}

dt_status dt__shm_wait(shm_ctx *s, int r, uint32_t step)
{
    shm_rank *k = shm_rank_at(s, r);
    uint64_t target = shm_tick_of(s->cur_seq, step);
    if (atomic_load_explicit(&k->tick, memory_order_acquire) >= target)
        return DT_OK;
    return wait_loop(s, &k->tick, target, &k->word, &k->waiters, r, late_ranks);
}

dt_status dt__shm_wait_all(shm_ctx *s, uint32_t step)
{
    for (int r = 0; r < s->size; r++) {
        if (r == s->rank)
            continue;
        dt_status st = dt__shm_wait(s, r, step);
        if (st < 0)
            return st;
    }
    return DT_OK;
}

dt_status dt__shm_barrier(shm_ctx *s, uint32_t step)
{
    dt__shm_signal(s, step);
    return dt__shm_wait_all(s, step);
}

static void late_chan(shm_ctx *s, uint64_t target, int peer, char *buf, size_t n)
{
    (void)target;
    const dt_coll *c = s->cur;
    if (c && c->kind == DT_COLL_SEND)
        snprintf(buf, n, "rank %d did not receive (no matching recv posted?)", peer);
    else
        snprintf(buf, n, "rank %d did not send (no matching send posted?)", peer);
}

dt_status dt__shm_wait_chan(shm_ctx *s, shm_chan *c, _Atomic uint64_t *v, uint64_t target,
                            int peer, const char *what)
{
    (void)what;
    if (atomic_load_explicit(v, memory_order_acquire) >= target)
        return DT_OK;
    return wait_loop(s, v, target, &c->word, &c->waiters, peer, late_chan);
}

dt_status dt__shm_check_peer(shm_ctx *s, const dt_coll *c, int peer)
{
    dt_status st = dt__shm_check_abort(s);
    if (st < 0)
        return st;
    const dt_coll *saved = s->cur;
    s->cur = c;
    st = check_peers(s, peer);
    s->cur = saved;
    return st;
}
