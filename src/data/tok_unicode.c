/* Unicode and UTF-8 helpers of the tokenizer (tok_regex.h): general
 * categories from the generated table (unicode_gc.c), White_Space, word
 * characters, UTF-8 decoding and validation. */
#include "tok_regex.h"

#include <stddef.h>

int dt__unicode_gc(uint32_t cp)
{
    if (cp > 0x10FFFF)
        return DT_GC_Cn;
    size_t lo = 0, hi = dt__unicode_gc_nruns; /* the last run starting at or before cp */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if ((dt__unicode_gc_runs[mid] >> 5) <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return (int)(dt__unicode_gc_runs[lo] & 31);
}

bool dt__unicode_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool dt__unicode_word(uint32_t c)
{
    if (c < 0x80)
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    int g = dt__unicode_gc(c);
    return (g >= DT_GC_Lu && g <= DT_GC_Me) || g == DT_GC_Nd || g == DT_GC_Nl || g == DT_GC_Pc || c == 0x200C ||
           c == 0x200D;
}

uint32_t dt__utf8_next(const unsigned char *s, size_t n, size_t i, size_t *len)
{
    unsigned char c = s[i];
    if (c < 0x80 || i + 1 >= n) {
        *len = 1;
        return c;
    }
    if (c < 0xE0) {
        *len = 2;
        return (uint32_t)(c & 0x1F) << 6 | (s[i + 1] & 0x3F);
    }
    if (c < 0xF0 || i + 3 >= n) {
        *len = 3;
        return i + 2 < n ? (uint32_t)(c & 0x0F) << 12 | (uint32_t)(s[i + 1] & 0x3F) << 6 | (s[i + 2] & 0x3F) : c;
    }
    *len = 4;
    return (uint32_t)(c & 0x07) << 18 | (uint32_t)(s[i + 1] & 0x3F) << 12 | (uint32_t)(s[i + 2] & 0x3F) << 6 |
           (s[i + 3] & 0x3F);
}

bool dt__utf8_valid(const unsigned char *s, size_t n, size_t *bad)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t len;
        uint32_t min;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
            min = 0x80;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            min = 0x800;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            min = 0x10000;
        } else {
            *bad = i;
            return false;
        }
        if (i + len > n) {
            *bad = i;
            return false;
        }
        for (size_t k = 1; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) {
                *bad = i;
                return false;
            }
        size_t l;
        uint32_t cp = dt__utf8_next(s, n, i, &l);
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            *bad = i;
            return false;
        }
        i += len;
    }
    return true;
}
