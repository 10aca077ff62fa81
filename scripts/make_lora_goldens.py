#!/usr/bin/env python3
"""Golden files for dtrain's LoRA parity test with Hugging Face PEFT
(tests/nn/test_lora_peft.c), on the base model of tests/data/hf/llama
(a LlamaForCausalLM with GQA: 4 heads over 2 kv heads, head_dim 12, untied
head, llama3 rope; made by scripts/make_hf_goldens.py).

  init/    PEFT's adapters at the start (get_peft_model after
           torch.manual_seed(5): A kaiming-uniform, B zeros), save_pretrained
  after/   PEFT's adapters after 10 AdamW steps (lr 1e-2, betas 0.9/0.999,
           eps 1e-8, weight decay 0.1, f32), save_pretrained
  ref.safetensors:
           input_ids [2, 2, 17] (I64): step k trains on input_ids[k % 2]
           (next-token loss of ids[:, :16] against ids[:, 1:]);
           loss [10] (F32): the loss before each step;
           merged.<param> (F32): each targeted weight of
           merge_and_unload() of the trained model (what its
           save_pretrained writes)

LoraConfig: r 4, lora_alpha 8 (scaling 2), targets q_proj, v_proj, o_proj,
down_proj, dropout 0, task CAUSAL_LM.

  gemma3_mm/  PEFT's adapters on Gemma 3's image-text model
           (Gemma3ForConditionalGeneration, tests/data/hf/gemma3_mm: gemma3's
           language model, a 1-layer SigLIP vision tower) with target_modules
           "all-linear" (r 4, lora_alpha 8): PEFT saves the layers it chose
           (the language model's q/k/v/o/gate/up/down_proj and the vision
           tower's q/k/v/out_proj, fc1, fc2) under the modules' names,
           base_model.model.model.language_model.* and
           base_model.model.model.vision_tower.*; every lora_B drawn
           N(0, 0.2) (after torch.manual_seed(7)) so that the adapters move
           the logits
  gemma3_mm_ref.safetensors:
           input_ids [2, 17] (I64, ids below the image tokens 120..122),
           logits [2, 16, V] of input_ids[:, :16] through the PEFT model
           (text only: the vision tower does not run), loss [] (their
           next-token loss against input_ids[:, 1:]), base_logits [2, 16, V]
           of the model without the adapters, eval []: the PEFT model's mean
           next-token loss over the 10 17-token windows (T = 16) of
           tests/data/hf/tokens.bin (what dtrain eval --lora-from prints)

  gemma3_mm_regex/  PEFT's adapters on the same image-text model with
           target_modules a regular expression, TARGET_RE below (layers 1
           and 3's q_proj and down_proj of the language model: PEFT
           matches it against each module's whole name), r 4, lora_alpha
           8, every lora_B drawn N(0, 0.2) (after torch.manual_seed(17))
  gemma3_mm_regex_ref.safetensors:
           input_ids, logits and base_logits as gemma3_mm_ref's, with these
           adapters

  dora_init/, dora_after/, dora_ref.safetensors:
           as init/, after/ and ref.safetensors with DoRA (use_dora=True,
           after torch.manual_seed(23)): each adapted layer also has
           lora_magnitude_vector [out], saved under
           base_model.model.<layer>.lora_magnitude_vector
  gpt2_dora_init/, gpt2_dora_after/, gpt2_dora_ref.safetensors:
           the same with DoRA on tests/data/hf/gpt2's Conv1D layers c_attn
           and c_proj (fan_in_fan_out=True, after torch.manual_seed(29)),
           input_ids below its vocabulary, the model's dropout off
  save_init/, save_after/, save_ref.safetensors:
           LoRA on q_proj and v_proj of the Llama with modules_to_save
           ["lm_head"] (after torch.manual_seed(37)): the head trains whole
           and is saved as base_model.model.lm_head.weight
  gpt2_bias_init/, gpt2_bias_after/, gpt2_bias_ref.safetensors:
           LoRA on GPT-2's c_attn with bias="all" (after
           torch.manual_seed(41)): every bias trains beside the adapters,
           an adapted layer's saved as <layer>.base_layer.bias

  pat_init/, pat_after/, pat_ref.safetensors:
           LoRA on q_proj, v_proj and o_proj of the Llama, r 3, lora_alpha 6,
           with rank_pattern PAT_RANK and alpha_pattern PAT_ALPHA below
           (after torch.manual_seed(43)): q_proj at rank 4 (scaling 1.5),
           layer 1's v_proj at rank 2 (scaling 3), o_proj alpha 32
           (scaling 32/3), layer 0's v_proj the default (scaling 2)
  excl_init/, excl_after/, excl_ref.safetensors:
           LoRA on q_proj and v_proj of the Llama with exclude_modules the
           regular expression EXCL_RE below (layer 1's q_proj; after
           torch.manual_seed(47)): that layer has no adapters

Usage: $PEER_PYTHON scripts/make_lora_goldens.py [tests/data]
       $PEER_PYTHON scripts/make_lora_goldens.py --pattern [tests/data]   (only the pat_ and excl_ files)
       $PEER_PYTHON scripts/make_lora_goldens.py --dora [tests/data]   (only the DoRA and save_ files)
       $PEER_PYTHON scripts/make_lora_goldens.py --check ADAPTER_DIR [tests/data]
The second form loads adapters another program wrote (dtrain train
--save-lora, or the test's own) with PeftModel.from_pretrained on the same
base, checks no key is missing or unexpected, and prints the loss of
input_ids[0] with them.
"""
import os
import struct
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import save_file
from transformers import Gemma3ForConditionalGeneration, LlamaForCausalLM

