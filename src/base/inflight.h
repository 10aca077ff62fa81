/* src/base/inflight.h — memory that an asynchronous operation still owns.
 *
 * A gradient buffer whose reductions were posted but not yet waited for
 * must not be read by an optimizer step or clipping: the step would use a
 * half-reduced gradient on each rank and the replicas would silently drift
 * apart. The poster (the reduction engine) marks the range in flight with a
 * message that names the fix; readers check their range and fail with that
 * message. A process-wide table: the poster and the reader need not share a
 * handle (dt_optim_step only sees raw pointers).
 *
 * Layer-internal: base owns the table; the layer that posts reductions marks
 * (parallel: the reducer) and the layer that reads gradients checks (optim:
 * the step and clipping), without sharing a handle. Not installed, not for
 * users. */
#ifndef DT_BASE_INFLIGHT_H
#define DT_BASE_INFLIGHT_H

#include "dtrain/base.h"

/* Mark [p, p + bytes) in flight (owner identifies the entry for clearing;
 * marking again with the same owner replaces its range and message).
 * msg is copied. DT_ERR_NO_MEMORY when the table is full. */
dt_status dt__inflight_mark(const void *owner, const void *p, size_t bytes, const char *msg);
/* Clear owner's entry (no-op when it has none). */
void dt__inflight_clear(const void *owner);
/* DT_OK, or DT_ERR_STATE with "<who>: <owner's message>" as the error when
 * [p, p + bytes) overlaps a range in flight. */
dt_status dt__inflight_check(const char *who, const void *p, size_t bytes);

#endif
