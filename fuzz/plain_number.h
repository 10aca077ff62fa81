/* fuzz/plain_number.h — the fuzz targets' independent oracle for "a number
 * written plainly": what dtrain's strict parser (dt_parse_*) must accept. */
#ifndef DT_FUZZ_PLAIN_NUMBER_H
#define DT_FUZZ_PLAIN_NUMBER_H

#include <ctype.h>

/* -?[0-9]+ (the minus only with allow_minus): no spaces, no '+', no hex. */
static int plain_int(const char *s, int allow_minus)
{
    if (allow_minus && *s == '-')
        s++;
    if (!*s)
        return 0;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s))
            return 0;
    return 1;
}

/* A finite decimal real: [+-]? (digits (. digits?)? | . digits) ([eE] [+-]? digits)? */
static int plain_real(const char *s)
{
    if (*s == '+' || *s == '-')
        s++;
    int digits = 0;
    while (isdigit((unsigned char)*s))
        s++, digits++;
    if (*s == '.')
        for (s++; isdigit((unsigned char)*s); s++)
            digits++;
    if (!digits)
        return 0;
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-')
            s++;
        if (!isdigit((unsigned char)*s))
            return 0;
        while (isdigit((unsigned char)*s))
            s++;
    }
    return *s == 0;
}

#endif