args = [a for a in sys.argv[1:] if a not in ("--check", "--dora", "--pattern")]
check = "--check" in sys.argv[1:]
dora_only = "--dora" in sys.argv[1:]
pattern_only = "--pattern" in sys.argv[1:]
PAT_RANK = {"q_proj": 4, "model.layers.1.self_attn.v_proj": 2}
PAT_ALPHA = {"o_proj": 32}
EXCL_RE = r"model\.layers\.1\.self_attn\.q_proj"
data = args[1] if check and len(args) > 1 else (args[0] if args and not check else "tests/data")
base_dir = os.path.join(data, "hf", "llama")
out = os.path.join(data, "lora")
T = 16
TARGETS = ["q_proj", "v_proj", "o_proj", "down_proj"]


def loss_of(model, ids):
    lg = model(ids[:, :T]).logits
    return torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), ids[:, 1:].reshape(-1))


if check:
    base = LlamaForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
    pm = PeftModel.from_pretrained(base, args[0])
    n = sum(1 for k in pm.state_dict() if "lora_" in k)
    ids = torch.randint(0, base.config.vocab_size, (2, 2, T + 1), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        print(f"PEFT loaded {args[0]}: {n} adapter tensors; loss of batch 0: {loss_of(pm.eval(), ids[0]).item():.8f}")
    sys.exit(0)


def train_save(pm, ids, name, targets):
    """10 AdamW steps of PEFT model pm on ids[k % 2]; its adapters before and after (out/NAME_init, out/NAME_after),
    the losses and the merged targets in out/NAME_ref.safetensors (name "": out/init, out/after, out/ref...)"""
    pre = name + "_" if name else ""
    pm.save_pretrained(os.path.join(out, pre + "init"))
    os.remove(os.path.join(out, pre + "init", "README.md"))  # a model card: not read by anybody
    pm.train()
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-2, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.1)
    losses = []
    for k in range(10):
        opt.zero_grad()
        l = loss_of(pm, ids[k % 2])
        losses.append(l.item())
        l.backward()
        opt.step()
    pm.save_pretrained(os.path.join(out, pre + "after"))
    os.remove(os.path.join(out, pre + "after", "README.md"))
    merged = pm.merge_and_unload()
    refs = {"input_ids": ids.clone(), "loss": torch.tensor(losses, dtype=torch.float32)}
    for pname, t in merged.state_dict().items():
        if any(pname.endswith(x + ".weight") for x in targets):
            refs["merged." + pname] = t.detach().clone().contiguous()
    save_file(refs, os.path.join(out, pre + "ref.safetensors"))
    print(name, "losses", " ".join(f"{x:.6f}" for x in losses))


if dora_only:
    from transformers import GPT2LMHeadModel
    base = LlamaForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
    ids = torch.randint(0, base.config.vocab_size, (2, 2, T + 1), generator=torch.Generator().manual_seed(11))
    torch.manual_seed(23)
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0, use_dora=True,
                                         task_type="CAUSAL_LM"))
    train_save(pm, ids, "dora", TARGETS)
    g = GPT2LMHeadModel.from_pretrained(os.path.join(data, "hf", "gpt2"), torch_dtype=torch.float32, resid_pdrop=0.0,
                                        embd_pdrop=0.0, attn_pdrop=0.0)  # deterministic steps
    gids = torch.randint(0, g.config.vocab_size, (2, 2, T + 1), generator=torch.Generator().manual_seed(31))
    torch.manual_seed(29)
    pm = get_peft_model(g, LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"], lora_dropout=0.0,
                                      use_dora=True, fan_in_fan_out=True, task_type="CAUSAL_LM"))
    train_save(pm, gids, "gpt2_dora", ["c_attn", "c_proj"])
    base = LlamaForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
    torch.manual_seed(37)
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                                         modules_to_save=["lm_head"], task_type="CAUSAL_LM"))
    train_save(pm, ids, "save", ["q_proj", "v_proj", "lm_head"])
    g = GPT2LMHeadModel.from_pretrained(os.path.join(data, "hf", "gpt2"), torch_dtype=torch.float32, resid_pdrop=0.0,
                                        embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(41)
    pm = get_peft_model(g, LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.0, bias="all",
                                      fan_in_fan_out=True, task_type="CAUSAL_LM"))
    train_save(pm, gids, "gpt2_bias", ["c_attn"])
    sys.exit(0)

