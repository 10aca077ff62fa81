/* The strict number parser (dt_parse_*, dt_env_*) and message escaping
 * (dt_escape, and dt_error escaping what it stores). */
#include "dtrain/dtrain.h"
#include "test.h"

#include <stdint.h>

TEST(parse_int_accepts)
{
    int64_t v = 0;
    ASSERT_OK(dt_parse_int("x", "0", -5, 5, &v));
    ASSERT_EQ_INT(v, 0);
    ASSERT_OK(dt_parse_int("x", "-5", -5, 5, &v));
    ASSERT_EQ_INT(v, -5);
    ASSERT_OK(dt_parse_int("x", "9223372036854775807", INT64_MIN, INT64_MAX, &v));
    ASSERT(v == INT64_MAX);
    ASSERT_OK(dt_parse_int("x", "-9223372036854775808", INT64_MIN, INT64_MAX, &v));
    ASSERT(v == INT64_MIN);
    ASSERT_OK(dt_parse_int("x", "007", 0, 10, &v));
    ASSERT_EQ_INT(v, 7);
}

TEST(parse_int_rejects)
{
    static const char *bad[] = {"", " 1", "1 ", "+1", "1x", "0x10", "abc", "-", "--1", "1.0",
                                "1e3", "\t2", "2\n", "nan"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t v = 42;
        ASSERT_STATUS(dt_parse_int("WORLD_SIZE", bad[i], INT64_MIN, INT64_MAX, &v),
                      DT_ERR_INVALID_ARG);
        ASSERT_EQ_INT(v, 42); /* untouched */
        ASSERT_STR_CONTAINS(dt_last_error(), "WORLD_SIZE");
    }
    ASSERT_STATUS(dt_parse_int("x", NULL, 0, 1, NULL), DT_ERR_INVALID_ARG);
    /* Overflow of int64 and of the range: never a wrap or a truncation. */
    ASSERT_STATUS(dt_parse_int("x", "9223372036854775808", INT64_MIN, INT64_MAX, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_parse_int("x", "-9223372036854775809", INT64_MIN, INT64_MAX, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_parse_int("x", "99999999999999999999999", 0, 10, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_parse_int("WORLD_SIZE", "4294967298", 1, INT32_MAX, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "WORLD_SIZE: 4294967298 is out of range [1, 2147483647]");
    ASSERT_STATUS(dt_parse_int("x", "6", -5, 5, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_parse_int("x", "-6", -5, 5, NULL), DT_ERR_INVALID_ARG);
}

TEST(parse_uint)
{
    uint64_t v = 0;
    ASSERT_OK(dt_parse_uint("--seed", "18446744073709551615", 0, UINT64_MAX, &v));
    ASSERT(v == UINT64_MAX);
    ASSERT_OK(dt_parse_uint("--seed", "3", 0, UINT64_MAX, &v));
    ASSERT_EQ_U64(v, 3);
    /* " -1" and "-1" used to wrap to 2^64-1. */
    ASSERT_STATUS(dt_parse_uint("--seed", " -1", 0, UINT64_MAX, &v), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "--seed: ' -1' is not a non-negative integer");
    ASSERT_STATUS(dt_parse_uint("--seed", "-1", 0, UINT64_MAX, &v), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_parse_uint("--seed", " 1", 0, UINT64_MAX, &v), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_parse_uint("--seed", "18446744073709551616", 0, UINT64_MAX, &v), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_parse_uint("x", "5", 6, 9, &v), DT_ERR_INVALID_ARG);
    ASSERT_EQ_U64(v, 3);
}

TEST(parse_double)
{
    double v = 0;
    ASSERT_OK(dt_parse_double("t", "8", 0, 1e9, &v));
    ASSERT_NEAR(v, 8, 0, 0);
    ASSERT_OK(dt_parse_double("t", "0.5", 0, 1e9, &v));
    ASSERT_NEAR(v, 0.5, 0, 0);
    ASSERT_OK(dt_parse_double("t", ".25", 0, 1e9, &v));
    ASSERT_NEAR(v, 0.25, 0, 0);
    ASSERT_OK(dt_parse_double("t", "+1e-3", 0, 1e9, &v));
    ASSERT_NEAR(v, 1e-3, 0, 1e-15);
    ASSERT_OK(dt_parse_double("t", "-2.", -3, 0, &v));
    ASSERT_NEAR(v, -2, 0, 0);
    static const char *bad[] = {"nan", "NAN", "inf", "-inf", "infinity", " 1", "1 ", "0x1p3",
                                "1e", "e5", ".", "", "1..2", "1,5", "1e+"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ASSERT_STATUS(dt_parse_double("DT_COMM_TIMEOUT", bad[i], -1e300, 1e300, &v),
                      DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_parse_double("t", "1e999", -1e300, 1e300, &v), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_parse_double("t", "-1", 0, 1, &v), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "t: -1 is out of range [0, 1]");
}

TEST(env)
{
    int64_t i = 0;
    double d = 0;
    unsetenv("DT_TEST_PARSE_V");
    ASSERT_OK(dt_env_int("DT_TEST_PARSE_V", 7, 0, 1, &i));
    ASSERT_EQ_INT(i, 7); /* default, not range-checked */
    setenv("DT_TEST_PARSE_V", "", 1);
    ASSERT_OK(dt_env_double("DT_TEST_PARSE_V", 2.5, 0, 1, &d));
    ASSERT_NEAR(d, 2.5, 0, 0);
    setenv("DT_TEST_PARSE_V", "abc", 1);
    ASSERT_STATUS(dt_env_int("DT_TEST_PARSE_V", 7, 0, 1, &i), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "environment variable DT_TEST_PARSE_V: 'abc'");
    setenv("DT_TEST_PARSE_V", "nan", 1);
    ASSERT_STATUS(dt_env_double("DT_TEST_PARSE_V", 1, 0, 1e9, &d), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "DT_TEST_PARSE_V");
    unsetenv("DT_TEST_PARSE_V");
}

TEST(shape_str)
{
    char b[32];
    ASSERT_STR_EQ(dt_shape_str(3, (int64_t[]){2, 3, 4}, b, sizeof b), "[2,3,4]");
    ASSERT_STR_EQ(dt_shape_str(0, NULL, b, sizeof b), "[]");
    ASSERT_STR_EQ(dt_shape_str(2, (int64_t[]){-1, 50257}, b, sizeof b), "[-1,50257]");
    ASSERT_STR_EQ(dt_shape_str(3, (int64_t[]){123, 456, 789}, b, 6), "[123,"); /* cut, still terminated */
    ASSERT(dt_shape_str(1, (int64_t[]){1}, NULL, 4) == NULL);
}

TEST(escape)
{
    char buf[64];
    ASSERT_STR_EQ(dt_escape("a/b c", buf, sizeof buf), "a/b c");
    ASSERT_STR_EQ(dt_escape("x\033[2Jy\n\t\r\x7f", buf, sizeof buf), "x\\x1b[2Jy\\n\\t\\r\\x7f");
    ASSERT_STR_EQ(dt_escape("caf\xc3\xa9", buf, sizeof buf), "caf\xc3\xa9"); /* UTF-8 kept */
    char small[8];
    ASSERT_STR_EQ(dt_escape("\033\033\033\033", small, sizeof small), "\\x1b...");
    ASSERT_STR_EQ(dt_escape("abcdefghij", small, sizeof small), "abcd...");
    ASSERT_STR_EQ(dt_escape("abcdefg", small, sizeof small), "abcdefg");
    /* Every stored message is escaped: a path cannot forge a second line. */
    dt_error(DT_ERR_IO, "%s: cannot open", "evil\nFAKE LINE\033[31m");
    ASSERT_STR_EQ(dt_last_error(), "evil\\nFAKE LINE\\x1b[31m: cannot open");
    dt_error_wrap(DT_ERR_IO, "file '%s'", "a\rb");
    ASSERT_STR_EQ(dt_last_error(), "file 'a\\rb': evil\\nFAKE LINE\\x1b[31m: cannot open");
}

int main(void)
{
    RUN(parse_int_accepts);
    RUN(parse_int_rejects);
    RUN(parse_uint);
    RUN(parse_double);
    RUN(env);
    RUN(shape_str);
    RUN(escape);
    return TEST_REPORT();
}
