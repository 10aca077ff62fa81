"""Writes the golden files of the tokenizer.json normalizers and the
Llama-2 (SentencePiece-style) decoder that tests/data/test_tokenizer_json.c
reads (reference only, never a build or test dependency; the small files
are committed). Needs a Python with `tokenizers` (and numpy):

    $PEER_PYTHON tests/data/gen_normalizer_golden.py [NAME...]

Into tests/data/tokenizer/ (bible.txt and unicode.txt are
gen_tokenizer_golden.py's):
  qwen2.json   Qwen2 style: NFC normalizer, Split(Qwen2's regex, Isolated),
               ByteLevel(use_regex=False), vocab 1000 trained on bible.txt
  nfkc.json    Sequence[NFKC, Lowercase, Strip(both)], ByteLevel pre-tokenizer
  nfd.json     Sequence[NFD, Replace(Regex \\p{Mn} -> ""), Replace(String "ﬀ" -> "ff")]
               (accents stripped), ByteLevel pre-tokenizer
  llama2.json  Llama-2 style (as transformers' LlamaConverter writes it):
               normalizer Sequence[Prepend "▁", Replace " " -> "▁"], no
               pre-tokenizer, BPE with byte_fallback, fuse_unk and unk <unk>
               (ids 0-2 <unk> <s> </s>, 3-258 <0x00>..<0xFF>), decoder
               Sequence[Replace "▁" -> " ", ByteFallback, Fuse, Strip " " 1 0],
               TemplateProcessing "<s> $A"
  gemma.json   Gemma style (as transformers' GemmaConverter writes Gemma
               1, 2 and 3's): normalizer Replace " " -> "▁" (no Prepend),
               pre-tokenizer Split(" ", MergedWithPrevious), BPE with
               byte_fallback, fuse_unk and unk <unk> (ids 0-3 <pad> <eos>
               <bos> <unk>, 4-259 <0x00>..<0xFF>), added special tokens
               <start_of_turn> and <end_of_turn> (as Gemma's; the texts hold
               none), decoder Sequence[Replace "▁" -> " ", ByteFallback,
               Fuse] (no Strip), TemplateProcessing "<bos> $A"
  mistral3.json  Mistral v0.3 style: no normalizer, pre-tokenizer Metaspace("▁",
               prepend_scheme "first": a piece after an added token gets
               no "▁", split false), BPE with byte_fallback as llama2's
               (ids 0-2 <unk> <s> </s>, 3-258 the bytes), llama2's decoder
  metaspace.json  the same with Metaspace(prepend_scheme "always", split true)
               and the decoder Sequence[ByteFallback, Fuse, Metaspace]
  NAME.TEXT.ids      the library's ids, encode(text, add_special_tokens=False)
  NAME.TEXT.dec      the library's decode of those ids (the normalized text,
                     for llama2 with the byte-fallback runs made of valid UTF-8)
ids files are little-endian uint32."""
import json
import os
import sys

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def read(name):
    with open(os.path.join(HERE, name), encoding="utf-8", newline="") as f:
        return f.read()


def bytelevel_train(tok, text, vocab):
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(text.splitlines(keepends=True), trainer=tr)
    tok.decoder = decoders.ByteLevel()
    return tok


def qwen2(text):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_PATTERN), "isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return bytelevel_train(tok, text, 1000)


def nfkc(text):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(), normalizers.Strip()])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return bytelevel_train(tok, text, 600)


def nfd(text):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Replace(Regex(r"\p{Mn}"), ""),
                                           normalizers.Replace("\ufb00", "ff")])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return bytelevel_train(tok, text, 600)


def sp_bpe(text, dec, norm=None, pre=None):
    """SentencePiece-style BPE (byte_fallback, fuse_unk; ids 0-2 <unk> <s> </s>, then the 256 byte tokens, then the
    learned ones) trained under normalizer norm and pre-tokenizer pre, with decoder dec and TemplateProcessing
    "<s> $A"
    """
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if norm is not None:
        tok.normalizer = norm
    if pre is not None:
        tok.pre_tokenizer = pre
    tr = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=60,
                             show_progress=False)
    tok.train_from_iterator(text.splitlines(), trainer=tr)
    j = json.loads(tok.to_str())
    old = j["model"]["vocab"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for t, _ in sorted(old.items(), key=lambda kv: kv[1]):
        if t not in vocab:
            vocab[t] = len(vocab)
    j["model"]["vocab"] = vocab
    j["added_tokens"] = [{"id": vocab[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for s in ("<unk>", "<s>", "</s>")]
    if pre is None:
        j["pre_tokenizer"] = None
    j["decoder"] = dec
    tok = Tokenizer.from_str(json.dumps(j))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


LLAMA2_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}


def llama2(text):
    return sp_bpe(text, LLAMA2_DECODER,
                  norm=normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]))


def gemma(text):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tr = trainers.BpeTrainer(vocab_size=700, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"], limit_alphabet=60,
                             show_progress=False)
    tok.train_from_iterator(text.splitlines(), trainer=tr)
    j = json.loads(tok.to_str())
    old = j["model"]["vocab"]
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for t, _ in sorted(old.items(), key=lambda kv: kv[1]):
        if t not in vocab:
            vocab[t] = len(vocab)
    specials = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>")
    vocab["<start_of_turn>"], vocab["<end_of_turn>"] = len(vocab), len(vocab) + 1
    j["model"]["vocab"] = vocab
    j["added_tokens"] = [{"id": vocab[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for s in specials]
    j["pre_tokenizer"] = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                          "invert": False}
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}
    tok = Tokenizer.from_str(json.dumps(j))
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    return tok


def mistral3(text):
    return sp_bpe(text, LLAMA2_DECODER,
                  pre=pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False))


def metaspace(text):
    return sp_bpe(text, {"type": "Sequence", "decoders": [
                      {"type": "ByteFallback"}, {"type": "Fuse"},
                      {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}]},
                  pre=pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True))


MAKERS = (("qwen2", qwen2), ("nfkc", nfkc), ("nfd", nfd), ("llama2", llama2), ("gemma", gemma),
          ("mistral3", mistral3), ("metaspace", metaspace))


def main(only):
    train = read("bible.txt")
    texts = {"bible": train, "unicode": read("unicode.txt")}
    for name, make in MAKERS:
        if only and name not in only:
            continue
        tok = make(train)
        tok.save(os.path.join(HERE, name + ".json"))
        tok = Tokenizer.from_file(os.path.join(HERE, name + ".json"))
        for tname, text in texts.items():
            ids = tok.encode(text, add_special_tokens=False).ids
            np.array(ids, dtype="<u4").tofile(os.path.join(HERE, "%s.%s.ids" % (name, tname)))
            dec = tok.decode(ids, skip_special_tokens=False)
            with open(os.path.join(HERE, "%s.%s.dec" % (name, tname)), "wb") as f:
                f.write(dec.encode("utf-8", "surrogatepass"))
            print(name, tname, len(ids), "ids")


if __name__ == "__main__":
    main(sys.argv[1:])  # names of MAKERS to write (default: every one)
