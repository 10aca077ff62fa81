/* dtrain/tokenizer.h — Hugging Face tokenizer.json files with a byte-level
 * BPE model (GPT-2, RoBERTa, Llama-3, Qwen2 and dtrain's own vocabularies).
 *
 * Overview
 * --------
 * dt_tokenizer reads a tokenizer.json and encodes text to ids and ids back
 * to text as the `tokenizers` library does (Tokenizer.encode(text,
 * add_special_tokens).ids and Tokenizer.decode): the same ids for the same
 * text, id for id.
 *
 * The pipeline, in the library's order:
 *   1. added tokens: the tokens of "added_tokens" with normalized = false
 *      are found in the raw text (leftmost, then longest), then those with
 *      normalized = true in the pieces between them (single_word, lstrip
 *      and rstrip as the library has them). A found token is its id and
 *      never reaches the steps below.
 *   2. the normalizer, on each piece between the raw added tokens: NFC,
 *      NFD, NFKC, NFKD (Qwen2's NFC), Lowercase (Rust's per-character
 *      to_lowercase), Prepend, Replace (String or Regex pattern), Strip
 *      and Sequence of them (Llama-2's Prepend "\u2581" + Replace " " ->
 *      "\u2581"), with the library's Unicode tables.
 *   3. the pre-tokenizer: ByteLevel (its GPT-2 regex when use_regex,
 *      add_prefix_space on every piece that does not start with a space,
 *      then every UTF-8 byte becomes one of GPT-2's 256 byte characters),
 *      Split (a Regex or String pattern, any behavior, invert), Metaspace
 *      (SentencePiece's: every space the replacement "\u2581", one put
 *      before a piece as prepend_scheme says: always, first (only before
 *      the piece that starts the text, none after an added token) or
 *      never; with split, cut before each replacement; Mistral v0.3) and
 *      Sequence of them. Regex patterns run on a built-in engine with Oniguruma's
 *      semantics for what tokenizer files use (Unicode general categories
 *      \p{L} \p{N} ..., \s, lookahead, (?i:...), counted repeats); a
 *      pattern with anything else is refused when the file is read.
 *   4. the BPE model on each piece: characters looked up in "vocab", then
 *      merges applied lowest rank first, leftmost among equals;
 *      continuing_subword_prefix, end_of_word_suffix, unk_token, fuse_unk,
 *      byte_fallback and ignore_merges as the library has them. "merges"
 *      may be ["a b", ...] (the legacy form) or [["a", "b"], ...].
 *   5. with add_special: the post-processor's tokens for one sequence
 *      (TemplateProcessing "single", RobertaProcessing/BertProcessing
 *      cls/sep, ByteLevel adds none, Sequence of them).
 * Decoding maps ids to their tokens (added tokens first), drops special
 * tokens when asked, and applies the decoder: ByteLevel (characters back to
 * bytes), none (tokens joined by spaces), or a Sequence of Replace (String
 * pattern), ByteFallback (<0xXX> tokens to their bytes), Fuse, Strip
 * (Llama-2's) and Metaspace (the replacement back to spaces, those of the
 * first token dropped unless prepend_scheme is never). It returns the
 * bytes exactly;
 * the library then replaces invalid UTF-8 by U+FFFD (only arbitrary id runs
 * produce it: decode(encode(s)) == s for every valid s without
 * add_prefix_space).
 *
 * Not read (an error naming the key when present and not null): other
 * models (WordPiece, Unigram, WordLevel), other normalizers (Precompiled,
 * BertNormalizer, StripAccents, ...), pre-tokenizers (Whitespace,
 * BertPreTokenizer, ...) and decoders, BPE dropout above 0 (random). "truncation" and "padding"
 * are ignored: they shape batches of model inputs, not a corpus.
 *
 * Text must be valid UTF-8 (what Python's str holds): anything else is
 * DT_ERR_INVALID_ARG naming the byte offset.
 *
 * Lifecycle: dt_tokenizer_load / _load_mem create, dt_tokenizer_free
 * releases (NULL is a no-op). A loaded tokenizer is immutable: any number
 * of threads may encode and decode with it at once.
 *
 * Usage
 * -----
 *     dt_tokenizer *tok;
 *     if (dt_tokenizer_load("llama3/tokenizer.json", &tok) < 0) { ... dt_last_error() ... }
 *     uint32_t *ids; int64_t n;
 *     dt_tokenizer_encode(tok, "Hello world", 11, false, &ids, &n);
 *     char *text; size_t len;
 *     dt_tokenizer_decode(tok, ids, n, false, &text, &len);
 *     free(ids); free(text); dt_tokenizer_free(tok);
 */
