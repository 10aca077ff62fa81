/* models/zoo.h — constructors of the zoo's models (internal). Each builds
 * its model into *out and fills the descriptor. */
#ifndef DT_MODELS_ZOO_H
#define DT_MODELS_ZOO_H

#include "dtrain/models.h"

dt_status dt__model_convnet(uint64_t seed, const dt_model_config *c, dt_model **out, dt_model_desc *d);
dt_status dt__model_mlp(uint64_t seed, const dt_model_config *c, dt_model **out, dt_model_desc *d);

#endif
