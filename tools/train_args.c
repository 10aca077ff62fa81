/* `dtrain train` options: one table drives parsing, range checks and --help.
 * Adding a flag is one row. Every error is one line naming the flag and what
 * is wrong; the caller exits 2. Values are taken as `--flag VALUE` or
 * `--flag=VALUE`. */
#include "cmd.h"
#include "train.h"

#include "dtrain/models.h"
#include "dtrain/precision.h"
#include "dtrain/train.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enum { OPT_INT, OPT_FLOAT, OPT_STR, OPT_CHOICE, OPT_FLAG, OPT_U64 } opt_type;

typedef struct {
    const char *name;    /* without the leading -- */
    opt_type type;
    size_t off;          /* field offset in dt__train_opts */
    double lo, hi;       /* numeric range, inclusive */
    const char *choices; /* OPT_CHOICE: "a|b|c" */
    const char *arg;     /* metavariable for --help */
    const char *help;
} opt_def;

#define OFF(f) offsetof(dt__train_opts, f)
static const opt_def opts[] = {
    {"model", OPT_CHOICE, OFF(model), 0, 0, "convnet|mlp|gpt2|gpt2-medium|gpt2-large|gpt2-xl|gpt-mini|gpt-micro|llama-tiny|llama-100m|hf:DIR",
     "NAME", "model to train (default convnet); hf:DIR: the Hugging Face model directory DIR (config.json and its "
     "safetensors weights; Llama, Mistral, Ministral, Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3, Phi-3, Granite, OLMo 2, "
     "OLMo 3, SmolLM3, the mixtures of experts Mixtral, Qwen3-MoE, Qwen2-MoE and OLMoE, or GPT-2), starting from "
     "its weights"},
    {"data", OPT_STR, OFF(data), 0, 0, NULL, "SPEC",
     "fashion-mnist | mnist:DIR | idx:DIR | npy:X.npy[,Y.npy][,test=F] | csv:FILE[,label=COL][,test=F] | random "
     "| tokens:FILE | text:FILE[,FILE...] | jsonl:FILE[,FILE...][,field=KEY | ,prompt=KEY,completion=KEY] "
     "| parquet:FILE[,FILE...][,field=KEY | ,prompt=KEY,completion=KEY] "
     "(default fashion-mnist; random for mlp). npy/csv: a held-out fraction F (default 0.1) is the test set; GPT "
     "models need tokens:FILE (an llm.c token file) or text (each text: file, each jsonl: line's KEY, default "
     "text, one document, followed by the end-of-document token; a parquet: file's rows (Hugging Face datasets' "
     "files; SNAPPY, GZIP, ZSTD or uncompressed) are taken as jsonl: lines with its columns as keys, only the "
     "columns used read; with prompt=KEY,completion=KEY each line is its "
     "prompt's tokens, its completion's, the end-of-document token: TRL's prompt-completion format; a line's "
     "\"messages\" list (or KEY's, or prompt and completion lists) is a conversation, rendered by the tokenizer's "
     "chat template as apply_chat_template does, nothing added after it: TRL's conversational formats; encoded "
     "with --tokenizer at start)"},
    {"epochs", OPT_INT, OFF(epochs), 1, 1e6, NULL, "N", "passes over the training set (default 1)"},
    {"batch", OPT_INT, OFF(batch), 1, 1e6, NULL, "N", "samples per step (default 100)"},
    {"optimizer", OPT_CHOICE, OFF(optimizer), 0, 0, "sgd|adam|adamw|lamb|lion", "NAME", "default sgd"},
    {"lr", OPT_FLOAT, OFF(lr), 0, 1e3, NULL, "X", "learning rate (default 0.01)"},
    {"momentum", OPT_FLOAT, OFF(momentum), 0, 0.999999, NULL, "X", "SGD momentum (default 0)"},
    {"weight-decay", OPT_FLOAT, OFF(weight_decay), 0, 10, NULL, "X",
     "weight decay (default: 0; 0.01 for adamw and lamb)"},
    {"betas", OPT_STR, OFF(betas), 0, 0, NULL, "B1,B2",
     "adam/adamw/lamb: the moment decays (default 0.9,0.999; torch's betas, HF's --adam_beta1/--adam_beta2); "
     "lion: its update's and momentum's (default 0.9,0.999, DeepSpeed's)"},
    {"eps", OPT_FLOAT, OFF(eps), 1e-30, 1, NULL, "X",
     "adam/adamw/lamb: added to the denominator (default 1e-8; lamb 1e-6)"},
    {"lr-schedule", OPT_CHOICE, OFF(lr_schedule), 0, 0, "constant|step|cosine|linear", "NAME",
     "learning-rate schedule (default constant); cosine and linear decay to 0 over the run (--max-steps when "
     "given, else the epochs)"},
    {"warmup", OPT_INT, OFF(warmup), 0, 1e9, NULL, "STEPS",
     "linear warm-up steps (default 0; schedule steps are optimizer steps: with --grad-accum N, one per N batches)"},
    {"step-size", OPT_INT, OFF(step_size), 1, 1e9, NULL, "STEPS",
     "--lr-schedule step: steps between decays (default one epoch)"},
    {"gamma", OPT_FLOAT, OFF(gamma), 0, 1, NULL, "X", "--lr-schedule step: decay factor (default 0.1)"},
    {"clip-grad-norm", OPT_FLOAT, OFF(clip_grad_norm), 0, 1e9, NULL, "X",
     "clip the global gradient L2 norm (default 0 = off)"},
    {"threads", OPT_INT, OFF(threads), 0, 1024, NULL, "N", "compute threads (default: all cores)"},
    {"eval-every", OPT_INT, OFF(eval_every), 0, 1e9, NULL, "STEPS",
     "also evaluate every N optimizer steps (default 0: at the end of each epoch)"},
    {"no-eval", OPT_FLAG, OFF(no_eval), 0, 0, NULL, NULL, "skip evaluation on the test split"},
    {"metrics", OPT_STR, OFF(metrics), 0, 0, NULL, "FILE", "write JSON-lines metrics to FILE"},
    {"tensorboard", OPT_STR, OFF(tensorboard), 0, 0, NULL, "DIR",
     "write a TensorBoard event file into DIR (made when missing) with DeepSpeed's tags after every optimizer "
     "step: Train/Samples/train_loss, Train/Samples/lr, Train/Samples/loss_scale (fp16), Train/Samples/eval_loss, "
     "over the samples trained (the config's \"tensorboard\" and \"csv_monitor\" blocks do the same)"},
    {"dataloader-drop-last", OPT_FLAG, OFF(drop_last), 0, 0, NULL, NULL,
     "drop each epoch's short last training batch (HF Trainer's dataloader_drop_last, the config's "
     "\"dataloader_drop_last\"; default: it trains)"},
    {"log-every", OPT_INT, OFF(log_every), 1, 1e9, NULL, "STEPS",
     "optimizer steps between plain progress lines and metrics records, counted across epochs (default 100)"},
    {"seed", OPT_U64, OFF(seed), 0, 0, NULL, "N", "seed for initialisation and shuffling (default 0)"},
    {"rng", OPT_CHOICE, OFF(rng), 0, 0, "torch|philox", "NAME",
     "how --seed draws the initial weights and the data order: torch = PyTorch's numbers "
     "(the weights the same model has in PyTorch after torch.manual_seed(N): for GPT-2 and Llama "
     "transformers' GPT2LMHeadModel / LlamaForCausalLM of the same config; then randperm seeded "
     "N + epoch, as DistributedSampler(seed=N)); philox = dtrain's counter-based streams (default torch)"},
    {"limit-train", OPT_INT, OFF(limit_train), 0, 1e12, NULL, "N",
     "use only the first N training items (default 0 = all)"},
    {"limit-test", OPT_INT, OFF(limit_test), 0, 1e12, NULL, "N",
     "use only the first N test items (default 0 = all)"},
    {"random-items", OPT_INT, OFF(random_items), 1, 1e9, NULL, "N",
     "training items of --data random only (default 6000; test items: --limit-test, default 1000; other data: "
     "--limit-train)"},
    {"progress", OPT_CHOICE, OFF(progress), 0, 0, "auto|bar|plain|none", "MODE",
     "bar on a terminal, plain lines otherwise (default auto)"},
    {"sync-bn", OPT_FLAG, OFF(sync_bn), 0, 0, NULL, NULL,
     "with several ranks: batch-norm statistics over all ranks (SyncBatchNorm)"},
    {"bucket-mb", OPT_FLOAT, OFF(bucket_mb), 0.001, 4096, NULL, "MIB",
     "with several ranks: DDP gradient bucket cap (default 25; the first bucket min(1, MIB))"},
    {"comm-hook", OPT_CHOICE, OFF(comm_hook), 0, 0, "allreduce|fp16|bf16|powersgd", "HOOK",
     "with several ranks (DDP): how gradient buckets are reduced: plain all-reduce (default), fp16/bf16 "
     "compression (= --reduce-dtype fp16/bf16), or PowerSGD low-rank compression; AIAK_FP16_COMPRESSION=1 / "
     "AIAK_POWERSGD_COMPRESSION=1 override"},
    {"powersgd-rank", OPT_INT, OFF(powersgd_rank), 1, 1024, NULL, "R",
     "--comm-hook powersgd: matrix approximation rank (default 1; AIAK_MATRIX_APPROXIMATION_RANK overrides)"},
    {"powersgd-start-iter", OPT_INT, OFF(powersgd_start_iter), 0, 1e15, NULL, "N",
     "--comm-hook powersgd: plain all-reduce for the first N steps (default 1000; AIAK_START_COMPRESS_ITER "
     "overrides)"},
    {"powersgd-no-error-feedback", OPT_FLAG, OFF(powersgd_no_error_feedback), 0, 0, NULL, NULL,
     "--comm-hook powersgd: drop the compression error instead of adding it to the next step's gradients"},
    {"powersgd-no-warm-start", OPT_FLAG, OFF(powersgd_no_warm_start), 0, 0, NULL, NULL,
     "--comm-hook powersgd: draw a fresh random Q every step instead of reusing the last one"},
    {"grad-accum", OPT_INT, OFF(grad_accum), 1, 1e6, NULL, "N",
     "accumulate gradients over N batches per optimizer step (default 1)"},
    {"offload", OPT_STR, OFF(offload), 0, 0, NULL, "SPEC",
     "optimizer states off this rank's memory: cpu (no-op on a CPU system, says so) | nvme:DIR "
     "(files in a per-run directory under DIR, streamed with asynchronous I/O)"},
    {"offload-param", OPT_STR, OFF(offload_param), 0, 0, NULL, "SPEC",
     "--zero 3 / --fsdp full_shard: parameter shards off this rank's memory: cpu (no-op on a CPU system) | "
     "nvme:DIR (each unit's shard in a file under DIR, read ahead of its all-gather, written after the step)"},
    {"mlp-dim", OPT_INT, OFF(mlp_dim), 1, 1 << 20, NULL, "N", "--model mlp: input/output width (default 1024)"},
    {"mlp-hidden", OPT_INT, OFF(mlp_hidden), 1, 1 << 22, NULL, "N", "--model mlp: hidden width (default 4096)"},
    {"prefetch", OPT_INT, OFF(prefetch), 1, 64, NULL, "N", "batches loaded ahead (default 2)"},
    {"val-data", OPT_STR, OFF(val_data), 0, 0, NULL, "tokens:FILE",
     "GPT models: the validation tokens (evaluated at epoch ends and every --eval-every steps)"},
    {"seq", OPT_INT, OFF(seq), 1, 1e6, NULL, "T", "GPT models: tokens per sample (default: the block size)"},
    {"n-layer", OPT_INT, OFF(n_layer), 1, 1e4, NULL, "N", "GPT models: transformer blocks (default: the model's)"},
    {"n-head", OPT_INT, OFF(n_head), 1, 1e4, NULL, "N", "GPT models: attention heads (default: the model's)"},
    {"n-embd", OPT_INT, OFF(n_embd), 1, 1e6, NULL, "N", "GPT models: width (default: the model's)"},
    {"block-size", OPT_INT, OFF(block_size), 1, 1e7, NULL, "N", "GPT models: positions (default: the model's)"},
    {"vocab-size", OPT_INT, OFF(vocab_size), 1, 1e7, NULL, "N",
     "GPT models: tokens (default: the size of --vocab when given; else the model's, or the token files' "
     "largest id + 1 when that is larger; said at start)"},
    {"dropout", OPT_FLOAT, OFF(dropout), 0, 0.99, NULL, "P",
     "language models: dropout probability (GPT: the embedding's, attention's and residual ones; Llama: the "
     "attention's, transformers' attention_dropout; default 0)"},
    {"activation-checkpointing", OPT_FLAG, OFF(act_ckpt), 0, 0, NULL, NULL,
     "recompute the model's checkpoint units in backward instead of keeping their activations (the ConvNet's "
     "conv blocks, the MLP's layers, GPT blocks; the same losses)"},
    {"sample-every", OPT_INT, OFF(sample_every), 0, 1e9, NULL, "STEPS",
     "GPT models: print a generated sample every N steps and at the end (default 0 = never; --pp: generated "
     "through the stages, the same sample; not with --tp)"},
    {"sample-tokens", OPT_INT, OFF(sample_tokens), 1, 1e5, NULL, "N", "--sample-every: sample length (default 64)"},
    {"vocab", OPT_STR, OFF(vocab), 0, 0, NULL, "FILE",
     "GPT models: the token files' BPE vocabulary (dtrain tokenize): samples are printed as text"},
    {"freeze", OPT_STR, OFF(freeze), 0, 0, NULL, "PATTERN[,PATTERN...]",
     "freeze the parameters whose names match a pattern ('*' and '?' as in the shell, '*' crossing dots: "
     "'transformer.h.0.*', '*.wte.weight'): they keep their values, have no gradient, no optimizer state and no "
     "gradient reduction under any strategy, and are whole on every rank (a pattern matching no parameter is "
     "an error)"},
    {"lora-targets", OPT_STR, OFF(lora_targets), 0, 0, NULL, "NAME[,NAME...]",
     "LoRA (PEFT's): adapters on the layers whose names end in one of these (GPT-2: c_attn,c_proj,c_fc; all-linear: "
     "every Linear/Conv1D layer but lm_head, as PEFT's target_modules=\"all-linear\"), every "
     "other parameter frozen; lora_A U(+-1/sqrt(in)), lora_B zeros, output base + alpha/r * B(A(dropout(x))); "
     "with DDP, ZeRO, --tp (--sequence-parallel too) and --pp; checkpoints keep the LoRA settings (eval/generate --ckpt "
     "and --resume rebuild the model with them)"},
    {"lora-r", OPT_INT, OFF(lora_r), 1, 65536, NULL, "R", "LoRA rank (default 8)"},
    {"lora-alpha", OPT_FLOAT, OFF(lora_alpha), 1e-9, 1e9, NULL, "A", "LoRA alpha (default 8)"},
    {"lora-dropout", OPT_FLOAT, OFF(lora_dropout), 0, 0.99, NULL, "P", "dropout on the adapters' input (default 0)"},
    {"lora-rslora", OPT_FLAG, OFF(lora_rslora), 0, 0, NULL, NULL, "LoRA scaling alpha/sqrt(r) (rsLoRA) for alpha/r"},
    {"lora-dora", OPT_FLAG, OFF(lora_dora), 0, 0, NULL, NULL,
     "DoRA (PEFT's use_dora): each adapted layer also learns a magnitude per output feature (lora_magnitude_vector, "
     "starting at the base weight's row norms) and computes m / ||W + s B A|| * (W x + s B(A(x))) + bias, the norms "
     "taken as constants in the backward; not with --tp"},
    {"lora-modules-to-save", OPT_STR, OFF(lora_save_modules), 0, 0, NULL, "NAME[,NAME...]",
     "PEFT's modules_to_save: the modules whose names end so (lm_head, embed_tokens) train whole beside the "
     "adapters, --save-lora writes them (and --lora-from reads them) as PEFT does; a tied weight (lm_head and "
     "embed_tokens under tie_word_embeddings) trains as one, as PEFT's ensure_weight_tying; not with --tp"},
    {"lora-layers-to-transform", OPT_STR, OFF(lora_layers), 0, 0, NULL, "N[,N...]",
     "PEFT's layers_to_transform: a layer --lora-targets names by its end is adapted only in these layers (its "
     "index: the first number in its name after a part, model.layers.3.mlp.down_proj: 3)"},
    {"lora-layers-pattern", OPT_STR, OFF(lora_layers_pattern), 0, 0, NULL, "NAME[,NAME...]",
     "PEFT's layers_pattern: the layer index is the number after a part of this name (layers, h)"},
    {"lora-bias", OPT_CHOICE, OFF(lora_bias), 0, 0, "none|all|lora_only", NULL,
     "PEFT's bias: which biases train beside the adapters (and are saved with them): none (default), all (every "
     "parameter named bias), lora_only (the adapted layers' own)"},
    {"lora-rank-pattern", OPT_STR, OFF(lora_rank_pattern), 0, 0, NULL, "JSON",
     "PEFT's rank_pattern: a JSON object of layer name patterns to ranks ('{\"q_proj\": 16, "
     "\"model.layers.0.mlp.down_proj\": 4}'): a layer whose name is a key (a regular expression) or ends in \".\" + "
     "one gets that rank (the first key that matches), the others --lora-r; --save-lora writes it, checkpoints keep "
     "it; a key matching no adapted layer is warned of"},
    {"lora-alpha-pattern", OPT_STR, OFF(lora_alpha_pattern), 0, 0, NULL, "JSON",
     "PEFT's alpha_pattern: as --lora-rank-pattern, layer name patterns to alphas; each layer's scaling is its own "
     "alpha/r"},
    {"lora-exclude-modules", OPT_STR, OFF(lora_exclude_modules), 0, 0, NULL, "NAME[,NAME...]",
     "PEFT's exclude_modules (a list): a module whose name is one of these or ends in \".\" + one is never adapted, "
     "even when --lora-targets names it (--lora-from also reads PEFT's regular-expression form); one that "
     "excludes nothing is warned of"},
    {"lora-from", OPT_STR, OFF(lora_from), 0, 0, NULL, "DIR",
     "LoRA from adapters PEFT saved (save_pretrained): DIR/adapter_config.json gives the targets, r, alpha, "
     "dropout, rsLoRA and DoRA (in place of --lora-*), DIR/adapter_model.safetensors the adapters' starting weights, "
     "on the --model's own (hf:DIR) or --init-from's"},
    {"save-lora", OPT_STR, OFF(save_lora), 0, 0, NULL, "DIR",
     "at the end, write the LoRA adapters to DIR as PEFT does (adapter_config.json, adapter_model.safetensors: "
     "PeftModel.from_pretrained loads them; with --save-hf OUT, OUT is the merged model); DIR is made at the start "
     "and held by the run: another job given it is refused"},
    {"tokenizer", OPT_STR, OFF(tokenizer), 0, 0, NULL, "FILE",
     "GPT models: a Hugging Face tokenizer.json (or a directory holding one) for --data text:/jsonl:/parquet: (and "
     "--val-data; with --model hf:DIR the default is DIR's tokenizer.json, when it has one); the model's "
     "vocabulary is its size unless --vocab-size; --save-hf writes it with the model, --save checkpoints keep it "
     "(dtrain generate --ckpt DIR --prompt TEXT)"},
    {"assistant-only-loss", OPT_FLAG, OFF(assistant_only_loss), 0, 0, NULL, NULL,
     "GPT models on conversations (--data jsonl:FILE or parquet:FILE of \"messages\" lists; --val-data too): the "
     "loss counts only the tokens the tokenizer's chat template writes inside its {% generation %} blocks (the "
     "assistant's turns), "
     "the others are label -100; TRL's assistant_only_loss=True (transformers' assistant mask). A template without "
     "such blocks, text lines and a conversation with no assistant token are refused (exit 2); with --loss-mask on "
     "prompt/completion conversations a target must be both"},
    {"chat-template", OPT_STR, OFF(chat_template), 0, 0, NULL, "FILE",
     "GPT models with a tokenizer: the chat template (a Jinja file, as chat_template.jinja) in place of the "
     "tokenizer's own, or for one without (TRL's chat_template_path): the data's conversations are rendered with "
     "it, checkpoints keep it (eval and generate --ckpt), --save-hf writes it into tokenizer_config.json"},
    {"packing", OPT_CHOICE, OFF(packing), 0, 0, "on|off", "on|off",
     "GPT models on text data (--data text:/jsonl:/parquet:; --val-data too): on packs the records (text files, "
     "lines, rows), each with its end-of-document token, into windows of --seq + 1 tokens (default: the windows "
     "cross the records' edges); off makes each record one sample, as TRL's packing=False: its first --seq tokens "
     "(TRL's max_length), padded after its end, the padding's and the last position's targets label -100 (under "
     "causal attention the padding changes none of the record's outputs)"},
    {"loss-mask", OPT_FLAG, OFF(loss_mask), 0, 0, NULL, NULL,
     "GPT models on prompt/completion data (--data jsonl:FILE[,prompt=KEY,completion=KEY] or parquet:FILE[,...] "
     "so, keys prompt and completion by default; --val-data too): the loss counts only the completion tokens and "
     "the end-of-document "
     "token, the prompt's positions are label -100 (ignored: the mean is over the counted tokens, as "
     "CrossEntropyLoss(ignore_index=-100)); TRL's completion_only_loss=True, Axolotl's train_on_inputs: false. "
     "Each rank's loss is the mean over its own counted tokens and the gradients are averaged over the ranks, as "
     "PyTorch DDP; a batch with no counted token has loss 0 and zero gradients"},
    {"mfu-peak", OPT_FLOAT, OFF(mfu_peak), 0, 1e9, NULL, "GFLOPS",
     "GPT models: the MFU's peak (default 0: measure the matmul peak at start, in bf16 for --precision bf16, else f32)"},
    {"plan", OPT_CHOICE, OFF(plan), 0, 0, "auto", "auto",
     "GPT-2 and Llama models: the planner (dtrain plan) picks dp x cp x tp x pp, the ZeRO stage, micro-batches, "
     "gradient accumulation and activation checkpointing for the ranks started, keeping the global batch of --batch x "
     "ranks, within MemTotal / ranks (DT_PLAN_MEM_PER_RANK=BYTES for less); prints the chosen layout and the "
     "runner-up. Not with a layout flag (--dp --tp --pp --cp --zero --fsdp --micro-batches --grad-accum "
     "--activation-checkpointing --offload); the config's \"dtrain\": {\"plan\": \"auto\"} is the same"},
    {"zero", OPT_CHOICE, OFF(zero), 0, 0, "0|1|2|3", "STAGE",
     "ZeRO stage: 0 = DDP, 1 shards optimizer states, 2 also gradients, 3 also parameters (built lazily: "
     "no rank holds the whole model); default 0"},
    {"fsdp", OPT_CHOICE, OFF(fsdp), 0, 0, "no_shard|shard_grad_op|full_shard|hybrid_shard", "STRATEGY",
     "FSDP's names for the same choice: no_shard = DDP, shard_grad_op = stage 2, full_shard = stage 3, "
     "hybrid_shard = stage 3 within each machine, replicated across machines"},
    {"wrap-min-params", OPT_INT, OFF(wrap_min_params), 0, 1e15, NULL, "N",
     "ZeRO/FSDP: a module whose not-yet-wrapped parameters reach N elements is its own unit (default 0: "
     "the whole model is one unit)"},
    {"backward-prefetch", OPT_CHOICE, OFF(backward_prefetch), 0, 0, "none|backward_pre|backward_post", "MODE",
     "stage 3: when the next unit's all-gather is posted in backward (default backward_pre)"},
    {"hierarchical-allreduce", OPT_FLAG, OFF(hierarchical_allreduce), 0, 0, NULL, NULL,
     "reduce gradients in two levels across machines: within each machine, then among one rank per "
     "machine and shard (Horovod's; DDP and ZeRO; AIAK_HIERARCHICAL_ALLREDUCE=1|0 overrides)"},
    {"forward-prefetch", OPT_FLAG, OFF(forward_prefetch), 0, 0, NULL, NULL,
     "stage 3: post the next unit's all-gather during the current unit's forward"},
    {"zero-quantized-weights", OPT_FLAG, OFF(zero_qw), 0, 0, NULL, NULL,
     "ZeRO++ qwZ (stage 3 / full_shard): the parameter all-gathers carry int8 blocks (one scale per "
     "--zero-quant-block elements); the shards and the optimizer stay exact (DeepSpeed's "
     "zero_quantized_weights)"},
    {"zero-quantized-gradients", OPT_FLAG, OFF(zero_qg), 0, 0, NULL, NULL,
     "ZeRO++ qgZ (stage 3 / full_shard): the gradient reduce-scatter runs quantized (--zero-grad-bits) in two "
     "hops, within each machine then across, summed in f32; no error feedback (DeepSpeed's "
     "zero_quantized_gradients)"},
    {"zero-hpz", OPT_INT, OFF(zero_hpz), 1, 1e6, NULL, "N",
     "ZeRO++ hpZ (stage 3 / full_shard): keep 1/N of each unit's forward-gathered parameters so its backward "
     "all-gather runs among N ranks (the ranks of one machine); N = ranks per machine (DeepSpeed's "
     "zero_hpz_partition_size, FSDP2's reshard_after_forward=N; default 1: off)"},
    {"zero-quant-block", OPT_INT, OFF(zero_quant_block), 1, 1073741824, NULL, "N",
     "ZeRO++ qwZ (--zero-quantized-weights): elements per scale of the quantized parameter all-gathers (default "
     "2048)"},
    {"zero-grad-bits", OPT_CHOICE, OFF(zero_grad_bits), 0, 0, "4|8", "BITS",
     "ZeRO++ qgZ (--zero-quantized-gradients): bits per gradient value on the wire (default 4, DeepSpeed's)"},
    {"zero-grad-block", OPT_INT, OFF(zero_grad_block), 1, 1073741824, NULL, "N",
     "ZeRO++ qgZ (--zero-quantized-gradients): elements per scale of the quantized gradients (default 64)"},
    {"tp", OPT_INT, OFF(tp), 1, 1024, NULL, "N",
     "tensor parallelism (Megatron) over groups of N adjacent ranks (--model mlp, GPT and Llama models): each rank "
     "holds 1/N of the weights; the world divided by N is the data-parallel size (DDP across the groups)"},
    {"sequence-parallel", OPT_FLAG, OFF(sequence_parallel), 0, 0, NULL, NULL,
     "GPT-2 and Llama models with --tp: sequence parallelism (Megatron): the norms and residuals on each rank's 1/N "
     "of the tokens, all-gather and reduce-scatter in place of the all-reduces, the projections' inputs gathered "
     "again in backward rather than kept (the same values; --seq divisible by N, dropout's masks the single-process "
     "ones); with --pp the stages pass each rank's rows; with --cp a cp rank's "
     "positions split again over its tp ranks"},
    {"cp", OPT_INT, OFF(cp), 1, 1 << 16, NULL, "N",
     "context parallelism (GPT and Llama models): each sequence split over N ranks of a replica, which all read "
     "the same batch and keep their part of the positions; attention runs over the group (--cp-impl), the rest "
     "on the rank's positions; gradients reduce over dp x cp; composes with --dp, --zero/--fsdp, --tp (rank = "
     "(d x cp + c) x tp + t) and --pp (rank = ((d x cp + c) x tp + t) x pp + stage: each cp rank runs its own "
     "pipeline over its positions); --dropout draws one process's masks; under bf16/fp16 the attention runs in "
     "f32"},
    {"cp-impl", OPT_CHOICE, OFF(cp_impl), 0, 0, "ring|ulysses", "NAME",
     "with --cp: ring attention (default; keys and values go around the group, any head count) or "
     "DeepSpeed-Ulysses' all-to-all (the heads, after --tp's split, divisible by N); both run sliding windows and "
     "Gemma 2's soft-capped scores"},
    {"cp-balance", OPT_CHOICE, OFF(cp_balance), 0, 0, "on|off", "ON",
     "with --cp: the causal load balance (the sequence in 2N chunks, rank r holds chunks r and 2N-1-r; --seq "
     "divisible by 2N); default on for ring, off for ulysses (then --seq divisible by N)"},
    {"dp", OPT_INT, OFF(dp), 1, 1 << 16, NULL, "N",
     "data-parallel replicas (default: the ranks divided by --tp x --pp; given, it must equal that); with --tp "
     "and --pp the ranks form one dp x tp x pp mesh, rank = (d x tp + t) x pp + stage"},
    {"pp", OPT_INT, OFF(pp), 1, 256, NULL, "N",
     "pipeline parallelism over N adjacent ranks (--model mlp and GPT models: stages by layer, GPT blocks cut "
     "in halves, balanced by compute); the world divided by N is the data-parallel size"},
    {"pp-schedule", OPT_CHOICE, OFF(pp_schedule), 0, 0, "gpipe|1f1b|interleaved|zbh1", "NAME",
     "with --pp: the pipeline schedule (default 1f1b; interleaved: 2 stages per rank, M a multiple of N)"},
    {"pp-balance", OPT_CHOICE, OFF(pp_balance), 0, 0, "compute|params|time", "BY",
     "with --pp: balance the stages by the layers' estimated compute (default), by their parameter count, or "
     "by their forward + backward time measured at the start on the first micro-batch of the training data"},
    {"micro-batches", OPT_INT, OFF(micro_batches), 1, 4096, NULL, "M",
     "with --pp: each batch runs as M micro-batches (the batch must be a multiple of M; an epoch's short last "
     "batch that is not is dropped, said at start; default 4)"},
    {"save", OPT_STR, OFF(save), 0, 0, NULL, "DIR",
     "save checkpoints into DIR/step-N (at the end, and every --save-every steps)"},
    {"save-hf", OPT_STR, OFF(save_hf), 0, 0, NULL, "OUT",
     "at the end, write the model as a Hugging Face model directory OUT (config.json, safetensors, "
     "generation_config.json) that transformers loads; GPT-2, Llama and hf:DIR models; a LoRA run's adapters "
     "are merged into their layers (PEFT's merge_and_unload: W + alpha/r * B A); OUT must not exist "
     "(or be empty) and is held from the start (made empty and locked: another job given it is refused); "
     "with --tokenizer (or hf:DIR holding a tokenizer.json) also tokenizer.json, "
     "tokenizer_config.json and special_tokens_map.json (AutoTokenizer loads them)"},
    {"hf-shard-size", OPT_U64, OFF(hf_shard_size), 0, 0, NULL, "BYTES",
     "with --save-hf: the largest shard's tensor bytes (default 5000000000; more shards get "
     "model.safetensors.index.json)"},
    {"save-every", OPT_INT, OFF(save_every), 0, 1e12, NULL, "N", "with --save: also every N optimizer steps"},
    {"keep", OPT_INT, OFF(keep), 0, 1e9, NULL, "K",
     "with --save: keep the newest K checkpoints up to the one just saved (default 0 = all; later steps, left "
     "from before a --resume of an older one, stay)"},
    {"async-save", OPT_FLAG, OFF(async_save), 0, 0, NULL, NULL,
     "with --save: write checkpoints on a background thread while training goes on"},
    {"trace", OPT_STR, OFF(trace), 0, 0, NULL, "DIR",
     "record a timeline of --trace-steps (every rank's steps, units, collectives, pipeline actions): "
     "DIR/rank-N.json per rank, merged into DIR/trace.json (Chrome trace: Perfetto, chrome://tracing; "
     "dtrain trace summary|plot); another job given the same DIR while this one records is refused"},
    {"trace-steps", OPT_STR, OFF(trace_steps), 0, 0, NULL, "A:B",
     "with --trace: the optimizer steps A to B-1 (default 3:5, after warm-up)"},
    {"max-steps", OPT_INT, OFF(max_steps), 0, 1e12, NULL, "N",
     "the run's length: N optimizer steps in all, over as many epochs as they take (it overrides --epochs, as "
     "HF Trainer's max_steps does; the cosine/linear schedule spans N; a resumed run counts the saved steps; "
     "default 0 = --epochs)"},
    {"resume", OPT_STR, OFF(resume), 0, 0, NULL, "DIR|auto",
     "continue from a checkpoint: DIR is a --save directory (its newest) or one checkpoint; auto (needs --save "
     "DIR): DIR's newest complete checkpoint; when DIR does not exist yet or holds no checkpoint, the run starts "
     "fresh from --seed and says so (one command to launch and to relaunch after any stop); a damaged newest "
     "checkpoint falls back to the next older one with a warning (none left: exit 2); a run whose checkpoint is "
     "already at its end trains nothing and leaves its files as they are"},
    {"init-from", OPT_STR, OFF(init_from), 0, 0, NULL, "FILE",
     "initial weights from a safetensors file with PyTorch's names (e.g. written by PyTorch)"},
    {"precision", OPT_CHOICE, OFF(precision), 0, 0, "fp32|bf16|fp16|auto", "P",
     "parameters, activations and gradient reduction in P; bf16/fp16 keep fp32 master weights and f32 "
     "optimizer states; fp16 scales the loss dynamically; auto: bf16 where the CPU has AVX512_BF16 (or AMX), "
     "fp32 elsewhere, printed at start; an explicit bf16/fp16 with no native matmul of it (its products widen "
     "to f32) says so at start (default fp32)"},
    {"reduce-dtype", OPT_CHOICE, OFF(reduce_dtype), 0, 0, "fp32|bf16|fp16", "P",
     "dtype of the gradient all-reduce (default: the --precision's)"},
    {"keep-bn-fp32", OPT_CHOICE, OFF(keep_bn_fp32), 0, 0, "true|false", "BOOL",
     "with bf16/fp16: batch-norm parameters stay f32 (default true)"},
    {"buffer-dtype", OPT_CHOICE, OFF(buffer_dtype), 0, 0, "fp32|bf16|fp16", "P",
     "dtype of the buffers (batch-norm running statistics; FSDP's buffer_dtype), except batch norm's under "
     "--keep-bn-fp32 true (default fp32)"},
    {"loss-scale", OPT_FLOAT, OFF(loss_scale), 0, 1e30, NULL, "X",
     "--precision fp16: loss scale: 0 = dynamic (the default), X > 0 = static"},
    {"initial-scale-power", OPT_INT, OFF(initial_scale_power), 0, 127, NULL, "N",
     "--precision fp16, dynamic loss scale: start at 2^N (default 16; --scaler torch: the initial scale too)"},
    {"loss-scale-window", OPT_INT, OFF(loss_scale_window), 1, 1e9, NULL, "N",
     "--precision fp16, dynamic loss scale: clean steps in a row before it grows (default 1000 for deepspeed, 2000 "
     "for torch)"},
    {"hysteresis", OPT_INT, OFF(hysteresis), 1, 1e6, NULL, "N",
     "--precision fp16, dynamic loss scale (deepspeed): overflows absorbed before it halves (default 2)"},
    {"min-loss-scale", OPT_FLOAT, OFF(min_loss_scale), 1e-30, 1e30, NULL, "X",
     "--precision fp16, dynamic loss scale: floor; an overflow there stops the run with an error (default 1)"},
    {"config", OPT_STR, OFF(config), 0, 0, NULL, "FILE",
     "a DeepSpeed-style JSON config (ds_config.json: batch sizes, fp16/bf16, zero_optimization, optimizer, "
     "scheduler, activation_checkpointing, pipeline, ...; # comments allowed); flags given here override its keys, "
     "AIAK_* environment variables override both (docs/GUIDE.md)"},
    {"scaler", OPT_CHOICE, OFF(scaler), 0, 0, "deepspeed|torch", "RULE",
     "--precision fp16: the dynamic loss scaling rule: DeepSpeed's (hysteresis) or torch GradScaler's (default "
     "deepspeed)"},
};
#undef OFF

