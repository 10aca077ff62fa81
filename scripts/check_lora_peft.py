"""Peer check (never a build or test dependency): the LoRA adapters a dtrain
run wrote with --save-lora load into Hugging Face PEFT on the same base
weights, and hold the values of the run's checkpoint.

    build/dtrain train --model gpt-micro --data tokens:T.bin --no-eval --vocab-size V --max-steps 5 \\
        --optimizer adamw --lora-targets c_attn,c_proj,c_fc --lora-r 4 --lora-alpha 16 --save CK --save-lora AD
    $PEER_PYTHON scripts/check_lora_peft.py CK/step-00000005 AD N_HEAD [VAL.bin T]

With VAL.bin and T it also prints PEFT's mean next-token loss over VAL.bin's
disjoint windows of T + 1 tokens, to hold against
    build/dtrain eval --ckpt CK/step-00000005 --val-data tokens:VAL.bin --seq T
(the checkpoint keeps its LoRA settings)
(gpt-micro, 5 AdamW steps on the Bible: 6.4512 both; the base alone 6.5724).
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
    cfg.activation_function = "gelu_new"  # GPT-2's tanh GELU, as dtrain's
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
    if len(sys.argv) > 5:
        import numpy as np
        t = np.fromfile(sys.argv[4], dtype="<u2", offset=1024).astype(np.int64)
        T = int(sys.argv[5])
        n = (len(t) - T - 1) // T + 1
        pm.eval()
        with torch.no_grad():
            losses = [torch.nn.functional.cross_entropy(pm(torch.tensor(t[i * T:i * T + T])[None]).logits[0],
                                                        torch.tensor(t[i * T + 1:i * T + T + 1])).item()
                      for i in range(n)]
        print(f"PEFT val loss {np.mean(losses):.6f} over {n} windows")


if __name__ == "__main__":
    main()
