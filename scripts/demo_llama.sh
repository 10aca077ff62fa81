#!/usr/bin/env bash
# make demo-llama: train the small Llama decoder (llama-tiny: RMSNorm, rotary
# embeddings, 4 query heads sharing 2 key/value heads, SwiGLU) from scratch on
# the King James Bible for a short run (about a minute on 2 cores) with a
# Hugging Face tokenizer.json that dtrain wrote (dtrain tokenize --train-vocab
# N kjv.txt -o tokenizer.json: a byte-level BPE learned on the Bible, plus
# <|endoftext|>), write it as a Hugging Face model directory (--save-hf: the
# weights, config.json and the tokenizer files), and generate a greedy
# continuation of a text prompt from that directory through its
# tokenizer.json. The text comes from scripts/gpt_data.sh (make
# demo-gpt-data). Not part of make test.
#   DT_DEMO_LLAMA_STEPS   optimizer steps (default 300: 307 k tokens)
#   DT_DEMO_LLAMA_ARGS    extra `dtrain train` arguments (e.g. "--n-layer 4")
#   DT_DEMO_LLAMA_PROMPT  the prompt (default "And God said")
# With PEER_PYTHON naming a python that has transformers, the demo also loads
# the directory with AutoModelForCausalLM and AutoTokenizer, encodes the
# prompt, and prints transformers' greedy continuation next to dtrain's (the
# same ids and the same text).
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
# the tokenizer.json (the same merges as kjv.bpe: training is deterministic) and the Bible's ids through it
tok="$out/tokenizer.json"
if [ ! -s "$tok" ] || [ ! "$tok" -nt "$cli" ] || [ "$(cat "$out/vocab_size" 2>/dev/null)" != "$vocab" ]; then
  "$cli" tokenize --train-vocab "$vocab" "$data/kjv.txt" -o "$tok"
  "$cli" tokenize --tokenizer "$tok" "$data/kjv.txt" -o "$out/train.bin" --val-fraction 0.1 --val-out "$out/val.bin"
  echo "$vocab" > "$out/vocab_size"
fi
# llama-tiny (2 layers, width 64) with the tokenizer's vocabulary (its size: the BPE's ids and
# <|endoftext|>) over windows of 128 tokens; --save-hf writes the tokenizer files beside the weights
cmd=("$cli" train --model llama-tiny --tokenizer "$tok" --seq 128 --batch 8 --optimizer adamw --lr 3e-3
     --warmup 30 --seed 0 --max-steps "$steps" --data "tokens:$out/train.bin" --val-data "tokens:$out/val.bin"
     --limit-test 64 --eval-every "$steps" --log-every 50 --metrics "$out/metrics.jsonl" --save-hf "$out/hf")
# shellcheck disable=SC2206
[ -n "${DT_DEMO_LLAMA_ARGS:-}" ] && cmd+=(${DT_DEMO_LLAMA_ARGS})
echo "+ ${cmd[*]}"
"${cmd[@]}" | tee "$out/train.log"
base=$(sed -n 's/^unigram cross-entropy .*: \([0-9.]*\) nats per token$/\1/p' "$out/data.log" | tail -1)
val=$(sed -n 's/^val loss: \([0-9.]*\).*/\1/p' "$out/train.log" | tail -1)
echo
echo "validation loss after $steps steps: ${val:-?} nats per token (unigram baseline ${base:-?}; ln $((vocab + 1)) = $(awk "BEGIN{printf \"%.2f\", log($vocab + 1)}"): the BPE ids and <|endoftext|>)"
echo "Hugging Face model directory: $out/hf ($(ls "$out/hf" | tr '\n' ' '))"
# the prompt through the directory's tokenizer.json, the continuation decoded through it
gen=("$cli" generate --model "hf:$out/hf" --prompt "$prompt" --temperature 0 --max-new-tokens 24)
echo "+ ${gen[*]}"
"${gen[@]}" | tee "$out/generate.log"
if [ -n "${PEER_PYTHON:-}" ] && "$PEER_PYTHON" -c 'import transformers' 2>/dev/null; then
  "$PEER_PYTHON" - "$cli" "$out/hf" "$prompt" "$out/generate.log" <<'PY'
import subprocess, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
cli, hf, text, log = sys.argv[1:5]
tok = AutoTokenizer.from_pretrained(hf)
prompt = tok(text)["input_ids"]
line = subprocess.run([cli, "generate", "--model", "hf:" + hf, "--prompt-ids", ",".join(map(str, prompt)),
                       "--temperature", "0", "--max-new-tokens", "24"], check=True, capture_output=True,
                      text=True).stdout.strip().splitlines()[-1]
ours = [int(t) for t in line.split("|")[1].split()]
model = AutoModelForCausalLM.from_pretrained(hf).eval()
with torch.no_grad():
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         max_new_tokens=len(ours), do_sample=False)
theirs = out[0, len(prompt):].tolist()
ours_text = open(log, encoding="utf-8").read()[:-1]  # dtrain generate ends the text with one newline of its own
theirs_text = tok.decode(out[0].tolist())
print("dtrain generate ids:     ", " ".join(map(str, ours)))
print("transformers greedy ids: ", " ".join(map(str, theirs)))
print("transformers text:       ", repr(theirs_text))
same = theirs == ours and theirs_text == ours_text
print("transformers loads the directory and its tokenizer and continues with the same tokens and text" if same
      else "transformers' continuation differs from dtrain's (dtrain's text: %r)" % ours_text)
sys.exit(0 if same else 1)
PY
fi
