/* src/config/config_impl.h — the config's key table and storage, shared by
 * config_json.c (reading, setting, printing), config_keys.c (the table) and
 * config_map.c (the params structs, the environment). */
#ifndef DT_CONFIG_IMPL_H
#define DT_CONFIG_IMPL_H

#include "dtrain/config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    DT__KT_OBJECT, /* a block: its presence is recorded (value true), its members are keys */
    DT__KT_BOOL,
    DT__KT_INT,    /* a JSON number with an integral value (1e9 is fine) */
    DT__KT_FLOAT,
    DT__KT_STR,    /* with choices: one of them (case-insensitive), stored as spelled in choices */
    DT__KT_PAIR    /* an array of two numbers (betas) */
} dt__kt;

enum {
    DT__KF_AUTO = 1,  /* "auto" accepted: left unset */
    DT__KF_NULL = 2,  /* null accepted: left unset */
    DT__KF_NOOP = 4,  /* accepted without effect in dtrain (the effective configuration marks it) */
    DT__KF_EMPTY = 8, /* DT__KT_STR: "" accepted (a path part that may be empty) */
};

typedef struct dt__cfg_key {
    const char *path;    /* dotted path */
    dt__kt type;
    double lo, hi;       /* numbers (each element of a pair): inclusive range */
    unsigned flags;      /* DT__KF_* */
    const char *choices; /* DT__KT_STR: "a|b|c", NULL = any string */
} dt__cfg_key;

extern const dt__cfg_key dt__cfg_keys[];
extern const size_t dt__cfg_nkeys;

typedef struct dt__cfg_val {
    dt_config_origin origin;
    bool is_auto;        /* "auto" in the file (still unset) */
    bool resolved;       /* filled by dt_config_resolve: the value the consumer uses for an unset key */
    char source[64];     /* "file", "--lr", "AIAK_FP16_COMPRESSION" */
    union {
        bool b;
        int64_t i;
        double d;
        char *s;
        double pair[2];
    } v;
} dt__cfg_val;

struct dt_config {
    dt__cfg_val *vals; /* dt__cfg_nkeys entries */
    char **warn;
    size_t nwarn;
};

/* Index of path in the table, -1 if unknown. */
int dt__cfg_find(const char *path);
/* The value of a set key (NULL when unset or unknown). */
const dt__cfg_val *dt__cfg_get(const dt_config *c, const char *path);
/* Append a warning (printf format). Out of memory drops it. */
void dt__cfg_warn(dt_config *c, const char *fmt, ...) DT_PRINTF(2, 3);
/* A value-level support check for key k (config_map.c): DT_OK, or
 * DT_ERR_UNSUPPORTED "key X: not supported yet (why)" for a value dtrain
 * cannot honour. */
dt_status dt__cfg_check_support(dt_config *c, int k, const dt__cfg_val *v);

#endif
