/* src/base/same_check.h — whether every rank was given the same settings.
 *
 * Each rank hashes the value of each named setting into its own slot of a
 * world x (1 + n) table of zeros (slot 0: a hash of the names, so that two
 * versions passing other lists are told apart), one sum over the ranks
 * fills every slot, and every rank reads the same table and returns the
 * same message naming each differing setting and the ranks whose value is
 * not rank 0's. Hashes are 32 bits, so the sum of doubles is exact.
 *
 * Layer-internal: the engine of dt_pg_check_same (comm: the sum is an
 * all-reduce over a group) and dt_trainer_check_same (train: over the
 * trainer's replicas), which differ only in how they sum. Not installed,
 * not for users. */
#ifndef DT_BASE_SAME_CHECK_H
#define DT_BASE_SAME_CHECK_H

#include "dtrain/base.h"

/* SUM of n doubles over the world, in place (collective). */
typedef dt_status (*dt__same_sum_fn)(void *ud, double *v, int n);

/* world ranks, this one `rank`; names[i] and values[i] (NULL is "(unset)")
 * for i < n. DT_OK when every rank passed the same, DT_ERR_MISMATCH naming
 * them otherwise; a failed sum is wrapped with who. */
dt_status dt__same_check(int world, int rank, const char *const *names, const char *const *values, int n,
                         dt__same_sum_fn sum, void *ud, const char *who);

#endif