static void set_defaults(dt__train_opts *o)
{
    memset(o, 0, sizeof *o);
    o->model = "convnet";
    o->data = NULL;
    o->epochs = 1;
    o->batch = 100;
    o->optimizer = "sgd";
    o->lr = 0.01;
    o->momentum = 0;
    o->weight_decay = -1;
    o->eps = -1;
    o->lr_schedule = "constant";
    o->gamma = -1;        /* not given: 0.1 (dt__train_gamma) */
    o->log_every = 100;
    o->progress = "auto";
    o->packing = "on";
    o->rng = "torch";
    o->grad_accum = 1;
    o->powersgd_start_iter = -1;
    o->prefetch = 2;
    o->random_items = 0; /* not given: 6000 items for --data random (train_setup.c) */
    o->sample_tokens = 0; /* not given: 64 (dt__train_sample_tokens) */
    o->backward_prefetch = "backward_pre";
    o->precision = "fp32";
    o->keep_bn_fp32 = "true";
    o->loss_scale = -1;
    o->initial_scale_power = 16;
    o->loss_scale_window = 0; /* the rule's own */
    o->hysteresis = 2;
    o->min_loss_scale = 1;
    o->scaler = "deepspeed";
}

int dt__train_shared_opts(const dt__train_opts *o, const char **names, char (*vals)[512], int cap)
{
    static const char *const local[] = {"threads", "progress", "metrics", "tensorboard", "log-every", "prefetch",
                                        "mfu-peak", "config", NULL};
    int n = 0;
    for (size_t i = 0; i < sizeof opts / sizeof opts[0] && n < cap; i++) {
        const opt_def *d = &opts[i];
        bool skip = false;
        for (int j = 0; local[j] && !skip; j++)
            skip = !strcmp(d->name, local[j]);
        if (skip)
            continue;
        const char *base = (const char *)o + d->off;
        char *v = vals[n];
        switch (d->type) {
        case OPT_INT:
            snprintf(v, 512, "%lld", (long long)*(const int64_t *)base);
            break;
        case OPT_U64:
            snprintf(v, 512, "%llu", (unsigned long long)*(const uint64_t *)base);
            break;
        case OPT_FLOAT:
            snprintf(v, 512, "%.17g", *(const double *)base);
            break;
        case OPT_STR:
        case OPT_CHOICE: {
            const char *sv = *(const char *const *)base;
            snprintf(v, 512, "%s", sv ? sv : "(unset)");
            break;
        }
        case OPT_FLAG:
            snprintf(v, 512, "%s", *(const bool *)base ? "true" : "false");
            break;
        }
        names[n++] = d->name;
    }
    return n;
}

