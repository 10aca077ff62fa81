/* src/base/cpu_cached.h — the CPU probes hot paths ask for on every call,
 * read once (dt_cpu_detect(), so DT_MAX_CPU_ISA caps them) and cached.
 *
 *     if (dt__cpu_avx2()) rows_avx2(...); else rows_plain(...);
 *
 * Also the yield that comm's waiting loops (shm and MPI) share.
 *
 * Layer-internal: base's cached CPU probes for the hot paths of every layer
 * (comm: the f32 reductions). Not installed, not for users. */
#ifndef DT_BASE_CPU_CACHED_H
#define DT_BASE_CPU_CACHED_H

/* dt_cpu_detect().avx2, probed on the first call (any thread) and kept. */
int dt__cpu_avx2(void);

/* sched_yield, to let a peer sharing this core run, and 1; or 0 (no yield:
 * the caller should sleep instead) while *off_until, a time of dt_time_s,
 * lies ahead. A yield that kept the caller off its core for over 1 ms gave
 * a whole time slice to a task that was not a peer about to signal (a
 * peer's step between two waits is shorter): it sets *off_until 100 ms
 * ahead, as yielding again would hand the core over again. Each waiting
 * loop keeps its own *off_until (0 at first). With two busy processes
 * beside 4-8 ranks on 2 cores, yielding at every wait made the collective
 * tests 20x slower. */
int dt__cpu_yield(double *off_until);

#endif
