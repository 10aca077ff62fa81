/* src/comm/flight.h — the flight recorder's private structures (flight.c,
 * used by pg.c and req.c; backends see only the opaque status block).
 *
 * Per group and rank: a ring of the last `cap` operations (dt_flight_entry,
 * written in place under the group's lock: O(1), no allocation) and a
 * status block (dt__flight_board) that summarises where the rank stands in
 * the group's collective order. The block lives where the backend's
 * flight_board slot puts it (shm: the shared segment, readable while this
 * rank is stopped; mpi: memory the backend serves to peers that ask) and is
 * rewritten under a sequence lock. After a timeout the group layer gathers
 * every rank's block (flight_gather) and writes the verdict. */
#ifndef DT_COMM_FLIGHT_H
#define DT_COMM_FLIGHT_H

#include "dtrain/comm.h"

#include <stdatomic.h>
#include <stdint.h>

#define DT__FLIGHT_LABEL 48
#define DT__FLIGHT_BOARD_BYTES 256

/* One rank's status in one group. Times are wall-clock seconds (Unix), so
 * that ranks on other machines compare. Collectives complete in sequence
 * order, so `done` is also the oldest incomplete one's sequence number. */
typedef struct dt__flight_board {
    _Atomic uint32_t ver;  /* sequence lock: odd while being written */
    int32_t rank;
    int32_t analysing;     /* 1: this rank timed out and is gathering */
    int32_t pend_kind;     /* kind of collective #done, -1: none or unknown */
    int32_t last_kind;     /* kind of collective #done - 1, -1: none */
    int32_t pad;
    uint64_t posted;       /* collectives posted (the next one's number) */
    uint64_t done;         /* collectives completed */
    double t_pend;         /* when #done was posted */
    double t_last;         /* when #done - 1 completed */
    int64_t pend_step, last_step;
    char pend_label[DT__FLIGHT_LABEL], last_label[DT__FLIGHT_LABEL];
} dt__flight_board;

typedef struct dt__flight {
    dt_flight_entry *ring;     /* [cap] */
    uint32_t cap;
    uint64_t next;             /* the next record id */
    char label[DT__FLIGHT_LABEL];
    char name[40];             /* the group's name in dumps: "0", "0.5", ... (same on its ranks) */
    dt__flight_board *board;   /* the backend's, or &own */
    dt__flight_board own;
    double wait_s;             /* how long to wait for peers' blocks ($DT_FLIGHT_WAIT) */
    int subgroups;             /* subgroups made of this group (their names) */
    int *world;                /* [size] the members' ranks in the first group; NULL: the identity */
} dt__flight;

struct dt_pg;

/* Read and check $DT_FLIGHT_ENTRIES and $DT_FLIGHT_WAIT (dt_pg_init). */
dt_status dt__flight_env(uint32_t *cap, double *wait_s);
/* Set up pg->fr (ring of cap entries; 0 = failed to allocate). */
int dt__flight_init(struct dt_pg *pg, uint32_t cap, double wait_s, const char *name);
void dt__flight_free(struct dt_pg *pg);
/* A subgroup's members (ranks[i]: member i's rank in parent) in the first
 * group's numbering, for the trace's group identity; 0 = out of memory. */
int dt__flight_members(struct dt_pg *pg, const struct dt_pg *parent, const int *ranks, int n);
/* After the backend's init: where the status block lives. */
void dt__flight_attach(struct dt_pg *pg);
/* Record c (its seq assigned) as posted; returns its record id (mu held). */
uint64_t dt__flight_post(struct dt_pg *pg, const dt_coll *c);
/* Mark record id started / completed with st (mu held). */
void dt__flight_start(struct dt_pg *pg, uint64_t id);
void dt__flight_done(struct dt_pg *pg, uint64_t id, dt_status st);
/* A collective of pg timed out on this rank with msg: gather the ranks'
 * status blocks, append the verdict to msg (capacity n) and log the whole
 * analysis if this rank is the one to report (mu not held). */
void dt__flight_timeout(struct dt_pg *pg, char *msg, size_t n);

#endif /* DT_COMM_FLIGHT_H */