#ifndef DTRAIN_TOKENIZER_H
#define DTRAIN_TOKENIZER_H

#include "dtrain/base.h"
#include "dtrain/data.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_tokenizer dt_tokenizer;

#define DT_TOKENIZER_MAX_FILE ((size_t)256 << 20) /* larger tokenizer.json files are refused */

/* Read path: a tokenizer.json, or a directory holding one (a Hugging Face
 * model directory), and the bos_token and eos_token of a
 * tokenizer_config.json beside it when there is one (a string, or an
 * AddedToken object's "content"; transformers' tokenizer.bos_token and
 * .eos_token: a name that is no token of the tokenizer is DT_ERR_FORMAT
 * naming the key). Errors name the file and, for content, the key:
 * DT_ERR_IO (missing, unreadable, too large), DT_ERR_FORMAT (not JSON, a
 * key of the wrong type, "version" not "1.0", a merge naming a token not
 * in the vocab, ...), DT_ERR_UNSUPPORTED (model.type other than BPE, an
 * unsupported normalizer, pre-tokenizer, decoder or regex construct). */
DT_API dt_status dt_tokenizer_load(const char *path, dt_tokenizer **out);
/* Take the bos_token and eos_token of a tokenizer_config.json's text
 * json[0, n) (name: the file, for messages), as dt_tokenizer_load takes the
 * file beside a tokenizer.json: for a tokenizer read from memory
 * (dt_tokenizer_load_mem) that came with one. All or nothing: an error
 * (not a JSON object, a key that is no token's text, a token the tokenizer
 * lacks) changes nothing. */
DT_API dt_status dt_tokenizer_apply_config(dt_tokenizer *t, const char *json, size_t n, const char *name);
/* Apply the files beside the tokenizer.json at path as dt_tokenizer_load
 * does: a tokenizer_config.json's bos/eos tokens and chat template
 * (dt_tokenizer_apply_config), then a chat_template.jinja, which replaces
 * the config's template; missing files change nothing. For a tokenizer
 * read from memory (dt_tokenizer_load_mem) whose bytes came from path. */
DT_API dt_status dt_tokenizer_apply_beside(dt_tokenizer *t, const char *path);
/* The same from JSON text held in memory; name is used in messages (NULL:
 * "<memory>"). */
DT_API dt_status dt_tokenizer_load_mem(const void *json, size_t n, const char *name, dt_tokenizer **out);
DT_API void dt_tokenizer_free(dt_tokenizer *t);

/* The number of ids: the largest id of the vocab and added tokens + 1
 * (transformers' len(tokenizer)); a model's embedding needs at least this
 * many rows. 0 for NULL. */
DT_API int64_t dt_tokenizer_vocab_size(const dt_tokenizer *t);

/* The id of token string s (an added token's content, or a vocab entry as
 * written in the file: byte-level characters, "Ġthe"). DT_ERR_NOT_FOUND
 * naming s otherwise. */
DT_API dt_status dt_tokenizer_token_id(const dt_tokenizer *t, const char *s, uint32_t *id);

/* The token that ends a document, for corpora made of several:
 * transformers' tokenizer.eos_token, the eos_token of the
 * tokenizer_config.json beside the file (Llama-3 Instruct's <|eot_id|>,
 * the token TRL ends a completion with), else the first special added
 * token among "<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>",
 * "<|im_end|>" (in that order), as GPT-2, Llama-3, Llama-2/Mistral, Gemma
 * and Qwen name it. DT_ERR_NOT_FOUND when none is there. */
DT_API dt_status dt_tokenizer_eos(const dt_tokenizer *t, uint32_t *id);

/* Encode text[0, n) (valid UTF-8): *ids malloc'd (free() it; NULL when
 * *n_ids is 0). add_special adds the post-processor's special tokens (the
 * library's add_special_tokens=True). Errors: DT_ERR_INVALID_ARG (invalid
 * UTF-8, naming the offset), DT_ERR_NO_MEMORY. */
DT_API dt_status dt_tokenizer_encode(const dt_tokenizer *t, const void *text, size_t n, bool add_special,
                                     uint32_t **ids, int64_t *n_ids);

/* Decode ids[0, n): *text malloc'd and NUL-terminated (*len excludes the
 * NUL); the caller frees it. skip_special drops special added tokens.
 * DT_ERR_RANGE naming the position of an id with no token. */