/* The option as --help and docs/TRAINING.md write it: "--name {a|b}",
 * "--name ARG" or "--name" (choices separated by sep). */
static void opt_lhs(const opt_def *d, char sep, char *out, size_t cap)
{
    if (d->type == OPT_CHOICE) {
        int n = snprintf(out, cap, "--%s {", d->name);
        for (const char *c = d->choices; *c && (size_t)n + 2 < cap; c++)
            out[n++] = *c == '|' ? sep : *c;
        snprintf(out + n, cap - (size_t)n, "}");
    } else if (d->arg) {
        snprintf(out, cap, "--%s %s", d->name, d->arg);
    } else {
        snprintf(out, cap, "--%s", d->name);
    }
}

void dt__train_options_markdown(FILE *f)
{
    fprintf(f, "| option | meaning |\n|---|---|\n");
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        char lhs[256];
        opt_lhs(&opts[i], ',', lhs, sizeof lhs);
        fprintf(f, "| `%s` | ", lhs);
        for (const char *h = opts[i].help; *h; h++) /* a '|' in the text would end the cell */
            fputs(*h == '|' ? "\\|" : (char[2]){*h, 0}, f);
        fprintf(f, " |\n");
    }
}

void dt__train_usage(FILE *f)
{
    fprintf(f, "usage: dtrain train [options]\n"
               "  e.g. dtrain train --model convnet --data fashion-mnist --epochs 1 --batch 100 \\\n"
               "         --optimizer sgd --lr 0.01 --momentum 0.9 --seed 0\n\noptions:\n");
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        char lhs[256];
        opt_lhs(&opts[i], '|', lhs, sizeof lhs);
        if (strlen(lhs) > 28)
            fprintf(f, "  %s\n  %-28s %s\n", lhs, "", opts[i].help);
        else
            fprintf(f, "  %-28s %s\n", lhs, opts[i].help);
    }
    fprintf(f, "  %-28s %s\n", "-h, --help", "this text");
    fprintf(f, "  %-28s %s\n", "--help-markdown", "the options above as a Markdown table (docs/TRAINING.md)");
    fprintf(f, "(an option spelled with underscores, --grad_accum, is the same option)\n");
    fprintf(f, "\nsharded (ZeRO / FSDP): add --zero 1|2|3 (or --fsdp shard_grad_op|full_shard), e.g.\n"
               "  dtrain run -n 2 -- dtrain train --model mlp --zero 3 --wrap-min-params 100000\n"
               "(the run ends with each rank's bytes of parameters, gradients and optimizer states)\n");
    fprintf(f, "\npipeline parallel: --pp N cuts the model into N stages over adjacent ranks, e.g.\n"
               "  dtrain run -n 4 -- dtrain train --model gpt-micro --pp 2 --pp-schedule zbh1 --micro-batches 4\n"
               "  (2 stages x 2 data-parallel; show a schedule: dtrain pipeline show --schedule zbh1 -p 2 -m 4)\n");
    fprintf(f, "\ntensor parallel (Megatron): --tp N splits each layer over N adjacent ranks, e.g.\n"
               "  dtrain run -n 4 -- dtrain train --model mlp --tp 2   (2 tensor-parallel x 2 data-parallel)\n");
    fprintf(f, "\n3-D (data x tensor x pipeline parallel): one dp x tp x pp mesh, e.g.\n"
               "  dtrain run -n 8 -- dtrain train --model gpt-micro --dp 2 --tp 2 --pp 2 --micro-batches 4\n");
    fprintf(f, "\ndata parallel (DDP) on this machine: start N ranks with the launcher,\n"
               "  dtrain run -n 2 -- dtrain train --model convnet --batch 100 ...\n"
               "(each rank trains on its share of every epoch; rank 0 prints and writes --metrics;\n"
               "see dtrain run --help and docs/GUIDE.md)\n");
}

