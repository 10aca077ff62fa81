/* tokenizer.json internals shared by the reader (tok_json.c) and the
 * encoder/decoder (tok_encode.c). */
#ifndef DT_DATA_TOK_IMPL_H
#define DT_DATA_TOK_IMPL_H

#include "bpe_impl.h"
#include "dtrain/tokenizer.h"
#include "tok_norm.h"
#include "tok_regex.h"

#define TOK_NONE UINT32_MAX

/* A string -> uint32 map over strings kept in a pool (open addressing;
 * the pool only grows, entries refer to it by offset). */
typedef struct tok_strmap {
    uint32_t *off, *len, *val; /* (cap); len UINT32_MAX = free slot */
    size_t cap, n;
} tok_strmap;

typedef struct tok_pool {
    char *p;
    size_t n, cap;
} tok_pool;

/* Added tokens (tokenizer.json "added_tokens"). */
typedef struct tok_added {
    uint32_t id;
    uint32_t off, len; /* content in the pool */
    bool special, single_word, lstrip, rstrip, normalized;
} tok_added;

/* A set of added tokens to find in text: per first byte, token indices by
 * length, longest first. */
typedef struct tok_addset {
    uint32_t *idx;        /* (n) indices into added[] */
    uint32_t start[257];  /* idx[start[b], start[b+1]) begin with byte b */
    uint32_t n;
} tok_addset;

enum { PT_BYTELEVEL, PT_SPLIT, PT_METASPACE };
enum { MS_ALWAYS, MS_FIRST, MS_NEVER }; /* Metaspace's prepend_scheme */
enum { SB_REMOVED, SB_ISOLATED, SB_MERGED_PREV, SB_MERGED_NEXT, SB_CONTIGUOUS };

typedef struct tok_pretok {
    int kind;
    bool add_prefix_space; /* ByteLevel */
    dt__re *re;            /* ByteLevel with use_regex, or Split with a Regex pattern */
    char *literal;         /* Split with a String pattern (NULL for a Regex) */
    size_t literal_len;
    int behavior;          /* Split */
    bool invert;           /* Split */
    int prepend;           /* Metaspace: MS_ALWAYS, MS_FIRST (only a piece at the text's start), MS_NEVER; its
                              replacement is literal, and with split the pieces are cut before each one
                              (behavior SB_MERGED_NEXT) */
    bool split;            /* Metaspace */
} tok_pretok;

#define TOK_MAX_PRETOK 8
#define TOK_MAX_NORM 8
#define TOK_MAX_DEC 8

/* Decoder steps (tokenizers' decoders/): each maps the list of token
 * strings to another. */
enum { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE };

typedef struct tok_dec {
    int kind;
    char *from, *to;  /* Replace: a String pattern and its replacement */
    size_t from_len, to_len;
    uint32_t strip_cp; /* Strip: the character, how many from the start and the end; Metaspace: the replacement */
    int strip_start, strip_stop;
    bool ms_first;     /* Metaspace: its prepend_scheme is not "never" (the first token's replacements dropped) */
} tok_dec;

struct dt_tokenizer {
    tok_pool pool;
    /* the BPE model */
    tok_strmap vocab;       /* token -> id */
    uint32_t *id_off, *id_len; /* (nid) the token of each id; id_len TOK_NONE: no token */
    uint32_t nid;           /* largest id (model or added) + 1 */
    uint32_t model_vocab_len; /* entries in "vocab" (the library's model vocab size) */
    dt__pairmap merges;     /* (left id, right id) -> rank */
    uint32_t *merge_new;    /* (nmerges) rank -> the id it makes */
    uint32_t nmerges;
    char *prefix, *suffix;  /* continuing_subword_prefix, end_of_word_suffix (NULL: none) */
    uint32_t unk;           /* TOK_NONE: no unk_token */
    bool fuse_unk, byte_fallback, ignore_merges;
    /* added tokens */
    tok_added *added;
    uint32_t nadded;
    tok_strmap added_map;   /* content -> index into added */
    uint32_t *added_by_id;  /* (nid) index into added, TOK_NONE if the id is not an added token */
    tok_addset raw_set, norm_set;
    /* pipeline */
    tok_pretok pretok[TOK_MAX_PRETOK];
    int npretok;
    tok_norm norm[TOK_MAX_NORM]; /* the normalizer: steps in order */
    int nnorm;
    bool byte_decoder;      /* decoder ByteLevel alone (else none: tokens joined by ' ', or dec below) */
    tok_dec dec[TOK_MAX_DEC]; /* a decoder with other steps (Llama-2 style: Replace, ByteFallback, Fuse, Strip) */
    int ndec;
    uint32_t *pre_ids, *post_ids; /* add_special: ids before and after the sequence */
    uint32_t npre, npost;
    /* the bos_token and eos_token a tokenizer_config.json beside the file names (transformers' tokenizer.bos_token
       and .eos_token; has_cfg_* false: none named) */
    uint32_t cfg_bos, cfg_eos;
    bool has_cfg_bos, has_cfg_eos;
    /* the chat template (tokenizer_config.json's "chat_template", or a chat_template.jinja beside, which wins, as
       transformers reads them; NULL: none), where it came from (for messages), and the config's pad_token */
    char *chat_template, *chat_template_src, *cfg_pad;
};

