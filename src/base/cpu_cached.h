/* src/base/cpu_cached.h — the CPU probes hot paths ask for on every call,
 * read once (dt_cpu_detect(), so DT_MAX_CPU_ISA caps them) and cached.
 *
 *     if (dt__cpu_avx2()) rows_avx2(...); else rows_plain(...);
 *
 * Layer-internal: base's cached CPU probes for the hot paths of every layer
 * (comm: the f32 reductions). Not installed, not for users. */
#ifndef DT_BASE_CPU_CACHED_H
#define DT_BASE_CPU_CACHED_H

/* dt_cpu_detect().avx2, probed on the first call (any thread) and kept. */
int dt__cpu_avx2(void);

#endif