static int bad(const char *name, const char *fmt, const char *val)
{
    char what[512];
    snprintf(what, sizeof what, fmt, val);
    dt__cli_err("dtrain train: --%s: %s\n", name, what);
    return 2;
}

/* Numbers go through the library's strict parser (dt_parse_*): no leading
 * spaces, nothing left over, no wrap of "-1" to 2^64-1, range-checked. */
static int bad_parse(void)
{
    dt__cli_err("dtrain train: %s\n", dt_last_error());
    return 2;
}

static int set_value(const opt_def *d, const char *v, dt__train_opts *o)
{
    char *base = (char *)o + d->off;
    char what[64];
    snprintf(what, sizeof what, "--%s", d->name);
    switch (d->type) {
    case OPT_INT: {
        int64_t x;
        if (dt_parse_int(what, v, (int64_t)d->lo, (int64_t)d->hi, &x) < 0)
            return bad_parse();
        *(int64_t *)base = x;
        return 0;
    }
    case OPT_U64: {
        uint64_t x;
        if (dt_parse_uint(what, v, 0, UINT64_MAX, &x) < 0)
            return bad_parse();
        *(uint64_t *)base = x;
        return 0;
    }
    case OPT_FLOAT: {
        double x;
        if (dt_parse_double(what, v, d->lo, d->hi, &x) < 0)
            return bad_parse();
        *(double *)base = x;
        return 0;
    }
    case OPT_STR:
        if (!*v)
            return bad(d->name, "empty value%s", "");
        *(const char **)base = v;
        return 0;
    case OPT_CHOICE: {
        size_t n = strlen(v);
        if (strstr(d->choices, "|hf:DIR") && !strncmp(v, "hf:", 3) && v[3]) { /* a model directory (or a Hub id) */
            *(const char **)base = dt__cli_hf_model(v);
            return 0;
        }
        for (const char *c = d->choices; *c;) {
            const char *e = strchr(c, '|');
            size_t len = e ? (size_t)(e - c) : strlen(c);
            if (len == n && !strncmp(c, v, n)) {
                *(const char **)base = v;
                return 0;
            }
            c += len + (e ? 1 : 0);
        }
        dt__cli_err("dtrain train: --%s: '%s' is not one of {%s}\n", d->name, v, d->choices);
        return 2;
    }
    case OPT_FLAG:
        *(bool *)base = true;
        return 0;
    }
    return 2;
}

