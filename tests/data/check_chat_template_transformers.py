#!/usr/bin/env python3
"""dtrain's chat templates against transformers' apply_chat_template, end to end.

For every tests/data/chat_template/*.jinja and every conversation of
conversations.json, a tokenizer directory is made (tests/data/tokenizer/
llama3.json as its tokenizer.json, a tokenizer_config.json holding the
template) and both sides render the conversation: transformers'
AutoTokenizer.from_pretrained(DIR).apply_chat_template(messages, tools=...,
add_generation_prompt=..., tokenize=False, **the other variables) against
libdtrain's dt_tokenizer_load(DIR) + dt_tokenizer_render_chat, then the ids
(tokenizer(text, add_special_tokens=False) against dt_tokenizer_encode with
add_special false); each conversation once more with
continue_final_message=True (DT_CHAT_CONTINUE). Equal text and ids, or an
error on both sides, count as equal. Where test_chat_template.c checks the renderer against jinja2 with
the variables given as they are, this checks what transformers itself hands
the template (null keys dropped, tools and documents None, the special
tokens, reasoning aliases). Then, for two templates that mark the
assistant's turns with {% generation %}, transformers'
return_assistant_tokens_mask against the targets dt_dataset_text_open
counts under assistant_only_loss.

Reference only, never a build or test dependency: run it with a Python that
has transformers (5.x) after building dtrain:

    PEER_PYTHON=/path/to/python; $PEER_PYTHON tests/data/check_chat_template_transformers.py [build/libdtrain.so]

Exits 1 when a pair differs (each named).
"""
import ctypes
import glob
import json
import os
import shutil
import sys
import tempfile

import transformers
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
lib = ctypes.CDLL(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "libdtrain.so"))
P = ctypes.POINTER
lib.dt_tokenizer_load.argtypes = [ctypes.c_char_p, P(ctypes.c_void_p)]
lib.dt_tokenizer_render_chat.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int,
                                         ctypes.c_char_p, ctypes.c_size_t, P(ctypes.c_void_p), P(ctypes.c_size_t)]
lib.dt_tokenizer_encode.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int,
                                    P(P(ctypes.c_uint32)), P(ctypes.c_int64)]
lib.dt_last_error.restype = ctypes.c_char_p
lib.dt_tokenizer_free.argtypes = [ctypes.c_void_p]
libc = ctypes.CDLL(None)
libc.free.argtypes = [ctypes.c_void_p]

