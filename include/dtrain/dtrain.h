/* dtrain/dtrain.h — everything: include this one header.
 *
 * dtrain is a distributed deep-learning training library in C11. The layers,
 * each with its own header, in dependency order:
 *   base.h      status codes, errors, memory, arenas, clocks, Philox RNG
 *   kernels.h   compute on raw pointers (oneDNN matmul/conv, norms, ...)
 *   comm.h      process groups, asynchronous collectives, backends
 *   tensor.h    N-d tensors, views, flat buffers
 *   autograd.h  differentiable ops, the tape, hooks
 *   ops.h       the op table: name, backward, autocast class, FLOPs per op
 *   precision.h low-precision compute: op dtypes, dt_cast, autocast
 *   nn.h        modules with named parameters in typed flat buffers
 *   models.h    the model zoo (ConvNet, MLP) and model descriptors
 *   optim.h     fused optimizers over flat buffers, clipping, schedules
 *   data.h      datasets, samplers, the prefetching loader
 *   tokenizer.h Hugging Face tokenizer.json (byte-level BPE), text, jsonl and parquet corpora
 *   parallel.h  DDP, the gradient-reduction engine, SyncBatchNorm, metrics
 *   mesh.h      process meshes, distributed tensors (Shard/Replicate/Partial), reshard
 *   cp.h        context parallelism: ring and Ulysses attention over a split sequence
 *   zeropp.h    ZeRO++'s quantized all-gather and two-hop reduce-scatter
 *   monitor.h   scalars for TensorBoard and CSV (DeepSpeed's monitors)
 *   train.h     the trainer: one call per step, strategies (none, ddp)
 *   generate.h  autoregressive generation from a GPT-2 model (models.h includes it)
 *   ckpt.h      safetensors files, full and sharded checkpoints
 *   pipeline.h  pipeline schedules (action tables), a model's units and their cut into stages
 *   pipe_strategy.h  the "pipe" training strategy (stages under the trainer)
 */
#ifndef DTRAIN_H
#define DTRAIN_H
#include "dtrain/base.h"
#include "dtrain/kernels.h"
#include "dtrain/comm.h"
#include "dtrain/tensor.h"
#include "dtrain/trace.h"
#include "dtrain/autograd.h"
#include "dtrain/ops.h"
#include "dtrain/precision.h"
#include "dtrain/nn.h"
#include "dtrain/generate.h"
#include "dtrain/models.h"
#include "dtrain/optim.h"
#include "dtrain/data.h"
#include "dtrain/tokenizer.h"
#include "dtrain/parallel.h"
#include "dtrain/tp.h"
#include "dtrain/cp.h"
#include "dtrain/zeropp.h"
#include "dtrain/mesh.h"
#include "dtrain/offload.h"
#include "dtrain/config.h"
#include "dtrain/monitor.h"
#include "dtrain/train.h"
#include "dtrain/pipeline.h"
#include "dtrain/pipe_strategy.h"
#include "dtrain/plan.h"
#include "dtrain/ckpt.h"
#endif