/* Other tools' names for dtrain train's options (HF Trainer, DeepSpeed,
 * torchrun, Megatron), for the hint of an unknown option. */
static const struct {
    const char *theirs, *ours;
} k_synonyms[] = {
    {"deepspeed-config", "--config FILE (a DeepSpeed JSON config)"},
    {"deepspeed", "--config FILE (a DeepSpeed JSON config)"},
    {"bf16", "--precision bf16"},
    {"fp16", "--precision fp16"},
    {"gradient-accumulation-steps", "--grad-accum N"},
    {"learning-rate", "--lr X"},
    {"num-train-epochs", "--epochs N"},
    {"per-device-train-batch-size", "--batch N (per rank)"},
    {"micro-batch-size", "--batch N (per rank)"},
    {"batch-size", "--batch N (per rank)"},
    {"max-grad-norm", "--clip-grad-norm X"},
    {"clip-grad", "--clip-grad-norm X"},
    {"warmup-steps", "--warmup STEPS"},
    {"lr-scheduler-type", "--lr-schedule NAME"},
    {"lr-decay-style", "--lr-schedule NAME"},
    {"logging-steps", "--log-every STEPS"},
    {"log-interval", "--log-every STEPS"},
    {"save-steps", "--save-every N"},
    {"save-interval", "--save-every N"},
    {"save-total-limit", "--keep K"},
    {"output-dir", "--save DIR"},
    {"resume-from-checkpoint", "--resume DIR|auto"},
    {"max-train-steps", "--max-steps N"},
    {"train-iters", "--max-steps N"},
    {"tensor-model-parallel-size", "--tp N"},
    {"context-parallel-size", "--cp N"},
    {"sequence-parallel-size", "--cp N --cp-impl ulysses"},
    {"ulysses-degree", "--cp N --cp-impl ulysses"},
    {"pipeline-model-parallel-size", "--pp N"},
    {"gradient-checkpointing", "--activation-checkpointing"},
    {"nproc-per-node", "dtrain run -n N -- dtrain train ... (the launcher starts the ranks)"},
    {"local-rank", "none is needed: each rank reads LOCAL_RANK from its environment (dtrain run sets it; with "
                   "DeepSpeed's launcher give --no_local_rank)"},
    {"data-seed", "--seed N (initialisation and shuffling)"},
    {"model-name-or-path", "--model hf:DIR"},
    {"train-file", "--data SPEC (text:FILE, jsonl:FILE, parquet:FILE, tokens:FILE)"},
    {"validation-file", "--val-data SPEC"},
    {"max-seq-length", "--seq T"},
    {"seq-length", "--seq T"},
    {"optim", "--optimizer NAME"},
    {"adam-beta1", "--betas B1,B2"},
    {"adam-beta2", "--betas B1,B2"},
    {"adam-epsilon", "--eps X"},
    {"eval-steps", "--eval-every STEPS"},
    {"report-to", "--metrics FILE or --tensorboard DIR"},
    {"completion-only-loss", "--loss-mask"},
    {"dataset-text-field", "--data jsonl:FILE,field=KEY"},
    {"max-length", "--seq T"},
};

/* An unknown option: one line naming it, with the nearest known option or
 * the synonym other tools use for it. name: arg's name, '_' mapped to '-'. */
static int unknown_option(const char *arg, const char *name)
{
    const char *hint = NULL;
    char buf[96];
    for (size_t k = 0; k < sizeof k_synonyms / sizeof k_synonyms[0] && !hint; k++)
        if (!strcmp(k_synonyms[k].theirs, name))
            hint = k_synonyms[k].ours;
    if (!hint) {
        const char *names[sizeof opts / sizeof opts[0]];
        for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++)
            names[k] = opts[k].name;
        const char *near = dt__cli_suggest(name, names, sizeof opts / sizeof opts[0]);
        if (near) {
            snprintf(buf, sizeof buf, "--%s", near);
            hint = buf;
        }
    }
    const char *eq = strchr(arg, '=');
    int alen = eq ? (int)(eq - arg) : (int)strlen(arg);
    if (hint && !strncmp(hint, "none", 4)) /* no option of ours stands for it */
        dt__cli_err("dtrain train: unknown option '%.*s' (%s; see dtrain train --help)\n", alen, arg, hint);
    else if (hint)
        dt__cli_err("dtrain train: unknown option '%.*s' (did you mean %s? see dtrain train --help)\n", alen, arg,
                    hint);
    else
        dt__cli_err("dtrain train: unknown option '%.*s' (see dtrain train --help)\n", alen, arg);
    return 2;
}

