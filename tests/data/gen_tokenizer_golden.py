"""Writes the tokenizer.json golden files tests/data/test_tokenizer_json.c
reads (reference only, never a build or test dependency; the small files
are committed). Needs a Python with `tokenizers` (and numpy), Debian's
`bible` (bible-kjv) and a built dtrain:

    DTRAIN=build/dtrain $PEER_PYTHON tests/data/gen_tokenizer_golden.py

Into tests/data/tokenizer/:
  gpt2.json     GPT-2 style: BPE trained by the tokenizers library on
                Genesis 1-25 (vocab 1000, every byte in the alphabet),
                ByteLevel(add_prefix_space=False) pre-tokenizer with GPT-2's
                regex, special token <|endoftext|>, merges as pairs
  llama3.json   Llama-3 style: Split(Llama-3's regex, Isolated) then
                ByteLevel(use_regex=False), ignore_merges, the Llama-3
                specials, TemplateProcessing "<|begin_of_text|> $A", a
                normalized added token and a single_word one; merges in the
                legacy "a b" string form
  roberta.json  RoBERTa style: ByteLevel(add_prefix_space=True),
                RobertaProcessing, <mask> with lstrip
  dtrain.json   written by `dtrain tokenize --train-vocab 700 ... -o X.json`
  bible.txt     Matthew 5-7 (not in the training text)
  unicode.txt   random text: letters of many scripts (Unicode 16 ones too),
                marks, digits of several kinds, emoji sequences, runs of
                every kind of whitespace, contractions in both cases,
                punctuation, symbols, the special tokens and near misses
  NAME.TEXT.ids       the library's ids, encode(text, add_special_tokens=False)
  llama3.TEXT.sp.ids  the same with add_special_tokens=True
ids files are little-endian uint32. The script also checks that the
library decodes every ids file back to its text (except roberta's, whose
add_prefix_space adds a space) and that dtrain.json gives the ids of
`dtrain tokenize --vocab` with the same vocabulary."""
import os
import random
import subprocess
import sys
import tempfile

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer")
DTRAIN = os.environ.get("DTRAIN", "build/dtrain")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def bible(ref):
    return subprocess.run(["bible", ref], check=True, capture_output=True, text=True).stdout


def train(tok, text, vocab_size, specials):
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    lines = text.splitlines(keepends=True)
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


def gpt2(text):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return train(tok, text, 1000, ["<|endoftext|>"])


def llama3(text):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                "<|eot_id|>"]
    train(tok, text, 1200, specials)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                      special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])])
    tok.add_tokens([AddedToken("Lord God", normalized=True, special=False),
                    AddedToken("thee", single_word=True, normalized=False, special=False)])
    return tok


def roberta(text):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    train(tok, text, 900, ["<s>", "<pad>", "</s>", "<unk>"])
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                      ("<s>", tok.token_to_id("<s>")))
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    return tok


def rand_unicode(seed=34, n=1500):
    r = random.Random(seed)
    scripts = [(0x41, 0x5A), (0x61, 0x7A), (0xC0, 0xFF), (0x100, 0x17F), (0x391, 0x3C9), (0x410, 0x44F),
               (0x531, 0x556), (0x5D0, 0x5EA), (0x627, 0x64A), (0x905, 0x939), (0x995, 0x9B9), (0xE01, 0xE2E),
               (0x10A0, 0x10C5), (0x1200, 0x1248), (0x13A0, 0x13F4), (0x3041, 0x3096), (0x30A1, 0x30FA),
               (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0x1D400, 0x1D44F), (0x1C89, 0x1C8A), (0x16D40, 0x16D42)]
    marks = ["\u0301", "\u0308", "\u064E", "\u093F", "\u094D", "\u0E31", "\u20E3", "\uFE0F"]
    digits = [(0x30, 0x39), (0x660, 0x669), (0xFF10, 0xFF19), (0x966, 0x96F)]
    numbers_other = ["\u00B2", "\u00BD", "\u216B", "\u2460"]
    emoji = ["\U0001F600", "\U0001F44D\U0001F3FD", "\U0001F468\u200D\U0001F469\u200D\U0001F467",
             "\U0001F1EB\U0001F1F7", "1\uFE0F\u20E3", "\u2764\uFE0F", "\U0001F9D1\u200D\U0001F4BB"]
    spaces = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n ", "\u00A0", "\u3000", "\u2028", "\u0085",
              "\u200B", "\u180E", " \t ", "\n   "]
    contractions = ["'s", "'S", "'t", "'T", "'re", "'RE", "'ve", "'Ve", "'m", "'M", "'ll", "'LL", "'d", "'D",
                    "'\u017F", "\u2019s", "'x"]
    punct = list(".,;:!?\u2014\u2013-()[]{}\u00AB\u00BB\u201E\u201C\"\u2026@#$%^&*+=<>|~`\\/") + [
        "\u2211", "\u221E", "\u2260", "\u20AC", "\u00A3", "\u00A5", "\u20B9", "\uE000", "\u0378", "\uFFFD"]
    specials = ["<|endoftext|>", "<|eot_id|>", "<|begin_of_text|>", "<mask>", "<|endof", "<|eot_id", "</s>",
                "<s>", "Lord God", "thee", "theeth"]
    out = []
    for _ in range(n):
        k = r.random()
        if k < 0.35:
            lo, hi = r.choice(scripts)
            w = "".join(chr(r.randint(lo, hi)) for _ in range(r.randint(1, 8)))
            if r.random() < 0.3:  # letters of several scripts in one word (Unicode 16 ones among them)
                w = "".join(chr(r.randint(*r.choice(scripts))) for _ in range(r.randint(2, 8)))
            if r.random() < 0.2:
                w += r.choice(marks)
            out.append(w)
        elif k < 0.45:
            lo, hi = r.choice(digits)
            out.append("".join(chr(r.randint(lo, hi)) for _ in range(r.randint(1, 8))))
        elif k < 0.48:
            out.append(r.choice(numbers_other))
        elif k < 0.55:
            out.append(r.choice(emoji))
        elif k < 0.75:
            out.append(r.choice(spaces))
        elif k < 0.82:
            out.append(r.choice(contractions))
        elif k < 0.94:
            out.append("".join(r.choice(punct) for _ in range(r.randint(1, 3))))
        else:
            out.append(r.choice(specials))
    return "".join(out)