def pattern_cases():
    base = LlamaForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
    ids = torch.randint(0, base.config.vocab_size, (2, 2, T + 1), generator=torch.Generator().manual_seed(11))
    torch.manual_seed(43)
    targets = ["q_proj", "v_proj", "o_proj"]
    pm = get_peft_model(base, LoraConfig(r=3, lora_alpha=6, target_modules=targets, lora_dropout=0.0,
                                         rank_pattern=PAT_RANK, alpha_pattern=PAT_ALPHA, task_type="CAUSAL_LM"))
    train_save(pm, ids, "pat", targets)
    base = LlamaForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
    torch.manual_seed(47)
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                                         exclude_modules=EXCL_RE, task_type="CAUSAL_LM"))
    train_save(pm, ids, "excl", ["q_proj", "v_proj"])


if pattern_only:
    pattern_cases()
    sys.exit(0)

os.makedirs(out, exist_ok=True)
base = LlamaForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
V = base.config.vocab_size
ids = torch.randint(0, V, (2, 2, T + 1), generator=torch.Generator().manual_seed(11))
torch.manual_seed(5)
cfg = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0, task_type="CAUSAL_LM")
train_save(get_peft_model(base, cfg), ids, "", TARGETS)

# Gemma 3's image-text model: adapters on target_modules, every lora_B drawn N(0, 0.2) after
# torch.manual_seed(seed) so that they move the logits; saved to out/name; the PEFT model and its logits on
# input_ids[:, :T] (text only: the vision tower does not run)
mm_ids = torch.randint(0, 120, (2, T + 1), generator=torch.Generator().manual_seed(13))


def mm_adapters(name, target_modules, seed):
    mm = Gemma3ForConditionalGeneration.from_pretrained(os.path.join(data, "hf", "gemma3_mm"),
                                                        torch_dtype=torch.float32).eval()
    torch.manual_seed(seed)
    pm = get_peft_model(mm, LoraConfig(r=4, lora_alpha=8, target_modules=target_modules, lora_dropout=0.0,
                                       task_type="CAUSAL_LM")).eval()
    with torch.no_grad():
        for pname, p in pm.named_parameters():
            if "lora_B" in pname:
                p.normal_(0, 0.2)
        lg = pm(input_ids=mm_ids[:, :T]).logits
    pm.save_pretrained(os.path.join(out, name))
    os.remove(os.path.join(out, name, "README.md"))
    print(name + ":", sum(1 for k in pm.state_dict() if "lora_" in k), "adapter tensors; they move the logits by "
          "up to", f"{(lg - base_logits).abs().max().item():.4f}")
    return pm, lg


with torch.no_grad():
    base_logits = Gemma3ForConditionalGeneration.from_pretrained(
        os.path.join(data, "hf", "gemma3_mm"), torch_dtype=torch.float32).eval()(input_ids=mm_ids[:, :T]).logits

# "all-linear": the language model's layers and the vision tower's
pm, lg = mm_adapters("gemma3_mm", "all-linear", 7)
with open(os.path.join(data, "hf", "tokens.bin"), "rb") as f:  # llm.c's: 256 int32 of header, then uint16 ids
    hdr = struct.unpack("<256i", f.read(1024))
    toks = list(struct.unpack(f"<{hdr[2]}H", f.read(2 * hdr[2])))
with torch.no_grad():
    windows = [torch.tensor(toks[w * T:w * T + T + 1]).unsqueeze(0) for w in range((len(toks) - 1) // T)]
    ev = sum(loss_of(pm, x).item() for x in windows) / len(windows)
save_file({"input_ids": mm_ids.clone(), "logits": lg.contiguous(), "loss": loss_of(pm, mm_ids).detach().reshape([]),
           "base_logits": base_logits.contiguous(), "eval": torch.tensor(ev, dtype=torch.float32).reshape([])},
          os.path.join(out, "gemma3_mm_ref.safetensors"))

# target_modules as a regular expression: the language model's layers 1 and 3, two kinds of layer each
TARGET_RE = r".*language_model.*layers\.[13]\.(self_attn\.q_proj|mlp\.down_proj)"
pm, lg = mm_adapters("gemma3_mm_regex", TARGET_RE, 17)
save_file({"input_ids": mm_ids.clone(), "logits": lg.contiguous(), "base_logits": base_logits.contiguous()},
          os.path.join(out, "gemma3_mm_regex_ref.safetensors"))
pattern_cases()
print("wrote", out)