int dt__train_parse(int argc, char **argv, dt__train_opts *o)
{
    set_defaults(o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            dt__train_usage(stdout);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0) {
            dt__cli_err("dtrain train: unexpected argument '%s' (options start with --; see "
                            "dtrain train --help)\n", a);
            return 2;
        }
        const char *eq = strchr(a + 2, '=');
        size_t nlen = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        char name[64]; /* torchrun's habit: --grad_accum is --grad-accum */
        if (nlen >= sizeof name)
            nlen = sizeof name - 1;
        for (size_t k = 0; k < nlen; k++)
            name[k] = a[2 + k] == '_' ? '-' : a[2 + k];
        name[nlen] = '\0';
        const opt_def *d = NULL;
        for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++)
            if (!strcmp(opts[k].name, name))
                d = &opts[k];
        if (!strcmp(name, "help-markdown")) {
            dt__train_options_markdown(stdout);
            return 1;
        }
        if (!d)
            return unknown_option(a, name);
        const char *val;
        if (d->type == OPT_FLAG) {
            if (eq) {
                dt__cli_err("dtrain train: --%s takes no value\n", d->name);
                return 2;
            }
            val = "";
        } else if (eq) {
            val = eq + 1;
        } else {
            if (i + 1 >= argc) {
                dt__cli_err("dtrain train: --%s needs a value\n", d->name);
                return 2;
            }
            val = argv[++i];
        }
        int rc = set_value(d, val, o);
        if (rc)
            return rc;
        static const char *const layout[] = {"dp", "tp", "sequence-parallel", "pp", "cp", "cp-impl", "cp-balance",
                                             "zero", "fsdp", "micro-batches", "grad-accum",
                                             "activation-checkpointing", "offload"};
        for (size_t k = 0; k < sizeof layout / sizeof layout[0] && !o->layout_flag; k++)
            if (!strcmp(d->name, layout[k]))
                o->layout_flag = layout[k];
        static const char *const fp16[] = {"loss-scale", "initial-scale-power", "loss-scale-window", "hysteresis",
                                           "min-loss-scale", "scaler"};
        for (size_t k = 0; k < sizeof fp16 / sizeof fp16[0] && !o->fp16_flag; k++)
            if (!strcmp(d->name, fp16[k]))
                o->fp16_flag = fp16[k];
    }
    if (o->betas) { /* "B1,B2", each in [0, 1) (torch's betas) */
        char *e1 = NULL, *e2 = NULL;
        double b1 = strtod(o->betas, &e1), b2 = e1 && *e1 == ',' ? strtod(e1 + 1, &e2) : NAN;
        if (e1 == o->betas || isspace((unsigned char)o->betas[0]) || !e2 || e2 == e1 + 1 ||
            isspace((unsigned char)e1[1]) || *e2 || !(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1)) {
            dt__cli_err("dtrain train: --betas %s: expected two numbers in [0, 1) separated by a comma, e.g. "
                        "0.9,0.95\n", o->betas);
            return 2;
        }
        o->beta[0] = b1, o->beta[1] = b2, o->beta_set = true;
    }
    if (!strcmp(o->precision, "auto")) /* resolved here: everything after sees fp32 or bf16 */
        o->precision = dt_precision_auto(&o->precision_auto) == DT_BF16 ? "bf16" : "fp32";
    /* with --config the flags combine with the file's keys first: dt__train_config checks the merge */
    return o->config ? 0 : dt__train_check(o);
}

/* Records with keys (prompt/completion, conversations): jsonl: and parquet:. */
static bool records_spec(const char *d)
{
    return d && ((!strncmp(d, "jsonl:", 6) && d[6]) || (!strncmp(d, "parquet:", 8) && d[8]));
}

/* Language-model data: text:/jsonl:/parquet: (encoded with --tokenizer) and tokens:FILE. */
static bool lm_text_spec(const char *d) { return (!strncmp(d, "text:", 5) && d[5]) || records_spec(d); }

static bool lm_data_spec(const char *d) { return (!strncmp(d, "tokens:", 7) && d[7]) || lm_text_spec(d); }

/* Whether path is one of the files the run reads: a file of the --data or --val-data spec (the comma-separated
 * names after "tokens:", "text:", "npy:", ...; key=value parts skipped), --config, --tokenizer, --vocab, --init-from
 * or --resume. The input's flag in *what. */
static bool names_an_input(const dt__train_opts *o, const char *path, const char **what)
{
    const char *const specs[] = {o->data, o->val_data}, *const spec_flags[] = {"a --data file", "a --val-data file"};
    for (int s = 0; s < 2; s++) {
        const char *c = specs[s] ? strchr(specs[s], ':') : NULL;
        char buf[4096];
        if (!c || snprintf(buf, sizeof buf, "%s", c + 1) >= (int)sizeof buf)
            continue;
        char *save = NULL;
        for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
            if (!strchr(t, '=') && dt__cli_same_file(path, t)) {
                *what = spec_flags[s];
                return true;
            }
    }
    const char *const files[] = {o->config, o->tokenizer, o->vocab, o->init_from,
                                 o->resume && strcmp(o->resume, "auto") ? o->resume : NULL};
    static const char *const flags[] = {"--config", "--tokenizer", "--vocab", "--init-from", "--resume"};
    for (int k = 0; k < 5; k++)
        if (dt__cli_same_file(path, files[k])) {
            *what = flags[k];
            return true;
        }
    return false;
}

