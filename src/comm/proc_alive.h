/* src/comm/proc_alive.h — whether a peer process on this machine has ended.
 *
 * A backend that cannot see its peers' deaths through its transport (MPI:
 * a receive from a killed rank simply never completes) learns them from
 * the operating system instead: each rank publishes its dt__proc_id once
 * (the group's set-up gathers them), and a rank that waits for an operation
 * asks dt__proc_gone about the peers that run on its own machine. A peer on
 * another machine is never judged (0): the ranks on its machine report it
 * and fail the group for everyone.
 *
 * "This machine" is the same running kernel (its boot id) and the same pid
 * namespace: two containers with one host name, or two hosts with one name,
 * are told apart. A pid reused by a new process is told apart from the
 * rank by its start time. No signal is sent to anything: the check opens a
 * pidfd (Linux >= 5.3) or reads /proc/PID/stat. */
#ifndef DT_COMM_PROC_ALIVE_H
#define DT_COMM_PROC_ALIVE_H

#include <stdint.h>

typedef struct {
    uint64_t host;  /* hash of boot id, pid namespace and host name (0: unknown) */
    uint64_t start; /* the process's start time (clock ticks after boot; 0: unknown) */
    int32_t pid;
    int32_t pad;
} dt__proc_id;

/* This process's identity. */
void dt__proc_id_self(dt__proc_id *me);

/* Whether p runs on the same machine (and pid namespace) as me. */
int dt__proc_id_local(const dt__proc_id *me, const dt__proc_id *p);

/* 1 when p is local and its process has ended (gone, a zombie, or its pid
 * now names a younger process); 0 when it lives or is not local. *pidfd
 * caches a pidfd for p (start with -2; -1: none); close it with
 * dt__proc_id_close. */
int dt__proc_gone(const dt__proc_id *me, const dt__proc_id *p, int *pidfd);
void dt__proc_id_close(int *pidfd);

#endif