/* The text of token id as the tokenizer's files write it: an added
 * token's content, else its vocab entry (byte-level characters, "Ġthe").
 * malloc'd; NULL when the id has no token (or out of memory). */
char *dt__tok_text_of(const dt_tokenizer *t, uint32_t id);

/* Chat templates (tok_chat.c). The template of a tokenizer_config.json's
 * parsed root (name: the file, for messages): *tmpl malloc'd, NULL when
 * it has none. */
struct cJSON;
dt_status dt__tok_config_chat(const struct cJSON *root, const char *name, char **tmpl);
/* Render t's chat template over messages (a JSON array of message
 * objects) with tools (NULL: none) and the further variables of object
 * kwargs (NULL: none), ending as end says (dt_tokenizer_render_chat), as
 * transformers' apply_chat_template(tokenize=False): *text malloc'd. where
 * names the
 * conversation in messages. With spans, the [start, end) byte ranges of
 * the text its {% generation %} blocks wrote too (*spans malloc'd, pairs;
 * dt__chat_render_spans). DT_ERR_INVALID_ARG when t has no template, a
 * message is not an object with a string "role", or rendering fails. */
dt_status dt__tok_render_chat(const dt_tokenizer *t, const struct cJSON *messages, dt_chat_end end,
                              const struct cJSON *tools, const struct cJSON *kwargs, const char *where, char **text,
                              size_t *len, size_t **spans, size_t *nspans);

/* Pool and map helpers (tok_json.c). */
dt_status dt__tok_pool_add(tok_pool *p, const char *s, size_t n, uint32_t *off);
uint32_t dt__tok_strmap_get(const tok_strmap *m, const tok_pool *p, const char *s, size_t n);
/* Insert (off,len) -> val; when the string is there already, its value is
 * kept and *had set (if had is non-NULL). */
dt_status dt__tok_strmap_put(tok_strmap *m, const tok_pool *p, uint32_t off, uint32_t len, uint32_t val, bool *had);
void dt__tok_strmap_free(tok_strmap *m);

/* The normalizer and the decoder of tokenizer.json `name` (tok_json_norm.c):
 * root's "normalizer" into t->norm, its "decoder" into t->byte_decoder /
 * t->dec. Errors name the file and the key. */
dt_status dt__tok_read_normalizer(dt_tokenizer *t, const char *name, const void *root);
dt_status dt__tok_read_decoder(dt_tokenizer *t, const char *name, const void *root);
/* Decode with t->dec: the tokens toks[0, n) (pointers and lengths) through
 * the steps, into *text (malloc'd, NUL-terminated) and *len. */
dt_status dt__tok_decode_chain(const dt_tokenizer *t, const unsigned char **toks, const size_t *lens, size_t n,
                               char **text, size_t *len);

/* GPT-2's byte characters (bytes_to_unicode): byte b is the code point
 * dt__tok_byte_char(b); dt__tok_char_byte(cp) is its inverse (-1 when cp
 * is not one of them). */
uint32_t dt__tok_byte_char(unsigned char b);
int dt__tok_char_byte(uint32_t cp);
/* Write code point cp as UTF-8 to out (room for 4): its length. */
size_t dt__utf8_put(uint32_t cp, unsigned char *out);

/* GPT-2's pre-tokenizer regex (ByteLevel use_regex). */
extern const char dt__tok_gpt2_pattern[];

#endif