int dt__train_check(dt__train_opts *o)
{
    /* Cross-field checks. */
    const bool lm = strcmp(o->model, "convnet") && strcmp(o->model, "mlp");
    if (o->plan && o->layout_flag) {
        dt__cli_err("dtrain train: --plan auto and --%s: the planner chooses the layout; give one of the two\n",
                    o->layout_flag);
        return 2;
    }
    char plan_id[32];
    if (o->plan && dt_plan_model_id(o->model, plan_id, sizeof plan_id, NULL) < 0) {
        dt__cli_err("dtrain train: --plan auto plans the GPT-2 and Llama models (gpt2, gpt2-medium, gpt2-large, "
                    "gpt2-xl, gpt-mini, gpt-micro, llama-tiny, llama-100m, hf:DIR), not --model %s: %s\n", o->model,
                    dt_last_error());
        return 2;
    }
    if (lm && (!o->data || !lm_data_spec(o->data))) {
        dt__cli_err("dtrain train: --model %s trains on token files or text: give --data tokens:FILE (an llm.c "
                    "token file; dtrain tokenize makes one), text:FILE, jsonl:FILE or parquet:FILE with --tokenizer\n",
                    o->model);
        return 2;
    }
    static char model_tok[4200]; /* hf:DIR's tokenizer.json: AutoTokenizer.from_pretrained(DIR)'s */
    if (lm && !o->tokenizer && !o->vocab && (lm_text_spec(o->data) || (o->val_data && lm_text_spec(o->val_data))) &&
        dt_hf_dir_tokenizer(o->model, model_tok, sizeof model_tok))
        o->tokenizer = model_tok, o->tokenizer_of_model = true;
    if (lm && !o->tokenizer && (lm_text_spec(o->data) || (o->val_data && lm_text_spec(o->val_data)))) {
        dt__cli_err("dtrain train: --data/--val-data text:, jsonl: and parquet: need --tokenizer FILE (a "
                    "tokenizer.json)\n");
        return 2;
    }
    if ((o->lora_r || o->lora_alpha > 0 || o->lora_dropout > 0 || o->lora_rslora || o->lora_dora ||
         o->lora_save_modules || o->lora_layers || o->lora_layers_pattern || o->lora_bias || o->lora_rank_pattern ||
         o->lora_alpha_pattern || o->lora_exclude_modules) && !o->lora_targets) {
        dt__cli_err("dtrain train: --lora-r, --lora-alpha, --lora-dropout, --lora-rslora, --lora-dora, "
                    "--lora-modules-to-save, --lora-layers-to-transform, --lora-layers-pattern, --lora-bias, "
                    "--lora-rank-pattern, --lora-alpha-pattern and --lora-exclude-modules go with --lora-targets "
                    "NAME[,NAME...]\n");
        return 2;
    }
    const char *const pat_opt[3] = {"--lora-rank-pattern", "--lora-alpha-pattern", "--lora-exclude-modules"};
    const char *const pat_val[3] = {o->lora_rank_pattern, o->lora_alpha_pattern, o->lora_exclude_modules};
    for (int k = 0; k < 3; k++) {
        dt_lora_pattern *pt = NULL;
        const char *v = pat_val[k];
        const bool names = k == 2 && v && (!v[0] || strstr(v, ",,") || v[0] == ',' || v[strlen(v) - 1] == ',');
        if (names) {
            dt__cli_err("dtrain train: %s %s: not a comma-separated list of module names\n", pat_opt[k], v);
            return 2;
        }
        if (k < 2 && v && dt_lora_pattern_init(k ? NULL : v, k ? v : NULL, NULL, &pt) < 0) {
            dt__cli_err("dtrain train: %s: %s\n", pat_opt[k], dt_last_error());
            return 2;
        }
        dt_lora_pattern_free(pt);
    }
    if (o->lora_layers_pattern && !o->lora_layers) {
        dt__cli_err("dtrain train: --lora-layers-pattern goes with --lora-layers-to-transform N[,N...]\n");
        return 2;
    }
    if (o->lora_from && o->lora_targets) {
        dt__cli_err("dtrain train: --lora-from DIR takes the LoRA settings from DIR/adapter_config.json: not with "
                    "--lora-targets or the other --lora-* options\n");
        return 2;
    }
    if (o->save_lora && !o->lora_targets && !o->lora_from && !o->resume) {
        dt__cli_err("dtrain train: --save-lora goes with --lora-targets NAME[,NAME...] or --lora-from DIR\n");
        return 2;
    }
    if (o->assistant_only_loss && (!lm || !records_spec(o->data) || (o->val_data && !records_spec(o->val_data)))) {
        dt__cli_err("dtrain train: --assistant-only-loss takes GPT models on conversations: --data (and --val-data) "
                    "jsonl:FILE[,FILE...] or parquet:FILE[,FILE...] of \"messages\" lists, with a tokenizer that has "
                    "a chat template\n");
        return 2;
    }
    if (!strcmp(o->packing, "off") &&
        (!lm || !lm_text_spec(o->data) || (o->val_data && !lm_text_spec(o->val_data)))) {
        dt__cli_err("dtrain train: --packing off makes each record of text data one sample: --data (and --val-data) "
                    "text:, jsonl: or parquet: with a tokenizer (a token file has no records)\n");
        return 2;
    }
    if (o->loss_mask && (!lm || !records_spec(o->data) || (o->val_data && !records_spec(o->val_data)))) {
        dt__cli_err("dtrain train: --loss-mask takes GPT models on prompt/completion data: --data (and --val-data) "
                    "jsonl:FILE[,FILE...][,prompt=KEY,completion=KEY] (or parquet: so) with --tokenizer\n");
        return 2;
    }
    if (o->chat_template && (!lm || !o->tokenizer)) {
        dt__cli_err("dtrain train: --chat-template FILE replaces the chat template of the tokenizer: it goes with GPT "
                    "models and --tokenizer (or an hf:DIR model's own tokenizer.json)\n");
        return 2;
    }
    if (o->tokenizer && (!lm || o->vocab)) {
        dt__cli_err("dtrain train: --tokenizer goes with GPT models and text data, not with --vocab\n");
        return 2;
    }
    if (lm && o->sample_every && (lm_text_spec(o->data) || (o->val_data && lm_text_spec(o->val_data)))) {
        dt__cli_err("dtrain train: --sample-every takes its prompt from a token file: give --val-data "
                    "tokens:FILE, or leave --sample-every out with text data\n");
        return 2;
    }
    const char *shape_opt = o->n_layer ? "--n-layer" : o->n_head ? "--n-head" : o->n_embd ? "--n-embd"
                            : o->block_size ? "--block-size" : o->vocab_size ? "--vocab-size"
                            : o->dropout > 0 ? "--dropout" : NULL;
    if (!strncmp(o->model, "hf:", 3) && shape_opt) { /* it was ignored: config.json shapes the model its weights fit */
        dt__cli_err("dtrain train: --model %s: %s does not apply: the model's shape and dropout are its config.json's "
                    "(edit config.json to change them)\n", o->model, shape_opt);
        return 2;
    }
    if (!lm && (o->val_data || o->seq || o->n_layer || o->n_head || o->n_embd || o->block_size || o->vocab_size ||
                o->dropout > 0 || o->sample_every || o->vocab)) {
        dt__cli_err("dtrain train: --val-data, --seq, --n-layer, --n-head, --n-embd, --block-size, --vocab-size, "
                    "--dropout, --sample-every and --vocab apply to GPT models only\n");
        return 2;
    }
    if (lm && o->val_data && !lm_data_spec(o->val_data)) {
        dt__cli_err("dtrain train: --val-data %s: expected tokens:FILE, text:FILE, jsonl:FILE or parquet:FILE\n",
                    o->val_data);
        return 2;
    }
    if (lm && !o->val_data && !o->no_eval) {
        dt__cli_err("dtrain train: --model %s: give --val-data tokens:FILE (or --no-eval)\n", o->model);
        return 2;
    }
    if (!o->data)
        o->data = !strcmp(o->model, "mlp") ? "random" : "fashion-mnist";
    if (strcmp(o->data, "fashion-mnist") && strcmp(o->data, "random") &&
        !(!strncmp(o->data, "mnist:", 6) && o->data[6]) && !(!strncmp(o->data, "idx:", 4) && o->data[4]) &&
        !(!strncmp(o->data, "npy:", 4) && o->data[4]) && !(!strncmp(o->data, "csv:", 4) && o->data[4]) &&
        !(lm && lm_data_spec(o->data))) {
        dt__cli_err("dtrain train: --data %s: unknown data (expected fashion-mnist, mnist:DIR, idx:DIR, "
                    "npy:X.npy[,Y.npy], csv:FILE or random; tokens:FILE for GPT models)\n",
                o->data);
        return 2;
    }
    if (o->random_items && strcmp(o->data, "random")) {
        /* It sizes the generated data set only: silently training on the whole
         * of another data set would be a surprise (--limit-train does that). */
        dt__cli_err("dtrain train: --random-items sizes --data random only (got --data %s); --limit-train N "
                    "trains on the first N items of other data\n", o->data);
        return 2;
    }
    if (!strcmp(o->model, "convnet") && !strcmp(o->data, "random")) {
        dt__cli_err("dtrain train: --data random works with --model mlp only\n");
        return 2;
    }
    if (o->loss_scale >= 0 && !strcmp(o->precision, "bf16")) {
        dt__cli_err("dtrain train: --loss-scale with --precision bf16: bf16 has fp32's range and needs no "
                    "loss scaling (DeepSpeed forces scale 1)\n");
        return 2;
    }
    if ((o->betas || o->eps >= 0) && !strcmp(o->optimizer, "sgd")) {
        dt__cli_err("dtrain train: --%s applies to --optimizer %s (got sgd)\n", o->betas ? "betas" : "eps",
                    o->betas ? "adam, adamw, lamb and lion" : "adam, adamw and lamb");
        return 2;
    }
    if (o->eps >= 0 && !strcmp(o->optimizer, "lion")) {
        dt__cli_err("dtrain train: --eps applies to --optimizer adam, adamw and lamb (lion divides by nothing)\n");
        return 2;
    }
    /* Flags of a feature not chosen: refused, as they were ignored. With --config they are the file's keys (fp16.*,
       zero_optimization.*), which DeepSpeed takes and leaves unused as well. */
    if (o->fp16_flag && !o->config && strcmp(o->precision, "fp16")) {
        dt__cli_err("dtrain train: --%s applies to --precision fp16 (loss scaling; the precision is %s)\n",
                    o->fp16_flag, o->precision);
        return 2;
    }
    if (!o->config && ((o->zero_quant_block > 0 && !o->zero_qw) ||
                       ((o->zero_grad_bits || o->zero_grad_block > 0) && !o->zero_qg))) {
        const bool qw = o->zero_quant_block > 0 && !o->zero_qw;
        dt__cli_err("dtrain train: %s applies to %s (ZeRO++ %s)\n",
                    qw ? "--zero-quant-block" : o->zero_grad_bits ? "--zero-grad-bits" : "--zero-grad-block",
                    qw ? "--zero-quantized-weights" : "--zero-quantized-gradients", qw ? "qwZ" : "qgZ");
        return 2;
    }
    if (o->hf_shard_size && !o->save_hf) {
        dt__cli_err("dtrain train: --hf-shard-size applies to --save-hf DIR (the Hugging Face export's shards)\n");
        return 2;
    }
    /* (with --config they become scheduler.params keys, which its scheduler's type checks) */
    if ((o->step_size || o->gamma >= 0) && !o->config && strcmp(o->lr_schedule, "step")) { /* they were ignored */
        dt__cli_err("dtrain train: %s applies to --lr-schedule step only (the schedule is %s)\n",
                    o->step_size ? "--step-size" : "--gamma", o->lr_schedule);
        return 2;
    }
    if (o->sample_tokens && !o->sample_every) { /* it was ignored */
        dt__cli_err("dtrain train: --sample-tokens sets the length of --sample-every's samples: give --sample-every "
                    "STEPS too\n");
        return 2;
    }
    if (o->momentum > 0 && strcmp(o->optimizer, "sgd") != 0) {
        dt__cli_err("dtrain train: --momentum applies to --optimizer sgd only (got %s)\n",
                o->optimizer);
        return 2;
    }
    if (o->offload && strcmp(o->offload, "cpu") && !(!strncmp(o->offload, "nvme:", 5) && o->offload[5])) {
        dt__cli_err("dtrain train: --offload %s: expected cpu or nvme:DIR\n", o->offload);
        return 2;
    }
    const bool sub_groups = strcmp(o->optimizer, "lamb") != 0; /* the optimizers stepped in parts (offload) */
    if (o->offload && !strncmp(o->offload, "nvme:", 5) && !sub_groups) { /* was exit 1 at init */
        dt__cli_err("dtrain train: --offload nvme: does not combine with --optimizer lamb (its trust ratio needs "
                    "whole-tensor norms, which the sub-groups cannot give; sgd, adam, adamw and lion work)\n");
        return 2;
    }
    if (o->offload && !strncmp(o->offload, "nvme:", 5) && (o->save || o->resume)) {
        dt__cli_err("dtrain train: --offload nvme: does not combine with --save/--resume yet (the optimizer "
                    "state in files is not checkpointed)\n");
        return 2;
    }
    if ((o->mlp_dim || o->mlp_hidden) && strcmp(o->model, "mlp")) {
        dt__cli_err("dtrain train: --mlp-dim and --mlp-hidden apply to --model mlp only (got %s)\n", o->model);
        return 2;
    }
    if (!o->save && (o->save_every || o->keep || o->async_save)) {
        dt__cli_err("dtrain train: --%s needs --save DIR\n",
                    o->save_every ? "save-every" : o->keep ? "keep" : "async-save");
        return 2;
    }
    if (o->trace_steps) {
        dt_trace_params tp = dt_trace_params_default();
        if (!o->trace && !o->config) {
            dt__cli_err("dtrain train: --trace-steps needs --trace DIR (or dtrain.trace in --config)\n");
            return 2;
        }
        if (dt_trace_parse_steps(o->trace_steps, &tp) < 0) {
            dt__cli_err("dtrain train: --trace-steps: %s\n", dt_last_error());
            return 2;
        }
    }
    if (o->trace && !o->trace[0]) {
        dt__cli_err("dtrain train: --trace: give a directory\n");
        return 2;
    }
    if (o->resume && !strcmp(o->resume, "auto") && !o->save) {
        dt__cli_err("dtrain train: --resume auto needs --save DIR (the directory it resumes from)\n");
        return 2;
    }
    if (o->resume && o->init_from) {
        dt__cli_err("dtrain train: --resume and --init-from exclude each other (a checkpoint has its weights)\n");
        return 2;
    }
    const char *input;
    if (o->metrics && names_an_input(o, o->metrics, &input)) { /* the rename at the end would replace it */
        dt__cli_err("dtrain train: --metrics %s is also %s: give another file name\n", o->metrics, input);
        return 2;
    }
    if (o->metrics && !strcmp(o->metrics, "-")) {
        dt__cli_err("dtrain train: --metrics: give a file name (metrics are written to "
                        "FILE.partial and renamed at the end)\n");
        return 2;
    }
    if (o->zero && o->fsdp) {
        dt__cli_err("dtrain train: --zero and --fsdp name the same choice (stage 2 = shard_grad_op, stage 3 = "
                    "full_shard): give one\n");
        return 2;
    }
    bool sharded = (o->zero && strcmp(o->zero, "0")) || (o->fsdp && strcmp(o->fsdp, "no_shard"));
    if (!sharded && (o->wrap_min_params > 0 || o->forward_prefetch || strcmp(o->backward_prefetch, "backward_pre"))) {
        dt__cli_err("dtrain train: --wrap-min-params, --backward-prefetch and --forward-prefetch apply to --zero "
                    "1|2|3 or --fsdp shard_grad_op|full_shard\n");
        return 2;
    }
    bool stage3 = (o->zero && !strcmp(o->zero, "3")) || (o->fsdp && !strcmp(o->fsdp, "full_shard"));
    if (o->offload_param && strcmp(o->offload_param, "cpu") &&
        !(!strncmp(o->offload_param, "nvme:", 5) && o->offload_param[5])) {
        dt__cli_err("dtrain train: --offload-param %s: expected cpu or nvme:DIR\n", o->offload_param);
        return 2;
    }
    if (o->offload_param && !(stage3 || (o->fsdp && !strcmp(o->fsdp, "hybrid_shard")))) { /* cpu was ignored */
        dt__cli_err("dtrain train: --offload-param %s moves ZeRO-3's parameter shards: it needs --zero 3 (or --fsdp "
                    "full_shard or hybrid_shard)\n", o->offload_param);
        return 2;
    }
    if (o->offload_param && !strncmp(o->offload_param, "nvme:", 5) && (o->save || o->resume)) {
        dt__cli_err("dtrain train: --offload-param nvme: does not combine with --save/--resume yet (the shards in "
                    "files are not checkpointed)\n");
        return 2;
    }
    if (o->offload_param && !strncmp(o->offload_param, "nvme:", 5) &&
        (!sub_groups || strcmp(o->precision, "fp32"))) { /* both were exit 1 at init */
        dt__cli_err("dtrain train: --offload-param nvme: steps f32 parameters unit by unit with sgd, adam, adamw or "
                    "lion: not %s yet\n", sub_groups ? "--precision bf16/fp16 (mixed precision)"
                                                     : "--optimizer lamb (its trust ratio needs whole-tensor norms)");
        return 2;
    }
    if (stage3 && o->init_from) {
        dt__cli_err("dtrain train: --init-from does not work with sharded parameters (--zero 3, --fsdp full_shard) "
                    "yet\n");
        return 2;
    }
    if (o->pp > 1 || o->micro_batches || o->pp_schedule || o->pp_balance) {
        const char *no = o->pp <= 1 ? "no --pp (they are pipeline options)"
                         : (o->zero && strcmp(o->zero, "0") && strcmp(o->zero, "1")) || o->fsdp
                             ? "--zero 2|3 or --fsdp (the data-parallel dimension runs DDP or --zero 1)"
                         : o->sync_bn ? "--sync-bn"
                         : o->offload ? "--offload"
                         : !strcmp(o->model, "convnet")
                             ? "--model convnet (the ConvNet cannot be cut into pipeline stages: it is one module "
                               "with its own forward, not a Sequential of layers; --pp works with mlp and the GPT "
                               "models)"
                             : NULL;
        if (no) {
            dt__cli_err("dtrain train: --pp/--pp-schedule/--pp-balance/--micro-batches do not combine with %s\n", no);
            return 2;
        }
        int64_t mb = o->micro_batches ? o->micro_batches : 4;
        if (o->batch % mb) {
            dt__cli_err("dtrain train: --batch %lld does not split into --micro-batches %lld\n", (long long)o->batch,
                        (long long)mb);
            return 2;
        }
    }
    if (o->sequence_parallel && (o->tp <= 1 || !strncmp(o->model, "mlp", 3) || !strcmp(o->model, "convnet"))) {
        dt__cli_err("dtrain train: --sequence-parallel needs a GPT or Llama model and --tp N > 1\n");
        return 2;
    }
    if (o->cp > 1 && o->lora_dropout > 0) { /* the models refuse it too (--lora-from's dropout) */
        dt__cli_err("dtrain train: --lora-dropout does not combine with --cp %lld: its masks follow a rank's rows, not "
                    "the positions (LoRA without dropout does)\n", (long long)o->cp);
        return 2;
    }
    if ((o->cp_impl || o->cp_balance) && o->cp <= 1) {
        dt__cli_err("dtrain train: --cp-impl and --cp-balance need --cp N > 1\n");
        return 2;
    }
    if (o->cp > 1) {
        const char *no = !strcmp(o->model, "convnet") || !strncmp(o->model, "mlp", 3)
                             ? "this --model (it has no sequence to split: GPT and Llama models have)"
                         : o->sample_every ? "--sample-every (generation runs on one rank; the ranks of a "
                                             "context-parallel model run the forward together)"
                         : o->offload ? "--offload" : NULL;
        if (no) {
            dt__cli_err("dtrain train: --cp %lld does not combine with %s\n", (long long)o->cp, no);
            return 2;
        }
    }
    if (o->tp > 1) {
        const char *no = !strcmp(o->model, "convnet") ? "--model convnet"
                         : (o->zero && strcmp(o->zero, "0") && strcmp(o->zero, "1")) || o->fsdp
                             ? "--zero 2|3 or --fsdp (the data-parallel dimension of a tensor-parallel model runs DDP "
                               "or --zero 1)"
                         : o->sample_every ? "--sample-every (the vocabulary-parallel head leaves each tp rank a "
                                             "slice of the logits; sampling needs them whole)"
                         : o->sync_bn ? "--sync-bn"
                         : o->offload ? "--offload" : NULL;
        if (no) {
            dt__cli_err("dtrain train: --tp %lld does not combine with %s\n", (long long)o->tp, no);
            return 2;
        }
    }
    if (sharded && o->sync_bn) {
        dt__cli_err("dtrain train: --sync-bn works with DDP only so far (not with --zero / --fsdp)\n");
        return 2;
    }
    return 0;
}

