#!/usr/bin/env bash
# make demo-llama: train the small Llama decoder (llama-tiny: RMSNorm, rotary
# embeddings, 4 query heads sharing 2 key/value heads, SwiGLU) from scratch on
# the King James Bible for a short run (about a minute on 2 cores), write it
# as a Hugging Face model directory (--save-hf), and generate a greedy
# continuation of a prompt from that directory. The data come from
# scripts/gpt_data.sh (make demo-gpt-data: the Bible text, a byte-level BPE
# vocabulary learned on it, token files). Not part of make test.
#   DT_DEMO_LLAMA_STEPS   optimizer steps (default 300: 307 k tokens)
#   DT_DEMO_LLAMA_ARGS    extra `dtrain train` arguments (e.g. "--n-layer 4")
#   DT_DEMO_LLAMA_PROMPT  the prompt (default "And God said")
# With PEER_PYTHON naming a python that has transformers, the demo also loads
# the directory with transformers and prints its greedy continuation of the
# same prompt ids (the same tokens as dtrain's).
set -euo pipefail
cd "$(dirname "$0")/.."
cli=${DT_CLI:-build/dtrain}
data=${DT_GPT_DATA_DIR:-build/gpt-data}
out=${DT_DEMO_DIR:-build/demo-llama}
steps=${DT_DEMO_LLAMA_STEPS:-300}
prompt=${DT_DEMO_LLAMA_PROMPT:-And God said}
mkdir -p "$out"
scripts/gpt_data.sh | tee "$out/data.log"
vocab=$(cat "$data/vocab_size")
rm -rf "$out/hf"
# llama-tiny (2 layers, width 64) with the Bible's vocabulary over windows of 128 tokens
cmd=("$cli" train --model llama-tiny --vocab-size "$vocab" --seq 128 --batch 8 --optimizer adamw --lr 3e-3
     --warmup 30 --seed 0 --max-steps "$steps" --data "tokens:$data/train.bin" --val-data "tokens:$data/val.bin"
     --limit-test 64 --eval-every "$steps" --log-every 50 --metrics "$out/metrics.jsonl" --save-hf "$out/hf")
# shellcheck disable=SC2206
[ -n "${DT_DEMO_LLAMA_ARGS:-}" ] && cmd+=(${DT_DEMO_LLAMA_ARGS})
echo "+ ${cmd[*]}"
"${cmd[@]}" | tee "$out/train.log"
base=$(sed -n 's/^unigram cross-entropy .*: \([0-9.]*\) nats per token$/\1/p' "$out/data.log" | tail -1)
val=$(sed -n 's/^val loss: \([0-9.]*\).*/\1/p' "$out/train.log" | tail -1)
echo
echo "validation loss after $steps steps: ${val:-?} nats per token (unigram baseline ${base:-?}; ln $vocab = $(awk "BEGIN{printf \"%.2f\", log($vocab)}"))"
echo "Hugging Face model directory: $out/hf ($(ls "$out/hf" | tr '\n' ' '))"
gen=("$cli" generate --model "hf:$out/hf" --vocab "$data/kjv.bpe" --prompt "$prompt" --temperature 0
     --max-new-tokens 24)
echo "+ ${gen[*]}"
"${gen[@]}" | tee "$out/generate.log"
if [ -n "${PEER_PYTHON:-}" ] && "$PEER_PYTHON" -c 'import transformers' 2>/dev/null; then
  printf '%s' "$prompt" > "$out/prompt.txt"
  "$cli" tokenize --vocab "$data/kjv.bpe" "$out/prompt.txt" -o "$out/prompt.bin" > /dev/null
  "$PEER_PYTHON" - "$cli" "$out/hf" "$out/prompt.bin" <<'PY'
import struct, subprocess, sys, torch
from transformers import AutoModelForCausalLM
cli, hf, pbin = sys.argv[1:4]
raw = open(pbin, "rb").read()
n = struct.unpack_from("<i", raw, 8)[0]  # llm.c token file: 256 int32 header (magic, version, count)
prompt = list(struct.unpack_from("<%dH" % n, raw, 1024))
line = subprocess.run([cli, "generate", "--model", "hf:" + hf, "--prompt-ids", ",".join(map(str, prompt)),
                       "--temperature", "0", "--max-new-tokens", "24"], check=True, capture_output=True,
                      text=True).stdout.strip().splitlines()[-1]
ours = [int(t) for t in line.split("|")[1].split()]
model = AutoModelForCausalLM.from_pretrained(hf).eval()
with torch.no_grad():
    out = model.generate(torch.tensor([prompt]), max_new_tokens=len(ours), do_sample=False)
theirs = out[0, len(prompt):].tolist()
print("dtrain generate ids:     ", " ".join(map(str, ours)))
print("transformers greedy ids: ", " ".join(map(str, theirs)))
print("transformers loads the directory and continues with the same tokens" if theirs == ours else
      "transformers' continuation differs from dtrain's")
PY
fi