def write_ids(name, ids):
    np.asarray(ids, dtype="<u4").tofile(os.path.join(HERE, name))


def main():
    os.makedirs(HERE, exist_ok=True)
    train_text = bible("Gen1:1-Gen25:34")
    texts = {"bible": bible("Mat5:1-Mat7:29"), "unicode": rand_unicode()}
    for name, t in texts.items():
        with open(os.path.join(HERE, name + ".txt"), "w", encoding="utf-8", newline="") as f:
            f.write(t)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "train.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            f.write(train_text)
        out = os.path.join(HERE, "dtrain.json")
        subprocess.run([DTRAIN, "tokenize", "--train-vocab", "700", corpus, "-o", out], check=True)
        bpe = os.path.join(tmp, "v.bpe")
        subprocess.run([DTRAIN, "tokenize", "--train-vocab", "700", corpus, "-o", bpe], check=True)
        # dtrain's BPE spells "<|endoftext|>" out byte by byte; the tokenizer.json makes it its special
        # id. Without it in the text, both give the same ids.
        lib = Tokenizer.from_file(out)
        for name, t in texts.items():
            plain = t.replace("<|endoftext|>", "")
            src, dst = os.path.join(tmp, name + ".txt"), os.path.join(tmp, name + ".bin")
            with open(src, "w", encoding="utf-8", newline="") as f:
                f.write(plain)
            subprocess.run([DTRAIN, "tokenize", "--vocab", bpe, src, "-o", dst], check=True, capture_output=True)
            dt_ids = np.fromfile(dst, dtype="<u2", offset=1024).tolist()
            assert dt_ids == lib.encode(plain, add_special_tokens=False).ids, "dtrain.json != dtrain's BPE: " + name
    toks = {"gpt2": gpt2(train_text), "llama3": llama3(train_text), "roberta": roberta(train_text)}
    for name, tok in toks.items():
        path = os.path.join(HERE, name + ".json")
        tok.save(path, pretty=True)
        if name == "llama3":  # the legacy merges form: "a b" strings
            import json
            with open(path, encoding="utf-8") as f:
                j = json.load(f)
            j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
            with open(path, "w", encoding="utf-8") as f:
                json.dump(j, f, ensure_ascii=False, indent=2)
    for name in ["gpt2", "llama3", "roberta", "dtrain"]:
        tok = Tokenizer.from_file(os.path.join(HERE, name + ".json"))
        for tname, t in texts.items():
            ids = tok.encode(t, add_special_tokens=False).ids
            write_ids(f"{name}.{tname}.ids", ids)
            if name != "roberta":
                assert tok.decode(ids, skip_special_tokens=False) == t, (name, tname)
            if name == "llama3":
                write_ids(f"{name}.{tname}.sp.ids", tok.encode(t, add_special_tokens=True).ids)
            print(f"{name}.{tname}: {len(ids)} ids, vocab {tok.get_vocab_size()}")


if __name__ == "__main__":
    sys.exit(main())