/* --comm-hook and the --powersgd-* options, then AIAK's variables over
 * them (dt_comm_hook_env); the hook and a ZeRO stage are the plan's check
 * (train_ddp.c). ws: the world size (a note at one rank). */
int dt__train_comm_hook(const dt__train_opts *o, int ws, dt_comm_hook_kind *hook, dt_powersgd_params *psgd)
{
    *hook = DT_COMM_HOOK_ALLREDUCE;
    *psgd = dt_powersgd_params_default();
    if (o->comm_hook && dt_comm_hook_parse(o->comm_hook, hook) < 0)
        return dt__cli_err("dtrain train: --comm-hook: %s\n", dt_last_error()), 2;
    if (o->powersgd_rank > 0)
        psgd->rank = (int)o->powersgd_rank;
    if (o->powersgd_start_iter >= 0)
        psgd->start_iter = o->powersgd_start_iter;
    psgd->use_error_feedback = !o->powersgd_no_error_feedback;
    psgd->warm_start = !o->powersgd_no_warm_start;
    if (dt_comm_hook_env(hook, psgd) < 0)
        return dt__cli_err("dtrain train: %s\n", dt_last_error()), 2;
    if ((o->powersgd_rank > 0 || o->powersgd_start_iter >= 0 || o->powersgd_no_error_feedback ||
         o->powersgd_no_warm_start) && *hook != DT_COMM_HOOK_POWERSGD)
        return dt__cli_err("dtrain train: the --powersgd-* options need --comm-hook powersgd (the hook is %s)\n",
                           dt_comm_hook_name(*hook)), 2;
    const char *want = *hook == DT_COMM_HOOK_FP16 ? "fp16" : *hook == DT_COMM_HOOK_BF16 ? "bf16" : "fp32";
    if (*hook != DT_COMM_HOOK_ALLREDUCE && o->reduce_dtype && strcmp(o->reduce_dtype, want))
        return dt__cli_err("dtrain train: --comm-hook %s reduces in %s; --reduce-dtype %s contradicts it (drop one)\n",
                           dt_comm_hook_name(*hook), want, o->reduce_dtype), 2;
    if (*hook != DT_COMM_HOOK_ALLREDUCE && ws <= 1)
        fprintf(stderr, "dtrain train: note: --comm-hook %s has no effect on one rank (nothing is reduced)\n",
                dt_comm_hook_name(*hook));
    return 0;
}