data = os.path.join(ROOT, "tests", "data")
convs = json.load(open(os.path.join(data, "chat_template", "conversations.json")))
work = tempfile.mkdtemp(prefix="dt_chat_check_")
equal, continued, differ = 0, 0, []
for path in sorted(glob.glob(os.path.join(data, "chat_template", "*.jinja"))):
    d = os.path.join(work, "tok")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    shutil.copy(os.path.join(data, "tokenizer", "llama3.json"), os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": "<|end_of_text|>",
                   "chat_template": open(path).read(), "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    hf = AutoTokenizer.from_pretrained(d)
    tok = ctypes.c_void_p()
    if lib.dt_tokenizer_load(d.encode(), ctypes.byref(tok)) != 0:
        sys.exit("dt_tokenizer_load: " + lib.dt_last_error().decode())
    for conv, end in [(c, e) for c in convs for e in ("plain", "continue")]:
        name = "%s/%s%s" % (os.path.basename(path), conv["name"], " (continue_final_message)" * (end == "continue"))
        v = dict(conv["vars"])
        msgs, agp = v.pop("messages"), v.pop("add_generation_prompt", False)
        for k in ("bos_token", "eos_token", "unk_token", "pad_token"):  # the tokenizer's own
            v.pop(k, None)
        tools = v.pop("tools", None)
        cont = end == "continue"
        if cont:
            agp = False  # apply_chat_template refuses both
        try:
            want = hf.apply_chat_template(msgs, tools=tools, add_generation_prompt=agp, tokenize=False,
                                          continue_final_message=cont, **v)
            want_ids = hf(want, add_special_tokens=False)["input_ids"]
        except Exception as e:  # the template's own error: dtrain must fail too
            want = None
            why = str(e)
        kw = dict(v, **({"tools": tools} if tools is not None else {}))
        cj, kj = json.dumps(msgs).encode(), json.dumps(kw).encode()
        out, n = ctypes.c_void_p(), ctypes.c_size_t()
        rc = lib.dt_tokenizer_render_chat(tok, cj, len(cj), 2 if cont else int(agp), kj, len(kj), ctypes.byref(out),
                                          ctypes.byref(n))
        if rc != 0:
            if want is None:
                equal += 1
                continued += cont
            else:
                differ.append("%s: dtrain failed: %s" % (name, lib.dt_last_error().decode()))
            continue
        got = ctypes.string_at(out, n.value)
        libc.free(out)
        if want is None:
            differ.append("%s: transformers failed (%s), dtrain rendered" % (name, why))
            continue
        if got.decode() != want:
            differ.append("%s: text differs:\n  dtrain       %r\n  transformers %r" % (name, got.decode(), want))
            continue
        ids, ni = P(ctypes.c_uint32)(), ctypes.c_int64()
        if lib.dt_tokenizer_encode(tok, got, len(got), False, ctypes.byref(ids), ctypes.byref(ni)) != 0:
            sys.exit("dt_tokenizer_encode: " + lib.dt_last_error().decode())
        got_ids = [ids[i] for i in range(ni.value)]
        libc.free(ids)
        if got_ids != want_ids:
            differ.append("%s: ids differ" % name)
            continue
        equal += 1
        continued += cont
    lib.dt_tokenizer_free(tok)

# The assistant mask: transformers' apply_chat_template(return_assistant_tokens_mask=True) against the targets
# dt_dataset_text_open counts under assistant_only_loss, for templates that mark the assistant's turns.
GEN_TEMPLATES = {
    "chatml_gen": "{% for m in messages %}{% if m.role == 'assistant' %}<|start_header_id|>assistant\n"
                  "{% generation %}{{ m.content }}<|eot_id|>{% endgeneration %}\n{% else %}<|start_header_id|>"
                  "{{ m.role }}\n{{ m.content }}<|eot_id|>\n{% endif %}{% endfor %}"
                  "{% if add_generation_prompt %}<|start_header_id|>assistant\n{% endif %}",
    "llama3_gen": "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
                  "{% if m.role == 'assistant' %}{% generation %}{{ m.content | trim }}<|eot_id|>{% endgeneration %}"
                  "{% else %}{{ m.content | trim }}<|eot_id|>{% endif %}{% endfor %}",
}


class Params(ctypes.Structure):
    _fields_ = [("seq_len", ctypes.c_int64), ("stride", ctypes.c_int64), ("vocab_size", ctypes.c_int64),
                ("completion_only_loss", ctypes.c_bool), ("assistant_only_loss", ctypes.c_bool),
                ("per_record", ctypes.c_bool)]


lib.dt_tokens_params_default.restype = Params
lib.dt_dataset_text_open.argtypes = [ctypes.c_char_p, ctypes.c_void_p, P(Params), P(ctypes.c_void_p)]
lib.dt_dataset_length.argtypes = [ctypes.c_void_p]
lib.dt_dataset_length.restype = ctypes.c_int64
lib.dt_dataset_get_item.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
lib.dt_dataset_free.argtypes = [ctypes.c_void_p]
masked = 0
for gname, gt in GEN_TEMPLATES.items():
    d = os.path.join(work, "tok")
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": gt,
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    hf = AutoTokenizer.from_pretrained(d)
    tok = ctypes.c_void_p()
    if lib.dt_tokenizer_load(d.encode(), ctypes.byref(tok)) != 0:
        sys.exit("dt_tokenizer_load: " + lib.dt_last_error().decode())
    for conv in convs:
        name = "%s/%s (assistant mask)" % (gname, conv["name"])
        msgs = conv["vars"]["messages"]
        try:
            r = hf.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
            want_ids, want_mask = list(r["input_ids"]), list(r["assistant_masks"])
            if 1 not in want_mask:
                want_ids = None  # TRL refuses a conversation without assistant tokens
        except Exception:
            want_ids = None
        line = os.path.join(work, "conv.jsonl")
        with open(line, "w") as f:
            f.write(json.dumps({"messages": msgs}) + "\n")
        p = lib.dt_tokens_params_default()
        p.seq_len, p.stride, p.assistant_only_loss = 1, 1, True
        ds = ctypes.c_void_p()
        rc = lib.dt_dataset_text_open(("jsonl:" + line).encode(), tok, ctypes.byref(p), ctypes.byref(ds))
        if rc != 0:
            if want_ids is None:
                equal += 1
            else:
                differ.append("%s: dtrain failed: %s" % (name, lib.dt_last_error().decode()))
            continue
        n = lib.dt_dataset_length(ds)
        x, y = ctypes.c_int64(), ctypes.c_int64()
        mask = []  # of tokens 1..n: token i + 1 is item i's target (the first token is never the assistant's)
        for i in range(n):
            lib.dt_dataset_get_item(ds, i, ctypes.byref(x), ctypes.byref(y))
            mask.append(0 if y.value == -100 else 1)
        lib.dt_dataset_free(ds)
        if want_ids is None:
            differ.append("%s: transformers/TRL refuse it, dtrain took it" % name)
            continue
        if len(mask) != len(want_mask) - 1 or mask != want_mask[1:]:
            differ.append("%s: masks differ:\n  dtrain       %s\n  transformers %s" % (name, mask, want_mask[1:]))
            continue
        equal += 1
        masked += 1
    lib.dt_tokenizer_free(tok)
shutil.rmtree(work, ignore_errors=True)
for line in differ:
    print(line)
print("transformers %s: %d equal (%d of them continue_final_message, %d assistant masks with assistant tokens), "
      "%d different" % (transformers.__version__, equal, continued, masked, len(differ)))
sys.exit(1 if differ else 0)