DT_API dt_status dt_tokenizer_decode(const dt_tokenizer *t, const uint32_t *ids, int64_t n, bool skip_special,
                                     char **text, size_t *len);

/* Chat templates. An instruct model's tokenizer carries its conversation
 * format as Jinja text: tokenizer_config.json's "chat_template" (a
 * string, or a list of {"name", "template"} of which "default" is used),
 * or a chat_template.jinja beside the tokenizer.json, which wins;
 * dt_tokenizer_load reads both, as transformers does. The template of t,
 * NULL when it has none. Borrowed: valid until t is freed or given another. */
DT_API const char *dt_tokenizer_chat_template(const dt_tokenizer *t);
/* Give t the template tmpl[0, n) (NULL, 0: none); name says where it came
 * from in messages (NULL: "<memory>"). DT_ERR_FORMAT for a NUL byte or
 * more than 1 MiB. */
DT_API dt_status dt_tokenizer_set_chat_template(dt_tokenizer *t, const char *tmpl, size_t n, const char *name);
/* How a rendered conversation ends (dt_tokenizer_render_chat's end;
 * false and true are the first two, apply_chat_template's
 * add_generation_prompt). */
typedef enum dt_chat_end {
    DT_CHAT_CLOSED = 0,            /* as the template ends its last message */
    DT_CHAT_GENERATION_PROMPT = 1, /* the template's generation prompt after it */
    DT_CHAT_CONTINUE = 2,          /* the final message left open, to be continued */
} dt_chat_end;

/* Render t's chat template over conversation[0, n), a JSON list of
 * messages ({"role": "user", "content": "..."}, ...), as transformers'
 * tokenizer.apply_chat_template(messages, tokenize=False, ...) of
 * transformers 5 does, byte for byte: the template sees messages (each
 * without its keys whose value is null, an assistant's
 * "reasoning_content"/"thinking"/"reasoning" under the first two names
 * too), add_generation_prompt (end == DT_CHAT_GENERATION_PROMPT), tools
 * and documents (null when not given), bos_token, eos_token, unk_token and
 * pad_token (those the tokenizer_config.json names), and the keys of the
 * JSON object kwargs[0, kn) (NULL, 0: none; "tools", "documents",
 * "enable_thinking", ...: apply_chat_template's keyword arguments). The
 * Jinja subset is what chat templates use: if/for/set/macro, loop
 * variables, namespace(), filters (tojson, trim, length, ...), tests,
 * string and dict methods, raise_exception(); it renders as jinja2's
 * sandbox with trim_blocks and lstrip_blocks.
 * DT_CHAT_CONTINUE is apply_chat_template(continue_final_message=True),
 * what a transformers pipeline does when the conversation ends with an
 * assistant's message: the text stops where the final message's content
 * does (a list of parts: its last part with a "text"), without what the
 * template writes after it (a mark is rendered at the content's end and
 * the text cut there; whitespace the template strips from the content's
 * end is left out too).
 * *text malloc'd (free() it), NUL-ended, *len without the NUL. Encode the
 * text with add_special false: the template holds its special tokens
 * (apply_chat_template(tokenize=True)).
 * Errors: DT_ERR_INVALID_ARG (t has no template, an empty conversation, a
 * message without a string "role", the template's raise_exception, naming
 * its message, or a failure while rendering; with DT_CHAT_CONTINUE a final
 * message without text content to continue, a template that never names
 * "content" or does not write the content), DT_ERR_FORMAT (not JSON, a
 * template that does not parse, naming its line), DT_ERR_UNSUPPORTED (a
 * Jinja construct outside the subset, named), DT_ERR_RANGE (a limit
 * passed: 256 MiB of output, 10 million loop iterations, 100 nested macro
 * calls, ...). */
DT_API dt_status dt_tokenizer_render_chat(const dt_tokenizer *t, const char *conversation, size_t n,
                                          dt_chat_end end, const char *kwargs, size_t kn, char **text, size_t *len);

/* The two files transformers reads beside a tokenizer.json in a model
 * directory, as JSON text (each malloc'd; free() them):
 * tokenizer_config.json (added_tokens_decoder with every added token by id,
 * chat_template when t has one, bos_token, eos_token (unk_token when the
 * model has one: the tokenizer_config.json's the tokenizer was read with,
 * else the first
 * special added token among "<|begin_of_text|>", "<s>", "<bos>",
 * "<|endoftext|>" is the bos, dt_tokenizer_eos the eos; null when absent),
 * clean_up_tokenization_spaces false, model_max_length when > 0,
 * tokenizer_class "PreTrainedTokenizerFast") and special_tokens_map.json
 * (the bos/eos/unk tokens there are). With them and the tokenizer.json,
 * AutoTokenizer.from_pretrained(DIR) loads the tokenizer. dt_hf_save
 * (models.h) writes all three. */
