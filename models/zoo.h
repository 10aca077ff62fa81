/* models/zoo.h — constructors of the zoo's models (internal). */
#ifndef DT_MODELS_ZOO_H
#define DT_MODELS_ZOO_H

#include "dtrain/nn.h"

dt_model *dt__model_convnet(uint64_t seed, const dt_model_config *c);
dt_model *dt__model_mlp(uint64_t seed, const dt_model_config *c);

#endif
