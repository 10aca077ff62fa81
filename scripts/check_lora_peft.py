"""Peer check (never a build or test dependency): the LoRA adapters a dtrain
run wrote with --save-lora load into Hugging Face PEFT on the same base
weights, and hold the values of the run's checkpoint.

    build/dtrain train --model gpt-micro --data tokens:T.bin --no-eval --vocab-size V --max-steps 5 \\
        --optimizer adamw --lora-targets c_attn,c_proj,c_fc --lora-r 4 --lora-alpha 16 --save CK --save-lora AD
    $PEER_PYTHON scripts/check_lora_peft.py CK/step-00000005 AD N_HEAD
"""
import json
import sys

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    ck, ad, n_head = sys.argv[1], sys.argv[2], int(sys.argv[3])
    idx = json.load(open(ck + "/index.json"))["tensors"]
    sd = load_file(ck + "/rank-00000.safetensors")  # a one-rank checkpoint: every tensor in one chunk
    sd = {k: v.reshape(idx[k]["shape"]) for k, v in sd.items() if k in idx and not k.startswith("optim.")}
    base = {k: v for k, v in sd.items() if "lora_" not in k}
    lora = {k: v for k, v in sd.items() if "lora_" in k}
    wte = base["transformer.wte.weight"]
    n_layer = 1 + max(int(k.split(".")[2]) for k in base if k.startswith("transformer.h."))
    cfg = GPT2Config(vocab_size=wte.shape[0], n_positions=base["transformer.wpe.weight"].shape[0],
                     n_embd=wte.shape[1], n_layer=n_layer, n_head=n_head)
    m = GPT2LMHeadModel(cfg)
    missing, unexpected = m.load_state_dict(base, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    pm = PeftModel.from_pretrained(m, ad)
    got = {k: v for k, v in pm.state_dict().items() if "lora_" in k}
    assert len(got) == len(lora), (len(got), len(lora))
    for k, v in lora.items():
        pk = "base_model.model." + k.replace(".weight", ".default.weight")
        assert torch.equal(got[pk], v), k
    print(f"PEFT loaded {len(lora)} adapter tensors equal to the checkpoint's")


if __name__ == "__main__":
    main()