DT_API dt_status dt_tokenizer_hf_files(const dt_tokenizer *t, int64_t model_max_length, char **config_json,
                                       char **special_map_json);

/* Text corpora as language-model data: spec is "text:FILE[,FILE...]" (each
 * file one document) or "jsonl:FILE[,FILE...][,field=NAME]" (each non-blank
 * line one JSON object, its string NAME (default "text") one document;
 * file names cannot hold commas). Every document is encoded with t (no
 * special tokens added) and followed by the end-of-document token
 * (dt_tokenizer_eos; Megatron's append-eod), all at open, and the ids are
 * kept in memory. "parquet:FILE[,FILE...]" with the same keys as jsonl:
 * takes Apache Parquet files (Hugging Face datasets' files) as JSON lines:
 * each row an object whose keys are the columns (only those the rows use
 * are read: the document's, or prompt and completion, "messages",
 * "tools", "chat_template_kwargs"); strings, integers, booleans, floats,
 * lists and structs are read (list<struct<role, content>> is a list of
 * messages), SNAPPY, GZIP, ZSTD or uncompressed; errors name the row
 * ("parquet FILE: row group G, row R", R from 0). What jsonl: lines are
 * and do below, parquet: rows are and do alike.
 * "jsonl:FILE[,FILE...],prompt=KEY,completion=KEY"
 * (TRL's prompt-completion format): each line is its string KEYs' prompt
 * and completion, encoded each on its own, then the end-of-document token
 * (an empty completion is that token alone; an empty prompt is allowed).
 * With p->completion_only_loss the targets that are prompt tokens are
 * DT_K_IGNORE_INDEX (-100) in y, the completion and end-of-document
 * targets their ids (without prompt=/completion= the keys are then
 * "prompt" and "completion"; text: and field= data are refused:
 * DT_ERR_INVALID_ARG). Conversations (TRL's conversational formats): a
 * line whose document key holds a list of messages, or that has no "text"
 * (field= not given) but a "messages" list, is that conversation rendered
 * by t's chat template (dt_tokenizer_render_chat, with the line's "tools"
 * and "chat_template_kwargs") and encoded, with nothing added after it
 * (the template ends its turns, as TRL's SFTTrainer leaves it); with
 * prompt and completion both lists, the prompt is rendered with the
 * generation prompt and the completion is what rendering the whole
 * conversation adds after it (DT_ERR_INVALID_ARG when the prompt's text is
 * not the start of the whole's). Items are windows of seq_len + 1 tokens as in
 * dt_dataset_tokens_open (p: seq_len, stride; vocab_size 0 = the
 * tokenizer's, else every id must be below it). t is only used while
 * opening. Errors name the spec, the file (and line for jsonl, row for parquet):
 * DT_ERR_INVALID_ARG (bad spec), DT_ERR_IO, DT_ERR_FORMAT (bad JSON, a
 * line that is not an object, a key missing or not a string, an id >=
 * vocab_size, text that is not UTF-8, a corrupt Parquet file),
 * DT_ERR_UNSUPPORTED (a Parquet column or codec that is not read, named),
 * DT_ERR_NOT_FOUND
 * (the tokenizer has no end-of-document token). */
DT_API dt_status dt_dataset_text_open(const char *spec, const dt_tokenizer *t, const dt_tokens_params *p,
                                      dt_dataset **out);

/* Write bpe (data.h) as a tokenizer.json that the `tokenizers` library and
 * transformers' PreTrainedTokenizerFast load and that encodes every text
 * exactly as dt_bpe_encode does: vocab ids 0..255 are the bytes (as GPT-2's
 * byte characters), merge k is id 256 + k, a Split pre-tokenizer whose
 * regex is dt_bpe's chunker, ByteLevel without its own regex, and eos (for
 * example "<|endoftext|>"; NULL: none) a special added token with id
 * dt_bpe_vocab_size(bpe). Atomic, no symlink followed. Errors:
 * DT_ERR_UNSUPPORTED when two ids have the same bytes (a JSON vocab maps
 * each string to one id), DT_ERR_IO naming path. */
DT_API dt_status dt_bpe_save_tokenizer_json(const dt_bpe *bpe, const char *eos, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_TOKENIZER_H */
