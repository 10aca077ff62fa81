/* A dense layer's saved input given up after its forward and fetched again
 * for its weight's gradient. For the library's other layers: sequence
 * parallelism's column-parallel products keep only the rank's rows and
 * gather the whole input again in backward, as Megatron-LM's layers do
 * (tp.c: dt_tp_sp_gather_products). Not a public header. */
#ifndef DT_AG_REFETCH_H
#define DT_AG_REFETCH_H

#include "dtrain/autograd.h"

typedef struct dt__refetch dt__refetch;
struct dt__refetch {
    /* the input's values in dtype t (contiguous, the product's rows x in), valid until put */
    const void *(*get)(dt_ctx *ctx, dt__refetch *r, dt_dtype t);
    /* the product's backward is done with what get gave */
    void (*put)(dt_ctx *ctx, dt__refetch *r);
};

/* y: the output of dt_linear or dt_addmm on x, or on autocast's cast of x,
 * recorded for backward. Its backward calls r->get when its weight's
 * gradient needs the input (then r->put), and the cast's copy of x goes
 * back to the step's arena now; x's own memory stays the caller's (the
 * caller gives it back once every product on it has been set so). Returns
 * false, changing nothing, when y is not such an output (no-grad mode,
 * another op, an input the product copied). r must live until the
 * context's reset. */
bool dt__dense_refetch(dt_ctx *ctx, dt_tensor *y, const dt_tensor *x, dt__refetch *r);

#endif
